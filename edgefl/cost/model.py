"""The cost model: what a TrainConfig costs a device, from a ModelProfile. No torch.

Peak memory (SLT App. E: weights + gradients + kept activations; FedOLF sec. 3.4 eq. 4 for the
activation share of a frozen prefix; plus what a real process adds):

    peak = runtime_baseline + training_bytes
    training_bytes = weights(frozen + trained) + gradients(trained) + optimizer state
                     + activations kept for the trained layers + workspace
    workspace = workspace_fixed + input batch
                + device + trained_weight_copies * trained weights + frozen_weight_copies * frozen weights
                  (what a device process adds over a bare training loop: its evaluation, the artifact it loads)
                + hidden (kernel scratch, when a layer before the last trains)
                + max(0, workspace_factor * step_peak - activations - gradients)

`Cost.terms` (PeakTerms) states that peak as a function of the runtime constants: what `edgefl calibrate`
and the memory benchmarks fit (edgefl.cost.upper_bound).

`step_peak_bytes` walks the step's timeline (frozen forward, trained forward, backward, optimizer step)
with each layer's forward working set, kept activations and gradients: what is alive at once, which is
more than activations + gradients where a layer's working set dominates (a frozen transformer block's
attention maps) and less where backward frees activations as it makes gradients (clamped: the sum is
kept, an upper bound).

All byte counts are float32 unless the profile says otherwise; FLOPs count conv and matmul work
(multiply-add = 2 FLOPs) per sample: frozen layers forward only, trained layers forward + backward
(backward = 2x forward: weight and input gradients; the first trained module has no input gradient).
Upload = the trained tensors (parameters and their buffers); download = every tensor the device runs.

What the method extensions of a TrainConfig add (edgefl.trainconfig):
* `rank` r (per linear P x Q of a hidden trained layer, `rows` positions per sample; `low_rank_layer`):
  LoRA (Hu et al. 2021, h = W x + B A x with B in R^{P x r}, A in R^{r x Q}; Heterogeneous LoRA as in CAFF
  App. B): W and its bias stay frozen (weights, not gradients), r(P + Q) adapter parameters train, each
  adapter keeps its rank-r intermediate (rows * r values per sample) on top of the activations full
  training keeps (its input is kept either way: CAFF App. A, LoRA does not lower activation memory), and
  the backward pass still runs through W (input gradients) but makes no weight gradient for it. FedHM
  (CAFF App. B: W ~ (U diag(S)) V^T, two linears P x z and z x Q that both train): P Q parameters become
  z(P + Q), the rank-z intermediate is kept, forward FLOPs 2 rows P Q become 2 rows z(P + Q).
* `exits` (DepthFL): one linear exit head per boundary, priced like the auxiliary head at the end.
* `copies` M (m-FeDepth): the trained part (weights, gradients, optimizer state, kept activations, working
  set, forward + backward FLOPs) M times, the frozen prefix once; each copy's KL term to each peer keeps
  its log-probabilities and the peer's probabilities (2 logits-sized tensors); upload is copy 1.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Optional, Sequence

from edgefl.cost.constants import DEFAULTS, RuntimeConstants
from edgefl.cost.profile import AuxProfile, LayerProfile, ModelProfile
from edgefl.cost.profile_store import ProfileStore
from edgefl.trainconfig import OPTIMIZER_STATE_SLOTS, TrainConfig
from edgefl.zoo import ModelRef


@dataclass(frozen=True)
class Cost:
    runtime_baseline_bytes: int
    weights_frozen_bytes: int
    weights_trained_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    workspace_bytes: int
    flops_per_sample: float
    upload_bytes: int
    download_bytes: int
    trained_params: int
    # what the device agent keeps resident beside the training process (edgefl.cost.constants
    # .AGENTS): the promise is for the whole device; 0 for the training process alone
    agent_bytes: int = 0
    terms: Optional["PeakTerms"] = field(default=None, compare=False, repr=False)   # the peak, constants apart

    @property
    def training_bytes(self) -> int:
        return (self.weights_frozen_bytes + self.weights_trained_bytes + self.gradient_bytes
                + self.optimizer_bytes + self.activation_bytes + self.workspace_bytes)

    @property
    def process_peak_bytes(self) -> int:
        """The training process's own peak: what calibration fits and a device's child measures."""
        return self.runtime_baseline_bytes + self.training_bytes

    @property
    def peak_memory_bytes(self) -> int:
        """The whole device's: the training process and the agent beside it."""
        return self.process_peak_bytes + self.agent_bytes

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "terms"}
        return {**d, "training_bytes": self.training_bytes, "peak_memory_bytes": self.peak_memory_bytes}


