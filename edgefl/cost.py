"""The cost model: what a TrainConfig costs a device, from a ModelProfile. No torch.

Peak memory (SLT App. E: weights + gradients + kept activations; FedOLF sec. 3.4 eq. 4 for the
activation share of a frozen prefix; plus what a real process adds):

    peak = runtime_baseline + training_bytes
    training_bytes = weights(frozen + trained) + gradients(trained) + optimizer state
                     + activations kept for the trained layers + workspace
    workspace = workspace_fixed + input batch
                + max(0, workspace_factor * step_peak - activations - gradients)

`step_peak_bytes` walks the step's timeline (frozen forward, trained forward, backward, optimizer step)
with each layer's forward working set, kept activations and gradients: what is alive at once, which is
more than activations + gradients where a layer's working set dominates (a frozen transformer block's
attention maps) and less where backward frees activations as it makes gradients (clamped: the sum is
kept, an upper bound).

All byte counts are float32 unless the profile says otherwise; FLOPs count conv and matmul work
(multiply-add = 2 FLOPs) per sample: frozen layers forward only, trained layers forward + backward
(backward = 2x forward: weight and input gradients; the first trained module has no input gradient).
Upload = the trained tensors (parameters and their buffers); download = every tensor the device runs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from edgefl.calibration import DEFAULTS, RuntimeConstants
from edgefl.profile import AuxProfile, ModelProfile
from edgefl.trainconfig import OPTIMIZER_STATE_SLOTS, TrainConfig


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

    @property
    def training_bytes(self) -> int:
        return (self.weights_frozen_bytes + self.weights_trained_bytes + self.gradient_bytes
                + self.optimizer_bytes + self.activation_bytes + self.workspace_bytes)

    @property
    def peak_memory_bytes(self) -> int:
        return self.runtime_baseline_bytes + self.training_bytes

    def to_json(self) -> dict:
        return {**asdict(self), "training_bytes": self.training_bytes, "peak_memory_bytes": self.peak_memory_bytes}


def activation_bytes_per_sample(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile]) -> int:
    """Bytes autograd keeps per sample for the trained layers (and the auxiliary head)."""
    a, b, layers = config.frozen_prefix, config.end, profile.layers
    total = sum(layers[i].activation_bytes for i in range(a, b))
    last_trained = b - 1 >= a
    if b < len(layers) and last_trained:
        total += layers[b - 1].carried_bytes  # what layer b would have kept is now kept for the head
    if aux is not None:
        total += aux.activation_bytes
        if not (last_trained and layers[b - 1].output_saved_bytes):
            total += aux.input_saved_bytes
    return total


def activation_bytes(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile]) -> int:
    """Bytes autograd keeps for one batch: per-sample bytes times the batch, plus what the trained layers
    keep once per batch whatever its size (BN's per-channel statistics, the loss's total weight)."""
    fixed = sum(profile.layers[i].activation_fixed_bytes for i in config.trained_layers)
    fixed += aux.activation_fixed_bytes if aux is not None else 0
    return config.batch_size * activation_bytes_per_sample(profile, config, aux) + fixed


def step_peak_bytes(profile: ModelProfile, config: TrainConfig, aux: Optional[AuxProfile] = None) -> int:
    """Most bytes one training step has allocated at once beyond the weights, the optimizer state and the
    input batch, on a timeline of the step (B = batch size, kept(i) = what trained layer i keeps):

      forward, layer i:     kept(a..i-1) + B * forward_peak(i)   (a frozen layer keeps nothing)
      end of forward:       every kept activation
      backward, layer i:    kept(a..i) + gradients of layers i.. and the aux head
                            + B * (input + output of layer i): the gradients flowing through it
      optimizer step:       every gradient

    Activations and gradients never peak together in full: backward frees a layer's activations as
    it makes its gradients."""
    B, a, b, layers = config.batch_size, config.frozen_prefix, config.end, profile.layers
    kept = [B * l.activation_bytes + l.activation_fixed_bytes for l in layers[:b]]
    ins = [profile.input_bytes] + [l.output_bytes for l in layers[: b - 1]]
    peak = activation_bytes(profile, config, aux)
    alive = 0
    for i in range(b):
        peak = max(peak, alive + B * layers[i].forward_peak_bytes)
        if i >= a:
            alive += kept[i]
    grads = aux.param_bytes if aux is not None else 0
    for i in reversed(range(a, b)):
        grads += layers[i].param_bytes
        peak = max(peak, alive + grads + B * (ins[i] + layers[i].output_bytes))
        alive -= kept[i]
    return max(peak, grads)


def cost(profile: ModelProfile, config: TrainConfig, runtime: str = "torch",
         aux: Optional[AuxProfile] = None, constants: Optional[RuntimeConstants] = None) -> Cost:
    if config.num_layers != profile.num_layers:
        raise ValueError(f"config has {config.num_layers} layers, profile {profile.num_layers}")
    if (config.aux_head is None) != (aux is None):
        raise ValueError("pass the aux profile exactly when the config has an auxiliary head")
    k = constants or DEFAULTS[runtime]
    a, b, layers, B = config.frozen_prefix, config.end, profile.layers, config.batch_size
    frozen = layers[:a]
    trained = layers[a:b]
    aux_param = aux.param_bytes if aux else 0
    aux_buffer = aux.buffer_bytes if aux else 0
    trained_param_bytes = sum(l.param_bytes for l in trained) + aux_param
    trained_buffer_bytes = sum(l.buffer_bytes for l in trained) + aux_buffer
    frozen_bytes = sum(l.param_bytes + l.buffer_bytes for l in frozen)

    # what the step allocates beyond kept activations and gradients (working sets, the gradients in flight;
    # less than nothing where activations and gradients do not peak together: clamped at zero), plus what
    # the first step allocates once and the input batch
    acts = activation_bytes(profile, config, aux)
    peak = int(k.workspace_factor * step_peak_bytes(profile, config, aux))
    workspace = k.workspace_fixed_bytes + B * profile.input_bytes + max(0, peak - acts - trained_param_bytes)

    fwd = [l.forward_flops for l in layers[:b]] + ([aux.forward_flops] if aux else [])
    trained_fwd = fwd[a:]
    flops = sum(fwd) + 2 * sum(trained_fwd) - (trained_fwd[0] if trained_fwd else 0)

    return Cost(
        runtime_baseline_bytes=k.baseline_bytes,
        weights_frozen_bytes=frozen_bytes,
        weights_trained_bytes=trained_param_bytes + trained_buffer_bytes,
        gradient_bytes=trained_param_bytes,
        optimizer_bytes=OPTIMIZER_STATE_SLOTS[config.optimizer] * trained_param_bytes,
        activation_bytes=acts,
        workspace_bytes=workspace,
        flops_per_sample=flops,
        upload_bytes=trained_param_bytes + trained_buffer_bytes,
        download_bytes=frozen_bytes + trained_param_bytes + trained_buffer_bytes,
        trained_params=sum(l.params for l in trained) + (aux.params if aux else 0),
    )
