"""Per-runtime constants of the cost model, and where each default comes from.

`baseline_bytes` is what importing the runtime and opening a session costs before any model exists.
`workspace_fixed_bytes` is memory the first training step allocates once (kernel libraries and their
code pages, thread pools, allocator arenas; for torch also torch._dynamo, which torch.optim imports on
first use, about 70 MiB); `workspace_factor` scales the step's live-bytes peak (`edgefl.cost.
step_peak_bytes`: kept activations, gradients and each layer's forward working set on the step's
timeline) for what kernels allocate beyond the tensors the profiler sees. Defaults come from
measurements on an x86_64 2-core machine; `edgefl calibrate` fits them from device reports and writes a
JSON file that `load_calibration` reads instead.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from edgefl.errors import ConfigError

MiB = 2**20


@dataclass(frozen=True)
class RuntimeConstants:
    baseline_bytes: int
    workspace_fixed_bytes: int
    workspace_factor: float
    source: str
    # samples the runtime pushes through the frozen prefix at once (0: the whole batch). The prefix is
    # inference, its rows independent: a device running it in such chunks holds one chunk's working set
    # (edgefl.cost.step_peak_bytes). Exported artifacts tell the device (manifest `prefix_batch`).
    prefix_batch: int = 0
    # bytes the runtime holds per byte of trained parameters beyond the weights, their gradients and the
    # optimizer state (ORT: its gradient accumulation buffer and the gradient it adds into it), and per
    # byte of frozen weights beyond the weights (packed copies: XNNPACK's, MLAS's)
    trained_weight_copies: float = 0.0
    frozen_weight_copies: float = 0.0
    # a runtime's memory depends on the graphs it runs: per model family whose peaks were measured
    # (`family`), that family's own workspace terms (fixed bytes, factor, trained and frozen weight copies);
    # a model of any other family gets the terms above, an upper bound over every measured family
    families: tuple[tuple[str, int, float, float, float], ...] = ()

    def for_model(self, model: str) -> "RuntimeConstants":
        """The constants a model of zoo name `model` is priced with."""
        name = family(model)
        for f, fixed, factor, trained, frozen in self.families:
            if f == name:
                return replace(self, workspace_fixed_bytes=fixed, workspace_factor=factor,
                               trained_weight_copies=trained, frozen_weight_copies=frozen, families=())
        return self

    def with_family(self, model: str, fixed: int, factor: float, trained: float, frozen: float) -> "RuntimeConstants":
        name = family(model)
        rest = tuple(f for f in self.families if f[0] != name)
        return replace(self, families=tuple(sorted(rest + ((name, fixed, factor, trained, frozen),))))


def family(model: str) -> str:
    """A model's family for its memory constants: ResNets of every depth are one."""
    return "resnet" if model.startswith("resnet") else model