def low_rank_layer(layer: LayerProfile, mode: str, rank: int) -> tuple[LayerProfile, int, float]:
    """The layer as a device training its linear weights at `rank` runs it (module doc), with its
    parameters counted as the ones that train; plus the parameter bytes it keeps frozen (LoRA's base
    weights and biases) and the forward FLOPs of those frozen weights (they get no weight gradient)."""
    elem = layer.param_bytes // layer.params if layer.params else 4
    full = sum(p * q for p, q, _, _ in layer.linears)
    biases = sum(p for p, _, _, bias in layer.linears if bias)
    low = sum(rank * (p + q) for p, q, _, _ in layer.linears)
    kept = elem * sum(rows * rank for _, _, rows, _ in layer.linears)
    full_flops = sum(2.0 * rows * p * q for p, q, rows, _ in layer.linears)
    low_flops = sum(2.0 * rows * rank * (p + q) for p, q, rows, _ in layer.linears)
    if mode == "lora":
        params = layer.params - full - biases + low
        return (replace(layer, params=params, param_bytes=elem * params, activation_bytes=layer.activation_bytes + kept,
                        forward_flops=layer.forward_flops + low_flops), elem * (full + biases), full_flops)
    if mode == "factor":
        params = layer.params - full + low
        return (replace(layer, params=params, param_bytes=elem * params, activation_bytes=layer.activation_bytes + kept,
                        forward_flops=layer.forward_flops - full_flops + low_flops), 0, 0.0)
    raise ValueError(f"unknown rank_mode {mode!r}")


def low_rank_view(profile: ModelProfile, config: TrainConfig) -> tuple[ModelProfile, list[int], list[float]]:
    """(the profile as the device runs it, per layer frozen parameter bytes inside a trained layer, per layer
    forward FLOPs without weight gradient); the profile itself and zeros without a rank."""
    frozen_bytes, frozen_flops = [0] * profile.num_layers, [0.0] * profile.num_layers
    if config.rank is None:
        return profile, frozen_bytes, frozen_flops
    layers = list(profile.layers)
    for i in config.rank_layers:
        layers[i], frozen_bytes[i], frozen_flops[i] = low_rank_layer(layers[i], config.rank_mode, config.rank)
    return replace(profile, layers=tuple(layers)), frozen_bytes, frozen_flops


def _head_kept(layers, a: int, head: AuxProfile) -> int:
    """Per sample, what a head reading boundary `head.boundary` keeps: its own storages, and its input
    unless the layer before (trained) already keeps its own output."""
    b = head.boundary
    saved_before = b - 1 >= a and layers[b - 1].output_saved_bytes
    return head.activation_bytes + (0 if saved_before else head.input_saved_bytes)


def activation_bytes_per_sample(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile],
                                exits: Sequence[AuxProfile] = ()) -> int:
    """Bytes autograd keeps per sample for the trained layers (and the auxiliary head, and exits)."""
    a, b, layers = config.frozen_prefix, config.end, profile.layers
    total = sum(layers[i].activation_bytes for i in range(a, b))
    last_trained = b - 1 >= a
    if b < len(layers) and last_trained:
        total += layers[b - 1].carried_bytes  # what layer b would have kept is now kept for the head
    if aux is not None:
        total += _head_kept(layers, a, aux)
    return total + sum(_head_kept(layers, a, e) for e in exits)


def activation_bytes(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile],
                     exits: Sequence[AuxProfile] = ()) -> int:
    """Bytes autograd keeps for one batch: per-sample bytes times the batch, plus what the trained layers
    keep once per batch whatever its size (BN's per-channel statistics, the loss's total weight)."""
    fixed = sum(profile.layers[i].activation_fixed_bytes for i in config.trained_layers)
    fixed += sum(h.activation_fixed_bytes for h in ([aux] if aux is not None else []) + list(exits))
    return config.batch_size * activation_bytes_per_sample(profile, config, aux, exits) + fixed


