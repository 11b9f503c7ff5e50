"""Measure what a TrainConfig really costs on this machine (imports torch; callers import it lazily).

`build_device_model` builds exactly what a device runs: the model at the config's widths cut to layers
[0, end), layers [0, frozen_prefix) frozen (no gradients, eval mode, run under no_grad), an auxiliary
head at `end` when the config has one. `train_step` is one local step on it.

Two measurements check the cost model (`bench/memory_model.py` compares them with the predictions):

* `measure_activation_bytes`: bytes of the unique storages autograd keeps for backward during one
  training step at the config's batch size (`saved_tensors_hooks`, deduplicated by storage, parameter and
  buffer storages excluded). The same definition as `edgefl.cost.profiler`, measured in one pass over the
  real device model on the real batch; the loss is part of the step, so what it keeps counts too.
* `measure_peak`: a fresh process (`python -m edgefl.cost.measure '<json>'`, one thread) imports torch and
  edgefl, records its RSS (`baseline_rss_bytes`), builds the device model and optimizer, runs warmup +
  timed steps on random data and reports VmHWM (`peak_rss_bytes`), the growth over the baseline
  (`peak_rss_growth_bytes`, what the cost model calls training bytes) and the mean step time. By
  default the process runs with glibc's mmap threshold fixed (`configure_allocator`, see below), the
  allocator policy the torch runtime's constants in edgefl/cost/constants.py are fitted under.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.errors import EdgeflError
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

MEASURED_RUNTIMES = ("torch",)


def build_device_model(ref: ModelRef, config: TrainConfig, seed: int = 0):
    """(model, aux head or None) as a device runs them: the model at `config.widths` holding only layers
    [0, config.end), the frozen prefix with requires_grad False in eval mode (running statistics are
    used, not updated), the trained layers and the head in train mode."""
    torch.manual_seed(seed)
    widths = None if config.head_width == 1 else config.widths
    model = build(ref, widths)
    if len(model.layers) != config.num_layers:
        raise EdgeflError(f"config has {config.num_layers} layers, {ref.label()} has {len(model.layers)}")
    head = model.aux_head(config.end, config.aux_head) if config.aux_head is not None else None
    if config.end < len(model.layers):
        model.layers = nn.ModuleList(list(model.layers)[: config.end])  # later layers are never sent
    model.train()
    for i, layer in enumerate(model.layers):
        if i < config.frozen_prefix:
            layer.eval()
            layer.requires_grad_(False)
    if head is not None:
        head.train()
    return model, head


def trainable_parameters(model, head) -> list:
    params = [p for p in model.parameters() if p.requires_grad]
    if head is not None:
        params += list(head.parameters())
    return params


def make_optimizer(model, head, config: TrainConfig):
    params = trainable_parameters(model, head)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-5)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    raise EdgeflError(f"unknown optimizer {config.optimizer!r}")


def loss_of(model, head, config: TrainConfig, x, y):
    """Forward pass and cross-entropy: frozen prefix under no_grad, trained layers, head."""
    a, b = config.frozen_prefix, config.end
    with torch.no_grad():
        state = model(x, 0, a)
    state = model(state, a, b)
    logits = head(state) if head is not None else state
    if logits.dim() > 2:
        logits = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(logits, y)


def train_step(model, head, config: TrainConfig, x, y, optimizer) -> float:
    loss = loss_of(model, head, config, x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def example_batch(model, head, batch: int, seed: int = 1):
    """Random inputs and class targets shaped like the device's logits (per sample: one target for a
    classifier, one per position for a language model)."""
    torch.manual_seed(seed)
    modules = [m for m in (model, head) if m is not None]
    modes = [(m, m.training) for root in modules for m in root.modules()]
    for root in modules:
        root.eval()
    with torch.no_grad():
        probe = model(model.example_input(1))
        logits = head(probe) if head is not None else probe
    for m, training in modes:
        m.training = training
    per_sample = logits.reshape(-1, logits.shape[-1]).shape[0]
    return model.example_input(batch), torch.randint(0, logits.shape[-1], (batch * per_sample,))


def _weight_ptrs(*modules) -> set[int]:
    ptrs = set()
    for m in modules:
        if m is not None:
            ptrs |= {t.untyped_storage().data_ptr() for t in list(m.parameters()) + list(m.buffers())}
    return ptrs


def measure_activation_bytes(ref: ModelRef, config: TrainConfig) -> int:
    """Bytes of the unique storages autograd keeps for backward in one training step at
    config.batch_size, parameter and buffer storages excluded."""
    model, head = build_device_model(ref, config)
    x, y = example_batch(model, head, config.batch_size)
    excluded = _weight_ptrs(model, head)
    sizes: dict[int, int] = {}
    keep = []  # hold every packed tensor so no storage is freed and its address reused

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in excluded and t.device.type != "meta":
            sizes[s.data_ptr()] = s.nbytes()
        # a detached alias: handing back `t` itself would let a saved output reach its own grad_fn, a
        # reference cycle through autograd's C++ nodes that leaks the whole graph
        t = t.detach()
        keep.append(t)
        return t

    # autograd packs what it keeps while the graph is built: the forward pass and the loss are the whole
    # of it (backward and the optimizer step only consume and free), so they need not run here
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, head, config, x, y)
    del loss
    keep.clear()
    return sum(sizes.values())


# ---------------------------------------------------------------------------------------------- peak RSS

# glibc's malloc serves a block of at least its mmap threshold with mmap and gives it back to the OS when
# freed, but by default it raises that threshold to the largest block ever freed (up to 32 MiB): after the
# first step every activation-sized block comes from the heap, which keeps what is freed and fragments, so
# peak RSS follows the order of allocations rather than what is alive at once (bench/memory_model.py,
# 2026-11: 1.2-1.5x the live bytes for the CNNs, up to ~5x for DenseNet's growing concatenations and
# about 2x for the transformer's attention maps). Fixing the threshold at glibc's own starting value,
# 128 KiB, keeps peak RSS at the live bytes plus a constant; every large block then costs fresh page
# faults (steps up to ~2x slower on 1 thread). The torch runtime's constants are fitted under this policy.
MMAP_THRESHOLD = 128 * 1024
ALLOCATORS = ("fixed", "default")


def configure_allocator(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int | None = None) -> bool:
    """Fix glibc's mmap threshold in this process (what `allocator='fixed'` measures) and, where given, the
    free bytes at the heap's top it keeps rather than gives back; call it before training. False where the C
    library has no mallopt (not glibc): the default policy stays."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    done = bool(mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)))
    if trim_threshold is not None:
        done = bool(mallopt(M_TRIM_THRESHOLD, int(trim_threshold))) and done
    return done


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise EdgeflError(f"/proc/self/status has no {field}; peak memory is measured on Linux only")


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0) so import-time transients do not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def measure_peak(ref: ModelRef, config: TrainConfig, runtime: str = "torch", steps: int = 5, warmup: int = 2,
                 timeout: float = 600.0, allocator: str = "fixed") -> dict:
    """Peak RSS of `warmup + steps` training steps in a fresh one-thread process (see module doc).
    allocator: 'fixed' (glibc's mmap threshold fixed at MMAP_THRESHOLD, what the cost model is calibrated
    for) or 'default' (the C library as it comes)."""
    if runtime not in MEASURED_RUNTIMES:
        raise EdgeflError(f"measuring the {runtime!r} runtime is not implemented yet; "
                          f"measured runtimes: {', '.join(MEASURED_RUNTIMES)}")
    if steps < 1 or warmup < 0:
        raise EdgeflError("measure_peak needs steps >= 1 and warmup >= 0")
    if allocator not in ALLOCATORS:
        raise EdgeflError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
    arg = json.dumps({"model": ref.to_json(), "config": config.to_json(), "runtime": runtime,
                      "steps": steps, "warmup": warmup, "allocator": allocator})
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if allocator == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)  # read by glibc at start, before any import
    proc = subprocess.run([sys.executable, "-m", "edgefl.cost.measure", arg], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise EdgeflError(f"measurement process failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(arg: str) -> dict:
    torch.set_num_threads(1)
    spec = json.loads(arg)
    ref = ModelRef.from_json(spec["model"])
    config = TrainConfig.from_json(spec["config"])
    # the architecture's module is part of what the device imports, not of what the model costs
    import importlib

    from edgefl.zoo import _REGISTRY
    importlib.import_module(_REGISTRY[ref.name][0])
    baseline = _status_bytes("VmRSS")
    _reset_peak()
    model, head = build_device_model(ref, config)
    optimizer = make_optimizer(model, head, config)
    x, y = example_batch(model, head, config.batch_size)
    for _ in range(spec["warmup"]):
        train_step(model, head, config, x, y, optimizer)
    t0 = time.perf_counter()
    for _ in range(spec["steps"]):
        train_step(model, head, config, x, y, optimizer)
    step_seconds = (time.perf_counter() - t0) / spec["steps"]
    peak = _status_bytes("VmHWM")
    return {"runtime": spec["runtime"], "peak_rss_bytes": peak, "baseline_rss_bytes": baseline,
            "peak_rss_growth_bytes": peak - baseline, "step_seconds": step_seconds,
            "threads": torch.get_num_threads(), "allocator": spec.get("allocator", "default")}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
