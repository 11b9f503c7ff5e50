"""Derive a ModelProfile from the model itself (imports torch).

One batch-1 training step of the fully trainable model runs layer by layer. Per layer we record its
parameters and buffers, the shape and bytes of its output state, its forward FLOPs (torch's FLOP
counter: conv and matmul ops, a multiply-add counted as 2 FLOPs), the most bytes alive at once in its
forward (its working set) and which storages autograd keeps for backward (`saved_tensors_hooks`,
deduplicated by storage, parameters and buffers excluded: they are weights, not activations); the
loss's own kept storages (log-probabilities, targets) count for the last layer, and for an auxiliary
head, the head. A storage is attributed to the last layer that keeps it, so the activation bytes of any
trained suffix [a, L) are the sum over its layers; `carried_bytes` lets a suffix that stops early at
boundary b add back what layer b-1 kept for layer b. A second step at batch 2 splits what is kept per
sample from what is kept once per batch (BN's per-channel statistics: `activation_fixed_bytes`).
"""
from __future__ import annotations

import weakref
from collections import defaultdict

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from edgefl.cost.profile import AuxProfile, LayerProfile, ModelProfile
from edgefl.zoo import ModelRef, build


def _tensors(state):
    return list(state) if isinstance(state, (tuple, list)) else [state]


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class _SavedTensors:
    """Storages autograd keeps, with the set of 'owners' (layer indices) that kept each."""

    def __init__(self, excluded_ptrs: set[int]):
        self.excluded = excluded_ptrs
        self.owner = -1
        self.size: dict[int, int] = {}
        self.owners: dict[int, set[int]] = defaultdict(set)
        self._keep = []  # hold packed tensors so storages are not freed and their addresses reused

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.excluded and t.device.type != "meta":
            self.size[ptr] = _nbytes(t)
            self.owners[ptr].add(self.owner)
        # keep and hand back a detached alias: returning `t` itself lets a saved output reach its own
        # grad_fn, a reference cycle through autograd's C++ nodes that leaks every profiled graph
        t = t.detach()
        self._keep.append(t)
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def _weights(module: torch.nn.Module) -> tuple[int, int, int, set[int]]:
    params = list(module.parameters())
    buffers = list(module.buffers())
    ptrs = {p.untyped_storage().data_ptr() for p in params} | {b.untyped_storage().data_ptr() for b in buffers}
    return (sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params),
            sum(b.numel() * b.element_size() for b in buffers), ptrs)


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm, torch.Tensor.bmm,
            torch.Tensor.mm, torch.addmm, torch.baddbmm}


def _op_flops(func, args, kwargs, out) -> float:
    """Conv and matmul FLOPs of one torch-function call (a multiply-add counts 2), 0 for other ops. Counted
    at the torch-function level: a dispatch-level counter would pull in the compiler stack, over a second
    of import on first use."""
    if func in (F.conv1d, F.conv2d, torch.conv2d, torch.conv1d):
        w = args[1] if len(args) > 1 else kwargs["weight"]
        return 2.0 * out.numel() * w[0].numel()
    if func is F.linear:
        w = args[1] if len(args) > 1 else kwargs["weight"]
        return 2.0 * out.numel() * w.shape[-1]
    if func in _MATMULS:
        a = args[1] if func in (torch.addmm, torch.baddbmm) else args[0]
        return 2.0 * out.numel() * a.shape[-1]
    return 0.0


class _FlopCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.flops = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += _op_flops(func, args, kwargs, out)
        return out


def _flops(fn):
    counter = _FlopCounter()
    with counter:
        out = fn()
    return out, counter.flops