def step_peak_bytes(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile] = None,
                    exits: Sequence[AuxProfile] = (), prefix_batch: int = 0) -> int:
    """Most bytes one training step has allocated at once beyond the weights, the optimizer state and the
    input batch, on a timeline of the step (B = batch size, kept(i) = what trained layer i keeps):

      forward, layer i:     kept(a..i-1) + B * forward_peak(i)   (a frozen layer keeps nothing)
      end of forward:       every kept activation
      backward, layer i:    kept(a..i) + gradients of layers i.. and the aux head
                            + B * (input + output of layer i): the gradients flowing through it
      optimizer step:       every gradient

    Activations and gradients never peak together in full: backward frees a layer's activations as
    it makes its gradients. An exit's kept storages are alive from its boundary on, its gradients from the
    start of backward. With `prefix_batch` P (0: B), a frozen layer runs P samples at a time: its forward
    holds P * forward_peak(i) plus the boundary state of the batch's other samples, (B - P) * output(a-1)."""
    B, a, b, layers = config.batch_size, config.frozen_prefix, config.end, profile.layers
    P = min(prefix_batch or B, B)
    kept = [B * l.activation_bytes + l.activation_fixed_bytes for l in layers[:b]]
    for e in exits:
        kept[e.boundary - 1] += B * _head_kept(layers, a, e) + e.activation_fixed_bytes
    ins = [profile.input_bytes] + [l.output_bytes for l in layers[: b - 1]]
    peak = activation_bytes(profile, config, aux, exits)
    alive = 0
    for i in range(b):
        if i < a:   # one prefix chunk's working set, the boundary state of the batch's other samples
            working = P * layers[i].forward_peak_bytes + (B - P) * layers[a - 1].output_bytes
        else:
            working = B * layers[i].forward_peak_bytes
        peak = max(peak, alive + working)
        if i >= a:
            alive += kept[i]
    grads = (aux.param_bytes if aux is not None else 0) + sum(e.param_bytes for e in exits)
    for i in reversed(range(a, b)):
        grads += layers[i].param_bytes
        peak = max(peak, alive + grads + B * (ins[i] + layers[i].output_bytes))
        alive -= kept[i]
    return max(peak, grads)


@dataclass(frozen=True)
class PeakTerms:
    """A config's peak memory as a function of a runtime's constants k (module doc; `k.for_model` of the
    config's model):

        peak = k.baseline_bytes + k.workspace_fixed_bytes + floor
               + [k.device_bytes + k.trained_weight_copies * trained_param_bytes
                  + k.frozen_weight_copies * frozen_bytes, in a device process] + [k.hidden_bytes, if hidden]
               + copies * max(0, k.workspace_factor * step_peak_bytes - kept_bytes)

    `floor`: weights, gradients, optimizer state, kept activations and the input batch; `kept_bytes`: what the
    step holds anyway (kept activations and gradients of one copy). `step_peak_bytes` is taken at the
    constants' `prefix_batch`."""
    floor: int
    trained_param_bytes: int
    frozen_bytes: int
    step_peak_bytes: int
    kept_bytes: int
    copies: int = 1
    # a device process (the default: what plans promise); False for a bare training loop of the config, which
    # bench/memory_model.py measures beside the device rows (RuntimeConstants.device_bytes)
    device: bool = True
    # the config trains a layer before the last: its kernels' scratch (RuntimeConstants.hidden_bytes)
    hidden: bool = False

    def workspace(self, k: RuntimeConstants) -> int:
        """The peak above the floor and the baseline."""
        # a bare training loop neither loads an artifact (the weight copies) nor evaluates (the device bytes)
        device = (k.device_bytes + k.trained_weight_copies * self.trained_param_bytes
                  + k.frozen_weight_copies * self.frozen_bytes) if self.device else 0
        return int(k.workspace_fixed_bytes + device + (k.hidden_bytes if self.hidden else 0)
                   + self.copies * max(0, int(k.workspace_factor * self.step_peak_bytes) - self.kept_bytes))

    def peak(self, k: RuntimeConstants) -> int:
        return k.baseline_bytes + self.floor + self.workspace(k)