DEFAULTS: dict[str, RuntimeConstants] = {
    # baseline_bytes: RSS right after `import torch` in a fresh process (bench/memory_model.py writes it
    # as torch_import_rss_bytes). workspace: least-squares fit (relative error) of the measured peak-RSS
    # growth of fresh training processes on 114 ResNet-20/56 and CNN peaks (bench/memory_model.py --fit,
    # 2026-11, torch 2.13.0 CPU, x86_64, one thread, glibc's mmap threshold fixed at 128 KiB as
    # edgefl.measure.configure_allocator sets it); DenseNet, VGG, ViT and the transformer are out of
    # sample (within 12.5% there). Under glibc's default dynamic threshold the heap fragments and the
    # growth is up to ~2x these predictions: see bench/results/memory_model.json, default_allocator.
    "torch": RuntimeConstants(228_450_304, 101_059_889, 1.06,
                              "measured import RSS; workspace fitted on measured peaks (bench/memory_model.py)"),
    # onnxruntime-training-cpu 1.19.2 on a device (numpy, the torch-free shim, no torch, no onnx).
    # baseline_bytes: RSS of a fresh process after importing it and opening one session
    # (bench/artifact_memory.py writes it as ort_baseline_bytes). workspace: an upper bound, not a
    # least-squares fit (a plan is a promise; fitted as the executorch entry is): on 15 measured peaks of
    # exported ResNet-20 (frozen 0 / 10 / 19 x head width 0.25 / 1), CNN 1x28x28 (frozen 0 / 1 x width 1 /
    # 0.25, all-but-head) and transformer-LM (frozen 0 / 4 / 7) sets, 20 steps at batch 32 with the device's
    # default evaluation before and after (256 examples; `edgefl-device train` as devices run it, data read a
    # batch at a time, SGD momentum on the device side: one optimizer slot), 2026-11-24, x86_64, one thread,
    # glibc's mmap threshold fixed at 128 KiB; the least-squares fixed term raised by the worst
    # under-prediction plus max(2%, 1 MiB): every measured peak is 61-98% of its prediction (CNN 68-98%,
    # ResNet-20 61-76%, transformer 76-98%; the tightest are the full-width CNN, whose 6 MiB of trained
    # weights cost ORT far more than weights + gradients + momentum, and the transformer with 4 frozen
    # blocks; the loosest the all-but-head sets: the fixed term the CNN needs over-covers small sets). The
    # two terms cannot fit all three families closely: the cost model has no ORT term proportional to the
    # trained weights. Leave one family out (fitted on the other two): held-out CNN peaks are 78-108% of
    # their predictions (the full-width CNN is under-predicted by 8%), ResNet-20 61-75%, transformer
    # 51-89%: every family is needed. prefix_batch: the ORT trainer runs the frozen prefix 4 samples at a
    # time (edgefl.device_runtime.trainers.ort_trainer).
    "ort": RuntimeConstants(52_023_296, 55_046_906, 2.28,
                            "measured import + session RSS; workspace an upper bound on measured peaks "
                            "(bench/artifact_memory.py)",
                            prefix_batch=4),
    # executorch 1.5.1 as devices run it: the native trainer (edgefl-et-train: C++, no Python, no torch).
    # baseline_bytes: peak RSS of a fresh `edgefl-et-train --version` under GNU time, its libraries loaded
    # and kernels registered, no program (bench/artifact_memory.py writes it as executorch_baseline).
    # workspace: an upper bound, not a least-squares fit (a plan is a promise): on 9 measured peaks of
    # exported ResNet-20 (frozen 0 x width 1 / 0.25, frozen 10 x 0.25, all-but-head) and CNN 1x28x28 (frozen
    # 0 / 1 x width 1 / 0.25, all-but-head) sets, 20 steps at batch 32 (2026-11-24, x86_64, one thread,
    # glibc's mmap threshold fixed at 128 KiB; peaks repeat within 0.1 MiB), the least-squares fixed term
    # raised by the worst under-prediction plus max(2%, 1 MiB): every measured peak is 30-98% of its
    # prediction (the CNN sets 88-98%, ResNet-20 60-78%, the all-but-head sets 30-37%: the factor also
    # scales the frozen prefix's working set, which XNNPACK runs in little memory). Most of a peak is the
    # suffix program's memory-planned arena, whose high-water mark is a convolution's im2col copies in
    # flight (slices and their concatenation: the CNN's 5x5 convolution on 28x28 sets the factor). Fitted on
    # one family alone, the other's peaks reach 78% (CNN -> ResNet-20) and 122% (ResNet-20 -> CNN) of their
    # predictions: both families are needed. prefix_batch 0: the native trainer runs the prefix over the
    # whole batch. The Python ExecuTorch trainer (--trainer python, imports torch) peaks at 375-473 MiB on
    # the same sets: these constants do not cover it.
    "executorch": RuntimeConstants(5_193_728, 39_209_014, 3.08,
                                   "measured native trainer RSS; workspace an upper bound on measured native "
                                   "peaks (bench/artifact_memory.py)", prefix_batch=1),
}


def load_calibration(path: str | Path | None = None) -> dict[str, RuntimeConstants]:
    """Defaults, overridden per runtime by a calibration file if one is given."""
    constants = dict(DEFAULTS)
    if path is None:
        return constants
    try:
        data = json.loads(Path(path).read_text())
        for runtime, values in data["runtimes"].items():
            if runtime not in DEFAULTS:
                raise ConfigError(f"{path}: runtimes.{runtime}: unknown runtime; use one of {', '.join(DEFAULTS)}")
            merged = {**asdict(DEFAULTS[runtime]), **values}
            merged["families"] = tuple(tuple(f) for f in merged["families"])
            constants[runtime] = RuntimeConstants(**merged)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a calibration file ({exc}); regenerate it with 'edgefl calibrate'") from None
    return constants
