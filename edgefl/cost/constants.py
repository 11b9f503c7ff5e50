"""Per-runtime constants of the cost model, and where each default comes from.

`baseline_bytes` is what importing the runtime and opening a session costs before any model exists.
`workspace_fixed_bytes` is memory the first training step allocates once (kernel libraries and their
code pages, thread pools, allocator arenas; for torch also torch._dynamo, about 70 MiB, which torch.optim's
optimizer classes and `torch.export.load` both import: a torch device process holds it whatever its
optimizer, and so does the Python ExecuTorch runtime); `workspace_factor` scales the step's live-bytes peak
(`edgefl.cost.model.step_peak_bytes`: kept activations, gradients and each layer's forward working set on the
step's timeline) for what kernels allocate beyond the tensors the profiler sees. Defaults come from
measurements on an x86_64 2-core machine; `edgefl calibrate` fits them from device reports and writes a
JSON file that `load_calibration` reads instead.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from edgefl.errors import ConfigError

MiB = 2**20



@dataclass(frozen=True)
class AgentTerms:
    """What a device agent keeps resident beside each round's training process: `resident_bytes` of its own
    (program, libraries, MQTT session, allocator) plus `upload_copies` times the round's upload, which it holds
    while it sends it (the trainer's output read in, and the outbox's copy kept until the receipt)."""
    resident_bytes: int
    upload_copies: float

    def bytes(self, upload_bytes: int) -> int:
        return int(self.resident_bytes + self.upload_copies * upload_bytes)


# Per agent kind, measured by bench/device_memory.py (bench/results/device_memory.json): 3 served rounds of the
# full CNN (6.35 MiB uploads), the agent's VmHWM (taken once the round's upload is out) minus its two upload
# copies, rounded up to a MiB: native 19.9 MiB -> 8; Python 57.9-59.9 MiB -> 48, flat from the first round, and
# 60.8 MiB (48.2 + its copies) in tests/integration/test_native_served_acceptance.py's CNN run, so 50: a MiB and
# a half above the largest seen. A plan's predicted peak is the training process's plus this: the memory budget is
# the whole device's. Whole device measured / predicted (bench, 3 rounds): native+executorch 0.93,
# Python+executorch 0.92, Python+ort 0.95, Python+torch 0.97.
AGENTS: dict[str, AgentTerms] = {"native": AgentTerms(8 * MiB, 2.0), "python": AgentTerms(50 * MiB, 2.0)}


@dataclass(frozen=True)
class FamilyTerms:
    """One model family's own workspace terms on a runtime, fitted on its measured peaks (the fields mean what
    RuntimeConstants' fields of the same names mean). A model of a family without its own terms is priced with
    the runtime's generic ones, an upper bound over every measured family."""
    family: str                          # edgefl.cost.constants.family of a zoo name: ResNets of every depth are one
    workspace_fixed_bytes: int
    workspace_factor: float
    trained_weight_copies: float
    frozen_weight_copies: float
    device_bytes: int = 0
    hidden_bytes: int = 0

    def terms(self) -> dict:
        """The terms by field name, without the family's name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "family"}


@dataclass(frozen=True)
class RuntimeConstants:
    baseline_bytes: int
    workspace_fixed_bytes: int
    workspace_factor: float
    source: str
    # samples the runtime pushes through the frozen prefix at once (0: the whole batch). The prefix is
    # inference, its rows independent: a device running it in such chunks holds one chunk's working set
    # (edgefl.cost.model.step_peak_bytes). Exported artifacts tell the device (manifest `prefix_batch`).
    prefix_batch: int = 0
    # bytes a device process holds per byte of trained parameters beyond the weights, their gradients and
    # the optimizer state (ORT: its gradient accumulation buffer and the gradient it adds into it; torch: the
    # loaded artifact), and per byte of frozen weights beyond the weights (packed copies: XNNPACK's, MLAS's)
    trained_weight_copies: float = 0.0
    frozen_weight_copies: float = 0.0
    # what a device process (`edgefl-device train`: the artifact loaded through the device runtime, its
    # evaluation before and after training) holds beyond a bare training loop of the same config: fitted where
    # both were measured (torch: bench/memory_model.py's training loops beside the device rows); the planner
    # prices devices, so every prediction includes it (edgefl.cost.model.PeakTerms.device)
    device_bytes: int = 0
    # what the kernels of trained hidden layers hold beyond the tensors the profiler sees, whatever their
    # size (ExecuTorch: a convolution's patch matrices, built 2 MiB at a time, and their gradients; none when
    # only the last layer trains): fitted per measured family (edgefl.cost.model.PeakTerms.hidden)
    hidden_bytes: int = 0
    # a runtime's memory depends on the graphs it runs: per model family whose peaks were measured, that
    # family's own workspace terms; a model of any other family gets the terms above
    families: tuple[FamilyTerms, ...] = ()

    def for_model(self, model: str) -> "RuntimeConstants":
        """The constants a model of zoo name `model` is priced with."""
        name = family(model)
        own = next((f for f in self.families if f.family == name), None)
        return self if own is None else replace(self, **own.terms(), families=())

    def with_family(self, model: str, **terms) -> "RuntimeConstants":
        """These constants with `model`'s family's own terms set to `terms` (FamilyTerms' fields)."""
        name = family(model)
        rest = tuple(f for f in self.families if f.family != name)
        return replace(self, families=tuple(sorted(rest + (FamilyTerms(name, **terms),), key=lambda f: f.family)))


def unmeasured_note(constants: RuntimeConstants, runtime: str, model: str) -> str | None:
    """A plan's note when `model`'s family has no measured constants of its own on `runtime` (None when it has):
    it is priced with the generic terms (edgefl.cost.upper_bound.fit_families), a bound that holds with more memory
    to spare than a family's own."""
    name = family(model)
    measured = sorted(f.family for f in constants.families)
    if not measured or name in measured:
        return None
    return (f"{runtime}: no measured memory constants for {name}; its peaks are priced with the generic terms "
            f"fitted over the measured families ({', '.join(measured)}): safe, and looser than a family's own; 'edgefl "
            f"calibrate' on a served run fits {name}'s own")


def family(model: str) -> str:
    """A model's family for its memory constants: ResNets of every depth are one."""
    return "resnet" if model.startswith("resnet") else model


# Workspace terms of every runtime below are fitted by edgefl.cost.upper_bound: per measured model family its own terms,
# each an upper bound on every measured peak of that family with a margin of max(2%, 1 MiB) (the grid's constants
# that maximise the smallest measured/predicted); a model of any other family gets, term by term, the largest any
# family needed (ORT: one fit over every family's peaks, edgefl.cost.upper_bound.joint_generic). Measured 2026-11-25 on
# x86_64, one thread, glibc's mmap threshold fixed at 128 KiB, batch 32, 20 steps with the device's default
# evaluation (256 examples) before and after.
DEFAULTS: dict[str, RuntimeConstants] = {
    # torch as `edgefl-device train` runs it. baseline_bytes: RSS right after `import torch` in a fresh process
    # (bench/memory_model.py: torch_import_rss_bytes). Workspace terms as above, fitted on 316 peaks
    # (bench/memory_model.py): 274 bare training loops of every zoo model (no device runtime, no evaluation) and
    # the 42 device processes of bench/artifact_memory.py (exported torch sets of resnet20, cnn, transformer,
    # vgg11bn, densenet40, vit with frozen prefixes 0, L/2, L-1 x head widths 0.25/0.5/1). The fixed term covers
    # the loops; device_bytes and the weight copies are what a device process adds (it loads the artifact:
    # weight copies; it evaluates: fixed bytes). Refitted on the device rows as they are since the upload holds
    # one copy: measured/predicted 0.92-0.98 in sample (device rows 0.92-0.98); held out (a family priced with the
    # others' terms: the generic fixed term is the largest F + D of any family and its device bytes 0, as how a new
    # family's total splits between loop and device process is not known), loops and device rows: cnn 0.87-0.95,
    # densenet40 0.90-0.96, resnet 0.87-0.96, transformer 0.86-0.98, vgg11bn 0.87-0.96, vit 0.88-0.94. Under glibc's
    # default dynamic mmap threshold the heap fragments and peaks grow up to ~2x: see bench/results/memory_model.json,
    # allocator.
    "torch": RuntimeConstants(
        baseline_bytes=228_560_896, workspace_fixed_bytes=144_457_451, workspace_factor=1.11,
        source="measured import RSS; workspace an upper bound per family on measured peaks",
        prefix_batch=0, trained_weight_copies=2.0, frozen_weight_copies=0.1, device_bytes=0,
        families=(FamilyTerms("cnn", workspace_fixed_bytes=110_886_589, workspace_factor=0.04,
                              trained_weight_copies=0.2, frozen_weight_copies=0.0, device_bytes=23_901_314),
                  FamilyTerms("densenet40", workspace_fixed_bytes=131_460_664, workspace_factor=1.1,
                              trained_weight_copies=0.0, frozen_weight_copies=0.0, device_bytes=5_608_410),
                  FamilyTerms("resnet", workspace_fixed_bytes=114_100_401, workspace_factor=1.1,
                              trained_weight_copies=0.0, frozen_weight_copies=0.0, device_bytes=24_285_768),
                  FamilyTerms("transformer", workspace_fixed_bytes=112_824_104, workspace_factor=1.11,
                              trained_weight_copies=2.0, frozen_weight_copies=0.0, device_bytes=26_072_374),
                  FamilyTerms("vgg11bn", workspace_fixed_bytes=117_063_119, workspace_factor=0.27,
                              trained_weight_copies=0.5, frozen_weight_copies=0.1, device_bytes=27_394_332),
                  FamilyTerms("vit", workspace_fixed_bytes=106_409_103, workspace_factor=1.1,
                              trained_weight_copies=1.0, frozen_weight_copies=0.0, device_bytes=23_767_566),)),
    # onnxruntime-training-cpu 1.19.2 on a device (numpy, the torch-free shim; no torch, no onnx; the CPU arena
    # and buffer reuse off; the prefix's weights as external data). baseline_bytes: RSS of a fresh process after
    # importing it and opening one session (bench/artifact_memory.py: ort_baseline_bytes). Workspace terms as
    # above, a family's own with hidden_bytes, the weight copies at most 1 each (bench/artifact_memory.py:
    # GRID_COPIES). On 42 peaks of exported sets (resnet20, cnn, transformer, vgg11bn, densenet40, vit; frozen 0,
    # L/2, L-1 x head widths 0.25/0.5/1): measured/predicted 0.94-0.98 (cnn 0.96-0.98, densenet40 0.97-0.98,
    # resnet 0.97-0.98, transformer 0.95-0.98, vgg11bn 0.94-0.98, vit 0.98). The families' workspace factors are
    # 0.92-1.12: without buffer reuse ORT's training graph holds what torch autograd's accounting (the step
    # peak) says it holds; with it they were 1.06-1.61 (bench/results/ort_mem_reuse.json). As they agree, a family
    # never measured gets one fit over all 42 peaks, its weight copies at their ceiling (1 each) and a margin of
    # 3%: the least under which, leaving each family out, the fit on the others bounded it. Held out (fitted on the
    # other five, checked on the sixth): cnn 0.824-0.938, densenet40 0.775-0.910, resnet 0.880-0.953, transformer
    # 0.821-0.952, vgg11bn 0.797-0.954, vit 0.880-0.922; each term the largest of the families' own fits gave
    # 0.702-0.929 (its factor the CNN's, 1.47: its 6-15 MiB step peaks leave its factor and fixed term free to trade).
    # prefix_batch: the ORT trainer runs the frozen prefix 4 samples at a time
    # (edgefl.device_runtime.trainers.ort_trainer).
    "ort": RuntimeConstants(
        baseline_bytes=52_015_104, workspace_fixed_bytes=20_560_295, workspace_factor=1.29,
        source="measured import + session RSS; workspace an upper bound per family on measured peaks",
        prefix_batch=4, trained_weight_copies=1.0, frozen_weight_copies=1.0,
        families=(FamilyTerms("cnn", workspace_fixed_bytes=13_603_060, workspace_factor=0.92,
                              trained_weight_copies=0.9, frozen_weight_copies=0.0, hidden_bytes=6_177_444),
                  FamilyTerms("densenet40", workspace_fixed_bytes=18_317_501, workspace_factor=1.04,
                              trained_weight_copies=0.8, frozen_weight_copies=0.6, hidden_bytes=5_600_778),
                  FamilyTerms("resnet", workspace_fixed_bytes=15_198_618, workspace_factor=1.08,
                              trained_weight_copies=0.0, frozen_weight_copies=0.2, hidden_bytes=6_117_575),
                  FamilyTerms("transformer", workspace_fixed_bytes=27_233_867, workspace_factor=1.02,
                              trained_weight_copies=0.0, frozen_weight_copies=0.1, hidden_bytes=32_175_383),
                  FamilyTerms("vgg11bn", workspace_fixed_bytes=22_699_029, workspace_factor=1.06,
                              trained_weight_copies=0.2, frozen_weight_copies=0.2, hidden_bytes=2_937_248),
                  FamilyTerms("vit", workspace_fixed_bytes=21_910_656, workspace_factor=1.12,
                              trained_weight_copies=0.0, frozen_weight_copies=0.0, hidden_bytes=5_499_432),)),
    # executorch 1.5.1 as devices run it: the native trainer (edgefl-et-train: C++, no Python, no torch).
    # baseline_bytes: peak RSS of a fresh `edgefl-et-train --version` under GNU time, its libraries loaded and
    # kernels registered, no program (bench/artifact_memory.py: executorch_baseline). Workspace terms as above, a
    # family's own with hidden_bytes, the weight copies at most 1 each as ORT's, and a family's workspace factor at
    # least the least planned arena over step peak of its programs (bench/artifact_memory.py: arena_floors): the
    # whole memory plan is allocated at load and grows with the activations, where ResNet-20's rows alone would
    # fit a factor of 0 and a prediction blind to the batch. On 35 peaks of exported sets (refitted after
    # edgefl::batch_norm, one fused kernel each way instead of BN written out, on re-measured ResNet-20 and VGG-11
    # rows): measured/predicted 0.91-0.98 (cnn 0.94-0.96, resnet 0.93-0.97, transformer 0.92-0.98, vgg11bn
    # 0.91-0.98, vit 0.91-0.98); held out: cnn 0.71-0.80, resnet 0.67-0.81, transformer 0.83-1.05 (the other
    # families' terms under-predict one transformer peak by 5%: a family never measured gets each term the
    # largest of theirs, which covers it), vgg11bn 0.66-0.99, vit 0.69-0.89. A peak is in training on 33 of the
    # 35 sets (each report has each phase's peak): the loaded process + 3-7 MiB (kernel code, the optimizer's
    # state, a convolution's per-sample patch matrix: hidden_bytes). On two head-only sets (the CNN's and
    # VGG-11's, 6.3 and 35 MiB frozen) it is at load, where XNNPACK packs the prefix's weights while the
    # program's copy is alive (bench/artifact_memory.py: executorch_phases). Most of a peak is the suffix
    # program's memory-planned arena, the step's live bytes: ResNet-20's is 0.95-1.06x the cost model's step
    # peak (executorch_arena), the CNN's and VGG-11's 0.2-1.9x, the transformer's and the ViT's 1.3-1.5x: what
    # the families' workspace factors and fixed terms absorb.
    # prefix_batch 1: the native trainer runs the frozen prefix one sample at a time. The Python ExecuTorch
    # trainer (--trainer python, imports torch) peaks at 368-430 MiB on the same sets: these constants do not
    # cover it.
    "executorch": RuntimeConstants(
        baseline_bytes=5_324_800, workspace_fixed_bytes=7_692_013, workspace_factor=1.55,
        source="measured native trainer RSS; workspace an upper bound per family on measured native peaks",
        prefix_batch=1, trained_weight_copies=1.0, frozen_weight_copies=1.0,
        families=(FamilyTerms("cnn", workspace_fixed_bytes=7_502_050, workspace_factor=0.99,
                              trained_weight_copies=0.0, frozen_weight_copies=0.1, hidden_bytes=189_963),
                  FamilyTerms("resnet", workspace_fixed_bytes=5_420_809, workspace_factor=0.98,
                              trained_weight_copies=0.0, frozen_weight_copies=1.0, hidden_bytes=2_395_751),
                  FamilyTerms("transformer", workspace_fixed_bytes=4_627_533, workspace_factor=1.51,
                              trained_weight_copies=0.0, frozen_weight_copies=0.0, hidden_bytes=14_009_851),
                  FamilyTerms("vgg11bn", workspace_fixed_bytes=1_279_629, workspace_factor=1.21,
                              trained_weight_copies=0.0, frozen_weight_copies=1.0, hidden_bytes=804_462),
                  FamilyTerms("vit", workspace_fixed_bytes=0, workspace_factor=1.41,
                              trained_weight_copies=1.0, frozen_weight_copies=0.8, hidden_bytes=3_053_828),)),
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
            # a family is a JSON object of FamilyTerms' fields (calibration/3) or a list of them in order (/2)
            merged["families"] = tuple(FamilyTerms(**f) if isinstance(f, dict) else FamilyTerms(*f)
                                       for f in merged["families"])
            constants[runtime] = RuntimeConstants(**merged)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a calibration file ({exc}); regenerate it with 'edgefl calibrate'") from None
    return constants