def config_cost(store: ProfileStore, model: ModelRef, config: TrainConfig, runtime: str,
                constants: Optional[RuntimeConstants] = None) -> Cost:
    """`cost` of `config` on `model`, with the profiles (the width's, the auxiliary head's, the exits') from
    `store`."""
    widths = None if config.head_width == 1 else config.widths
    aux = store.aux(model, widths, config.end, config.aux_head) if config.aux_head is not None else None
    exits = [store.aux(model, widths, b, "linear") for b in config.exits]   # DepthFL
    return cost(store.profile(model, widths), config, runtime, aux, constants, exits)


def cost(profile: ModelProfile, config: TrainConfig, runtime: str = "torch",
         aux: Optional[AuxProfile] = None, constants: Optional[RuntimeConstants] = None,
         exits: Sequence[AuxProfile] = ()) -> Cost:
    """`aux`: the profile of the config's auxiliary head; `exits`: one 'linear' head profile per entry of
    `config.exits`, in order."""
    if config.num_layers != profile.num_layers:
        raise ValueError(f"config has {config.num_layers} layers, profile {profile.num_layers}")
    if (config.aux_head is None) != (aux is None):
        raise ValueError("pass the aux profile exactly when the config has an auxiliary head")
    if tuple(e.boundary for e in exits) != config.exits:
        raise ValueError(f"pass one exit profile per boundary in {config.exits}")
    k = (constants or DEFAULTS[runtime]).for_model(profile.model.name)
    profile, frozen_part, frozen_flops = low_rank_view(profile, config)
    a, b, layers, B, M = config.frozen_prefix, config.end, profile.layers, config.batch_size, config.copies
    heads = ([aux] if aux is not None else []) + list(exits)
    trained = layers[a:b]
    trained_param_bytes = sum(l.param_bytes for l in trained) + sum(h.param_bytes for h in heads)
    trained_buffer_bytes = sum(l.buffer_bytes for l in trained) + sum(h.buffer_bytes for h in heads)
    frozen_bytes = sum(l.param_bytes + l.buffer_bytes for l in layers[:a]) + sum(frozen_part[a:b])

    # the step's working sets and the gradients in flight beyond kept activations and gradients (less than
    # nothing where activations and gradients do not peak together: clamped at zero), what the first step
    # allocates once, what the runtime keeps per weight byte, and the input batch
    acts = activation_bytes(profile, config, aux, exits)
    kept = acts + trained_param_bytes
    if M > 1:
        acts = M * acts + M * (M - 1) * 2 * B * profile.layers[-1].output_bytes
    weights_trained = M * (trained_param_bytes + trained_buffer_bytes)
    optimizer = OPTIMIZER_STATE_SLOTS[config.optimizer] * M * trained_param_bytes
    floor = (frozen_bytes + weights_trained + M * trained_param_bytes + optimizer + acts
             + B * profile.input_bytes)
    terms = PeakTerms(floor=floor, trained_param_bytes=M * trained_param_bytes, frozen_bytes=frozen_bytes,
                      step_peak_bytes=step_peak_bytes(profile, config, aux, exits, k.prefix_batch), kept_bytes=kept,
                      copies=M, hidden=a < min(b, profile.num_layers - 1))

    # trained layers and heads: forward, weight gradients (none for frozen weights), input gradients (none
    # for the first trained module)
    fwd = [l.forward_flops for l in layers[:b]] + [h.forward_flops for h in heads]
    trained_fwd = fwd[a:]
    train_flops = 3 * sum(trained_fwd) - sum(frozen_flops[a:b]) - (trained_fwd[0] if trained_fwd else 0)

    return Cost(
        runtime_baseline_bytes=k.baseline_bytes,
        weights_frozen_bytes=frozen_bytes,
        weights_trained_bytes=weights_trained,
        gradient_bytes=M * trained_param_bytes,
        optimizer_bytes=optimizer,
        activation_bytes=acts,
        workspace_bytes=B * profile.input_bytes + terms.workspace(k),
        flops_per_sample=sum(fwd[:a]) + M * train_flops,
        upload_bytes=trained_param_bytes + trained_buffer_bytes,
        download_bytes=frozen_bytes + trained_param_bytes + trained_buffer_bytes,
        trained_params=sum(l.params for l in trained) + sum(h.params for h in heads),
        terms=terms,
    )