class _WorkingSet(TorchFunctionMode):
    """Peak bytes of the tensors alive at once while a layer runs, its input state included, counted per
    storage, weights excluded. A storage counts from the op that makes it until the last tensor on it that
    Python holds dies: that is when a no_grad (frozen) forward frees it; what autograd keeps beyond that
    is counted as activations, not here."""

    def __init__(self, inputs, excluded_ptrs: set[int]):
        super().__init__()
        self.excluded = excluded_ptrs
        self.flops = 0.0
        self.refs: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.live = self.peak = 0
        self._watch: list = []
        for t in inputs:
            self._track(t)

    def _track(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.excluded:
            return
        if ptr not in self.refs:
            self.refs[ptr] = 0
            self.size[ptr] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self.refs[ptr] += 1
        # a plain weak reference with a callback is several times cheaper than weakref.finalize; it fires
        # only while the reference itself lives, so the set holds them for the layer's run
        self._watch.append(weakref.ref(t, lambda _, ptr=ptr: self._release(ptr)))

    def _release(self, ptr: int) -> None:
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            self.live -= self.size.pop(ptr)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += _op_flops(func, args, kwargs, out)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            self._track(t)
        return out


def _loss(logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a training step against random class targets (one per logits row: one per sample
    for a classifier, one per position for a language model)."""
    logits = logits.reshape(-1, logits.shape[-1])
    target = torch.randint(0, logits.shape[-1], (logits.shape[0],))
    return F.cross_entropy(logits, target)


class _OneThread:
    """Batch-1 profiling is dominated by per-op overhead: extra intra-op threads only wait on each
    other (and on anything else running), so profile on one."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


def profile_model(ref: ModelRef, widths=None) -> ModelProfile:
    with _OneThread():
        return _profile_model(ref, widths)


def profile_aux(ref: ModelRef, widths, boundary: int, kind: str) -> AuxProfile:
    with _OneThread():
        return _profile_aux(ref, widths, boundary, kind)


def _linears(layer: torch.nn.Module, batch: int):
    """Forward hooks recording (out_features, in_features, rows per sample, has bias) of each nn.Linear the
    layer runs, in call order; returns (records, hook handles)."""
    seen: dict[int, tuple] = {}

    def hook(module, inputs, output):
        seen[id(module)] = (module.out_features, module.in_features, output.numel() // (batch * module.out_features),
                            module.bias is not None)
    handles = [m.register_forward_hook(hook) for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    return seen, handles


def _saved_pass(model, batch: int, weight_ptrs: set[int]):
    """One training forward (and loss) at `batch`, layer by layer: per layer its description and the bytes
    of kept storages attributed as the module doc says (act, carried, out_saved)."""
    saved = _SavedTensors(weight_ptrs)
    x = model.example_input(batch)
    state, rows = x, []
    with saved.hooks():
        for i, layer in enumerate(model.layers):
            saved.owner = i
            working = _WorkingSet(_tensors(state), weight_ptrs)
            linears, handles = _linears(layer, batch)
            with working:
                state = layer(state)
            for h in handles:
                h.remove()
            params, param_bytes, buffer_bytes, _ = _weights(layer)
            outs = _tensors(state)
            rows.append(dict(kind=type(layer).__name__, params=params, param_bytes=param_bytes,
                             buffer_bytes=buffer_bytes, output_shape=tuple(outs[0].shape[1:]),
                             output_bytes=sum(_nbytes(t) for t in outs), forward_flops=working.flops,
                             out_ptrs={t.untyped_storage().data_ptr() for t in outs}, working=working.peak,
                             linears=tuple(linears.values())))
        _loss(state)  # what the loss keeps (log-probabilities, targets) belongs to the last layer
    act = [0] * len(rows)
    carried = [0] * len(rows)
    out_saved = [0] * len(rows)
    for ptr, owners in saved.owners.items():
        size = saved.size[ptr]
        last = max(owners)
        act[last] += size
        for o in owners:
            if o != last:
                carried[o] += size
            if ptr in rows[o]["out_ptrs"]:
                out_saved[o] += size
    working = [r.pop("working") for r in rows]
    for r in rows:
        del r["out_ptrs"]
    return x, rows, act, carried, out_saved, working


def _split(one: int, two: int, batch: int = 1) -> tuple[int, int]:
    """(per sample, per batch) from the bytes kept at `batch` and at `batch + 1`."""
    per_sample = max(two - one, 0)
    return per_sample, one - batch * per_sample


def _profile_model(ref: ModelRef, widths=None) -> ModelProfile:
    torch.manual_seed(0)
    model = build(ref, widths)
    model.train()
    _, _, _, weight_ptrs = _weights(model)
    # batch 1 gives the per-sample description; batch 2 separates what autograd keeps per sample from
    # what it keeps once per batch (BN's saved mean and inverse std per channel, the loss's total weight)
    x, rows, act1, carried1, out1, work1 = _saved_pass(model, 1, weight_ptrs)
    _, _, act2, carried2, out2, work2 = _saved_pass(model, 2, weight_ptrs)
    layers = []
    for i, r in enumerate(rows):
        act, act_fixed = _split(act1[i], act2[i])
        layers.append(LayerProfile(**r, activation_bytes=act, carried_bytes=_split(carried1[i], carried2[i])[0],
                                   output_saved_bytes=_split(out1[i], out2[i])[0],
                                   activation_fixed_bytes=act_fixed,
                                   forward_peak_bytes=_split(work1[i], work2[i])[0]))
    layers = tuple(layers)
    return ModelProfile(model=ref, widths=tuple(widths) if widths is not None else tuple([1.0] * len(layers)),
                        input_shape=tuple(model.input_shape), input_bytes=_nbytes(x), num_classes=model.num_classes,
                        cut_points=tuple(model.cut_points), stages=tuple(model.stages), layers=layers)


def _profile_aux(ref: ModelRef, widths, boundary: int, kind: str) -> AuxProfile:
    torch.manual_seed(0)
    model = build(ref, widths)
    head = model.aux_head(boundary, kind)
    model.train()
    head.train()
    params, param_bytes, buffer_bytes, ptrs = _weights(head)
    kept = []
    # per-sample and per-batch bytes as for the layers, from batches 2 and 3: BN in train mode needs more
    # than one value per channel, and a head's conv may see a 1x1 map
    for batch in (2, 3):
        with torch.no_grad():
            state = model(model.example_input(batch), 0, boundary)
        state = state.detach().requires_grad_(True)
        saved = _SavedTensors(ptrs)
        with saved.hooks():
            logits, flops = _flops(lambda: head(state))
            _loss(logits)
        in_ptr = state.untyped_storage().data_ptr()
        kept.append((sum(s for p, s in saved.size.items() if p != in_ptr), saved.size.get(in_ptr, 0), flops))
    (internal2, input2, flops2), (internal3, input3, _) = kept
    internal, internal_fixed = _split(internal2, internal3, 2)
    return AuxProfile(boundary=boundary, kind=kind, params=params, param_bytes=param_bytes, buffer_bytes=buffer_bytes,
                      forward_flops=flops2 / 2, activation_bytes=internal,
                      input_saved_bytes=_split(input2, input3, 2)[0], activation_fixed_bytes=internal_fixed)
