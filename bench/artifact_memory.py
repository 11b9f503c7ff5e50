"""What an exported artifact set costs a device: peak RSS, step time, bytes, vs the cost model.

    .venv/bin/python bench/artifact_memory.py [--backends ort,torch,executorch]
                                              [--models resnet20,cnn,transformer,vgg11bn,densenet40,vit]
                                              [--configs K:S,...] [--steps 20] [--context 256]
                                              [--eval-examples N] [--no-fit]

For each model (zoo defaults: ResNet-20, VGG-11-BN, DenseNet-40 and the ViT on 3x32x32, the CNN on 1x28x28,
the transformer LM) and each backend whose export module and trainer exist, over a grid of frozen prefix K x
head width S (SLT-style: head_start = K + 1; all-but-head has no hidden layer left to narrow): export the
set, then train it `--steps` steps at batch 32 in a fresh device process exactly as a device runs it
(`edgefl-device train --format json`: glibc's mmap threshold fixed at 128 KiB, one thread, torch blocked
for ORT, data read a batch at a time, and its default evaluation before and after training on the first 256
examples: the evaluation and the first step are part of the peak a device sees; `--eval-examples 0`
measures training alone) on 256 random examples, and record its peak RSS (VmHWM), step time, the artifact
bytes (suffix + prefix), the upload bytes, the cost model's predicted peak and each phase's own peak (load,
train, upload: `phase_peak_rss_bytes`, where the device's report has it). Grid: K in {0, middle,
all-but-head} x S in {0.25, 0.5, 1} (GRID: the CNN's 4 layers: K in {0, 1, 3}).

ExecuTorch: the row is the native trainer (`edgefl-et-train`, the default path of `edgefl-device train`);
for the goal models (ResNet-20 and the CNN: GOAL_MODELS) also, on the same set in the same run, the Python
ExecuTorch trainer (`--trainer python`, which imports torch), and the analytic floor (weights trained +
frozen, gradients, optimizer state, kept activations and one input batch: edgefl.cost.model's Cost fields),
`native_over_floor_plus_16MiB` = native peak / (1.3 floor + 16 MiB) (goal <= 1) and `native_over_python`
(goal <= 0.25). Every ExecuTorch row has the programs' memory-planned arena. A full ResNet-20 suffix export
takes about two minutes in ExecuTorch's toolchain: the whole run takes about two hours on 2 cores.

Constants (edgefl/cost/constants.py) fitted here for ort and executorch (edgefl.cost.upper_bound, "a plan is a
promise"): `baseline_bytes` measured (ort: RSS of a fresh process importing onnxruntime through the
torch-free shim and opening one session; executorch: the peak RSS of a fresh `edgefl-et-train --version`
under GNU time, its libraries loaded and kernels registered, no program); the workspace factor, the
per-byte weight copies (trained, frozen; at most 1 each: GRID_COPIES) and the fixed term fitted as an upper
bound: every row predicts >= measured + max(2% of it, 1 MiB), with the smallest measured / predicted as large
as the grid allows. Then
leave-one-family-out: fitted on the other model families' rows, checked on the held-out family's. torch rows
are reported under the constants in force: bench/memory_model.py fits torch on them and its own peaks.

Writes bench/results/artifact_memory.json, merged: rows and headline keys of backends this run did not
measure are kept, and `runs` says which run measured which backends. Headlines:
`ort_all_but_head_over_full_resnet20`, per runtime the fitted constants (`<runtime>_constants`), the fit's
measured/predicted band (`<runtime>_fit`) and `<runtime>_leave_one_family_out`; `executorch_goals`;
`executorch_phases`: per family, in which phase (load, train, upload) the peaks are, and each phase's peak over
the loaded process.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefl.cost import upper_bound  # noqa: E402
from edgefl.cost.constants import DEFAULTS, RuntimeConstants, family  # noqa: E402
from edgefl.cost.model import Cost, cost, step_peak_bytes  # noqa: E402
from edgefl.cost.profile_store import ProfileStore  # noqa: E402
from edgefl.cost.upper_bound import FITTED, MARGIN_BYTES, MARGIN_FRACTION, grid  # noqa: E402
from edgefl.trainconfig import TrainConfig  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402

MiB = 2**20
BATCH = 32
WIDTHS = (0.25, 0.5, 1.0)
MODELS = "resnet20,cnn,transformer,vgg11bn,densenet40,vit"
EVAL_EXAMPLES = 256      # examples in the data file: `edgefl-device train`'s default evaluation runs on all of them
# frozen prefix:head width grids where a model's default (K in {0, L//2, L-1}) is not the one measured: the CNN
# (4 layers) trained from the input, after its first conv and all-but-head
GRID = {"cnn": "0:1,0:0.5,0:0.25,1:1,1:0.5,1:0.25,3:1"}
GOAL_MODELS = ("resnet20", "cnn")     # issue goals for the native ExecuTorch trainer, measured against Python
# fitting grids per runtime: the workspace factor (ExecuTorch's arenas hold im2col chunks, several times the
# live-bytes peak on small sets), bytes per trained and per frozen weight byte. The weight copies stop at what a
# device holds at once beyond the floor (weights, gradients, optimizer state): one more trained copy (ORT's gradient
# accumulation buffer; the upload buffer is built after the steps, when activations are gone) and one packed copy
# of the frozen weights. Beyond that a copies term explains nothing physical: a family whose weights are a few MiB
# (transformer, vit) leaves it free, its fit then uses it for workspace, and the generic rule (each term the
# largest any family needed) charged that on VGG-11's 35 MiB: held out 0.53 with copies up to 4 and 3, 0.79 now
MAX_FACTOR = {"ort": 4.0, "executorch": 6.0}
GRID_COPIES = grid(1.0, 0.1)
TRAINED_COPIES, FROZEN_COPIES = GRID_COPIES, GRID_COPIES
# what a model of an unmeasured family gets (edgefl.cost.upper_bound.fit_families): ORT's families share one shape (without
# buffer reuse its graph holds what the step peak says; their own workspace factors 0.92-1.12), so one fit over all
# of them speaks for a new one; ExecuTorch's memory planner gives each family its own (arena over step peak 0.2-2.7;
# factors 1.12-1.52), where one fit over the others under-priced a held-out ResNet: each term the largest
JOINT_GENERIC = {"ort": True, "executorch": False}
FLOOR_SLACK, FLOOR_FIXED = 1.3, 16 * MiB       # native_over_floor_plus_16MiB = peak / (1.3 floor + 16 MiB)
GOALS = {"native_over_floor_plus_16MiB": 1.0, "native_over_python": 0.25}


def built(backend: str) -> bool:
    """Its export module, its trainer and their runtime are installed (the ExecuTorch pair joins by existing)."""
    import importlib.util

    from edgefl.device_runtime.trainers.base import trainer_modules
    from edgefl.export.backends import backend_modules
    return all(importlib.util.find_spec(m) is not None
               for m in (*backend_modules(backend), trainer_modules(backend)[0]))


def configs(L: int, pairs_text: str | None = None) -> list[TrainConfig]:
    """`pairs_text` "K:S,...", else K in {0, L//2, L-1} x WIDTHS (width 1 only for all-but-head)."""
    if pairs_text:
        pairs = [(int(k), float(s)) for k, s in (p.split(":") for p in pairs_text.split(","))]
    else:
        pairs = [(k, s) for k in (0, L // 2, L - 1) for s in (WIDTHS if k + 1 < L else (1.0,))]
    return [TrainConfig(num_layers=L, frozen_prefix=k, head_start=None if s == 1 else k + 1, head_width=s,
                        batch_size=BATCH) for k, s in pairs]


def write_data(ref: ModelRef, folder: Path, seed: int = 0) -> Path:
    import numpy as np

    from edgefl.zoo import build
    model = build(ref)
    rng = np.random.default_rng(seed)
    n = EVAL_EXAMPLES
    if ref.name == "transformer":
        x = rng.integers(0, model.num_classes, (n, *model.input_shape))
        y = rng.integers(0, model.num_classes, (n, model.input_shape[0]))    # (N, T): an LM's targets
    else:
        x = rng.standard_normal((n, *model.input_shape)).astype(np.float32)
        y = rng.integers(0, model.num_classes, n)
    path = folder / f"{ref.name}.npz"
    np.savez(path, x=x, y=y)
    return path


def ort_baseline(folder: Path) -> int:
    """RSS of a fresh device process (fixed allocator, torch blocked) after importing onnxruntime through
    the shim and opening one (trivial) session: what every ORT training process holds before any model."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, folder / "probe.onnx")
    code = ("import sys; sys.modules['torch'] = None\n"
            "from edgefl.device_runtime.ort_shim import training_api\n"
            "from edgefl.device_runtime.trainers.ort_trainer import session_options\n"
            "training_api(); import onnxruntime\n"
            f"s = onnxruntime.InferenceSession({str(folder / 'probe.onnx')!r}, session_options(1))\n"
            "print([int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0])")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    runs = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env=env).stdout) for _ in range(3)]
    return int(statistics.median(runs))


def native_baseline(binary: Path) -> int | None:
    """Peak RSS of a fresh `edgefl-et-train --version` (fixed allocator): the runtime libraries loaded and
    their kernels registered (static initialisers run before main), no program: what every native training
    process holds before any model. Measured by GNU time, whose fork of a small process keeps the count
    clean: the rusage of a child that Python spawns (vfork) starts at Python's own RSS. None without it."""
    import shutil
    if shutil.which("time") is None or not Path("/usr/bin/time").is_file():
        return None
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    runs = []
    for _ in range(3):
        r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(binary), "--version"], capture_output=True,
                           text=True, env=env, check=True)
        runs.append(1024 * int(r.stderr.strip().splitlines()[-1].removeprefix("maxrss_kb=")))
    return int(statistics.median(runs))


def train_on_device(folder: Path, data: Path, steps: int, trainer: str = "auto", eval_examples: int | None = None) -> dict:
    """`edgefl-device train` in a fresh process; `eval_examples` None: its default evaluation (before and after
    training, part of the peak a device sees), as devices run it."""
    evaluation = [] if eval_examples is None else ["--eval-examples", str(eval_examples)]
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "train", "--artifacts", str(folder),
                        "--data", str(data), "--steps", str(steps), *evaluation, "--format", "json",
                        "--trainer", trainer], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return json.loads(r.stdout)


def row_cost(store: ProfileStore, ref: ModelRef, config: TrainConfig, runtime: str,
             constants: RuntimeConstants) -> Cost:
    widths = None if config.head_width == 1 else config.widths
    return cost(store.profile(ref, widths), config, runtime, constants=constants)


def predicted_peak(store: ProfileStore, ref: ModelRef, config: TrainConfig, runtime: str,
                   constants: RuntimeConstants) -> int:
    return row_cost(store, ref, config, runtime, constants).peak_memory_bytes


def floor(store: ProfileStore, ref: ModelRef, config: TrainConfig) -> dict:
    """The analytic floor of a training step: what must be in memory whatever the runtime (bytes); and the
    cost model's live-bytes peak of the step (what workspace_factor scales)."""
    c = row_cost(store, ref, config, "executorch", DEFAULTS["executorch"])
    parts = {"weights_trained": c.weights_trained_bytes, "weights_frozen": c.weights_frozen_bytes,
             "gradients": c.gradient_bytes, "optimizer": c.optimizer_bytes, "activations": c.activation_bytes,
             "input_batch": config.batch_size * store.full(ref).input_bytes}
    widths = None if config.head_width == 1 else config.widths
    return {"floor_bytes": sum(parts.values()), "floor_parts": parts,
            "step_peak_bytes": step_peak_bytes(store.profile(ref, widths), config)}


def planned_arena(folder: Path) -> int | None:
    """Bytes of the memory-planned buffers of the set's programs (prefix and suffix `forward`): what the
    runtime allocates at load for every intermediate tensor of a step (None: not readable here)."""
    try:
        from executorch.exir._serialize._program import deserialize_pte_binary
        total = 0
        for pte in folder.rglob("*.pte"):
            program = deserialize_pte_binary(pte.read_bytes())
            plans = getattr(program, "program", program).execution_plan
            total += sum(sum(p.non_const_buffer_sizes) for p in plans if p.name == "forward")
        return total
    except Exception:       # a private API of executorch: the row stands without it
        return None


def row_terms(rows: list[dict], store: ProfileStore, runtime: str, step_of=None) -> list:
    """Each row's PeakTerms; `step_of(row)`, where given, replaces the cost model's step peak (bench/
    ort_graph_memory.py: the runtime's own graph's)."""
    terms = [row_cost(store, ModelRef.from_json(r["ref"]), TrainConfig.from_json(r["config"]), runtime,
                      DEFAULTS[runtime]).terms for r in rows]
    return terms if step_of is None else [replace(t, step_peak_bytes=step_of(r)) for r, t in zip(rows, terms)]


def fit_families(rows: list[dict], store: ProfileStore, baseline: int, runtime: str,
                 exclude: str | None = None, step_of=None) -> RuntimeConstants:
    """`runtime`'s constants fitted on `rows` (edgefl.cost.upper_bound.fit_families); `exclude`: leave that family's
    rows out; `step_of` as for `row_terms`."""
    peaks = {}
    for name in sorted({family(r["model"]) for r in rows} - {exclude}):
        mine = [r for r in rows if family(r["model"]) == name]
        peaks[name] = (row_terms(mine, store, runtime, step_of), [r["peak_rss_bytes"] for r in mine])
    return upper_bound.fit_families(peaks, replace(DEFAULTS[runtime], baseline_bytes=baseline),
                                    factors=grid(MAX_FACTOR[runtime], 0.01), trained_copies=TRAINED_COPIES,
                                    frozen_copies=FROZEN_COPIES, learn_hidden=True, joint=JOINT_GENERIC[runtime],
                                    factor_floors=arena_floors(rows, store, runtime, exclude))


def arena_floors(rows: list[dict], store: ProfileStore, runtime: str, exclude: str | None = None) -> dict[str, float]:
    """Per family the least planned arena over step peak of its programs, rounded down to the factor grid:
    ExecuTorch allocates a program's whole memory plan at load, and the plan grows with the activations, so a
    family's workspace factor is no smaller (ResNet-20's rows would otherwise fit a factor of 0 and hidden-layer
    bytes, a prediction that does not grow with the batch). Runtimes without a memory plan: none."""
    planned = [r for r in rows if r.get("planned_arena_bytes") and family(r["model"]) != exclude]
    floors: dict[str, float] = {}
    for r, t in zip(planned, row_terms(planned, store, runtime)):
        ratio = int(100 * r["planned_arena_bytes"] / t.step_peak_bytes) / 100
        floors[family(r["model"])] = min(ratio, floors.get(family(r["model"]), ratio))
    return floors


def predict_rows(rows: list[dict], store: ProfileStore, runtime: str, k: RuntimeConstants, step_of=None) -> list[int]:
    return [t.peak(k.for_model(r["model"])) for r, t in zip(rows, row_terms(rows, store, runtime, step_of))]


def measure(backend: str, ref: ModelRef, config: TrainConfig, state: dict, data: Path, folder: Path,
            steps: int, store: ProfileStore, eval_examples: int | None = None) -> dict:
    """One set exported and trained; ExecuTorch: natively, then by the Python trainer on the same set."""
    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import export_set

    row = {"model": ref.name, "ref": ref.to_json(), "backend": backend, "frozen_prefix": config.frozen_prefix,
           "head_width": config.head_width, "config": config.to_json(), "batch_size": BATCH}
    t0 = time.time()
    a = export_set(ref, config, state, get_backend(backend), folder)
    row["export_seconds"] = round(time.time() - t0, 2)
    row["artifact_bytes"] = a.suffix.artifact_bytes + (a.prefix.artifact_bytes if a.prefix else 0)
    row["upload_bytes"] = a.suffix.upload_bytes
    report = train_on_device(folder, data, steps, eval_examples=eval_examples)
    row["eval_examples"] = EVAL_EXAMPLES if eval_examples is None else eval_examples
    row.update({k: report[k] for k in ("peak_rss_bytes", "loaded_rss_bytes", "step_seconds", "trained_tensor_bytes",
                                       "first_step_loss", "last_step_loss")})
    row["phase_peak_rss_bytes"] = report.get("phase_peak_rss_bytes")      # load, train, upload: where the peak is
    row["predicted_peak_bytes"] = predicted_peak(store, ref, config, backend, DEFAULTS[backend])
    row["error_before_fit"] = (row["predicted_peak_bytes"] - row["peak_rss_bytes"]) / row["peak_rss_bytes"]
    if backend != "executorch":
        return row
    row["trainer"] = report.get("trainer")
    row["planned_arena_bytes"] = planned_arena(folder)
    if ref.name not in GOAL_MODELS:
        return row
    python = train_on_device(folder, data, steps, trainer="python", eval_examples=eval_examples)
    row.update({f"python_{k}": python[k] for k in ("peak_rss_bytes", "loaded_rss_bytes", "step_seconds",
                                                   "first_step_loss", "last_step_loss")})
    row["python_error_before_fit"] = (row["predicted_peak_bytes"] - python["peak_rss_bytes"]) / python["peak_rss_bytes"]
    row["native_over_python"] = row["peak_rss_bytes"] / python["peak_rss_bytes"]
    row.update(floor(store, ref, config))
    row["native_over_floor_plus_16MiB"] = row["peak_rss_bytes"] / (FLOOR_SLACK * row["floor_bytes"] + FLOOR_FIXED)
    return row


def executorch_summary(rows: list[dict], store: ProfileStore, baseline: int, binary: Path, fitting: bool) -> dict:
    """Goals, the baseline and its alternative, the upper-bound fit, and the fit on one family checked on the
    other; adds the fitted prediction to every row."""
    goal_rows = [r for r in rows if r["model"] in GOAL_MODELS]
    out = {"executorch_goals": {
        goal: {"limit": limit, "worst": max(r[goal] for r in goal_rows), "holds": all(r[goal] <= limit for r in goal_rows),
               "rows": len(goal_rows)}
        for goal, limit in GOALS.items()}} if goal_rows else {}
    smallest = min(goal_rows or rows, key=lambda r: r["peak_rss_bytes"])
    parts = floor(store, ModelRef.from_json(smallest["ref"]), TrainConfig.from_json(smallest["config"]))["floor_parts"]
    alternative = smallest["loaded_rss_bytes"] - parts["weights_trained"] - parts["weights_frozen"]
    how = f"peak RSS of a fresh '{binary.name} --version' under GNU time (median of 3)"
    if baseline is None:
        baseline, how = alternative, "no GNU time here: the smallest set's loaded RSS less its weights"
    out["executorch_baseline"] = {
        "baseline_bytes": baseline, "how": how, "smallest_set_loaded_minus_weights_bytes": alternative,
        "smallest_set": f"{smallest['model']} k={smallest['frozen_prefix']} s={smallest['head_width']:g}",
        "native_trainer_build": next((p for p in binary.parts if p.startswith("linux-")), str(binary))}
    if fitting:
        out.update(upper_bound_summary("executorch", rows, store, baseline))
    if arena := arena_summary(rows, store, baseline):
        out["executorch_arena"] = arena
    if phases := phase_summary(rows):
        out["executorch_phases"] = phases
    return out


def phase_summary(rows: list[dict]) -> dict:
    """Where a device's peak is, per family, from the rows whose report has each phase's peak: how many rows
    peak in each phase, and each phase's peak over the loaded process (what loading leaves resident) in bytes.
    Loading the prefix can hold its weights twice for a moment (XNNPACK packs a copy while the program's own is
    alive); training adds the kernels' code pages and the optimizer's state."""
    measured = [r for r in rows if r.get("phase_peak_rss_bytes")]
    out = {}
    for name in sorted({family(r["model"]) for r in measured}):
        mine = [r for r in measured if family(r["model"]) == name]
        peaks_in = [max(r["phase_peak_rss_bytes"], key=r["phase_peak_rss_bytes"].get) for r in mine]
        over = {phase: [r["phase_peak_rss_bytes"][phase] - r["loaded_rss_bytes"] for r in mine
                        if phase in r["phase_peak_rss_bytes"]] for phase in ("load", "train", "upload")}
        out[name] = {"rows": len(mine), "peak_in": {p: peaks_in.count(p) for p in sorted(set(peaks_in))},
                     **{f"{phase}_over_loaded_bytes": [min(v), max(v)] for phase, v in over.items() if v}}
    return out


def arena_summary(rows: list[dict], store: ProfileStore, baseline: int) -> dict:
    """Where ExecuTorch's memory goes, per family: its programs' planned arena over the cost model's step peak
    (the spread of the fitted workspace factors), and what a peak holds beyond the baseline, the arena and the
    artifact's bytes (what no memory plan shows). Adds both to every row with a readable arena."""
    planned = [r for r in rows if r.get("planned_arena_bytes")]
    for r, t in zip(planned, row_terms(planned, store, "executorch")):
        r["planned_arena_over_step_peak"] = r["planned_arena_bytes"] / t.step_peak_bytes
        r["peak_beyond_baseline_arena_artifact_bytes"] = (r["peak_rss_bytes"] - baseline - r["planned_arena_bytes"]
                                                          - r["artifact_bytes"])
    out = {}
    for name in sorted({family(r["model"]) for r in planned}):
        mine = [r for r in planned if family(r["model"]) == name]
        out[name] = {key: [min(r[key] for r in mine), max(r[key] for r in mine)]
                     for key in ("planned_arena_over_step_peak", "peak_beyond_baseline_arena_artifact_bytes")}
    return out


def upper_bound_summary(runtime: str, rows: list[dict], store: ProfileStore, baseline: int) -> dict:
    """The upper-bound fit of `runtime`'s constants on its rows, per measured family and over all of them
    (each row gets its prediction and measured/predicted under its family's constants) and, leaving each
    family out in turn, the generic fit on the others checked on it: what a model of an unmeasured family
    gets."""
    fitted = fit_families(rows, store, baseline, runtime)
    generic = replace(fitted, families=())
    for r, q, g in zip(rows, predict_rows(rows, store, runtime, fitted), predict_rows(rows, store, runtime, generic)):
        r["predicted_peak_bytes_fitted"] = q
        r["measured_over_predicted"] = r["peak_rss_bytes"] / q
        r["measured_over_predicted_generic"] = r["peak_rss_bytes"] / g
        r["error_after_fit"] = (q - r["peak_rss_bytes"]) / r["peak_rss_bytes"]

    def band(rs, key="measured_over_predicted"):
        got = [r[key] for r in rs]
        return {"rows": len(rs), "measured_over_predicted_min": min(got), "measured_over_predicted_max": max(got)}

    families = sorted({family(r["model"]) for r in rows})
    out = {f"{runtime}_constants": asdict(fitted),
           f"{runtime}_fit": {**band(rows), "margin": f"max({MARGIN_FRACTION:.0%} of the peak, {MARGIN_BYTES} B)",
                              "worst_peak_error_before_fit": max(abs(r["error_before_fit"]) for r in rows),
                              "generic": band(rows, "measured_over_predicted_generic"),
                              "per_family": {f: band([r for r in rows if family(r["model"]) == f]) for f in families}}}
    if len(families) > 1:   # out of sample: what a model of an unmeasured family gets, checked on a held-out one
        out[f"{runtime}_leave_one_family_out"] = leave_one_family_out(rows, store, baseline, runtime)
    return out


def leave_one_family_out(rows: list[dict], store: ProfileStore, baseline: int, runtime: str, step_of=None) -> dict:
    """Per family: the generic constants fitted on the others' rows, and measured/predicted on its own under them
    (`step_of` as for `row_terms`)."""
    families = sorted({family(r["model"]) for r in rows})
    cross = {}
    for name in families:
        k = replace(fit_families(rows, store, baseline, runtime, exclude=name, step_of=step_of), families=())
        held = [r for r in rows if family(r["model"]) == name]
        got = [r["peak_rss_bytes"] / q for r, q in zip(held, predict_rows(held, store, runtime, k, step_of))]
        cross[f"held_out_{name}"] = {"fit_on": sorted(set(families) - {name}),
                                     "constants": {f: getattr(k, f) for f in FITTED},
                                     "measured_over_predicted_max": max(got),
                                     "measured_over_predicted_min": min(got)}
    return cross


def row_key(r: dict) -> tuple:
    return r["backend"], r["model"], json.dumps(r["config"], sort_keys=True)


def merge_rows(path: Path, rows: list[dict], run: dict) -> tuple[list[dict], list[dict], dict]:
    """The file's rows with this run's in place of the same (backend, model, config), its runs plus this one,
    and the file's other keys."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    mine = {row_key(r) for r in rows}
    kept = [r for r in old.get("rows", []) if row_key(r) not in mine]
    return kept + rows, old.get("runs", []) + [run], old


def summaries(rows: list[dict], backends: list[str], store: ProfileStore, baselines: dict, binary,
              fitting: bool) -> dict:
    """Headline keys of `backends` from every row of theirs (module doc)."""
    out = {}
    ok = [r for r in rows if "error" not in r]
    full = next((r for r in ok if r["model"] == "resnet20" and r["backend"] == "ort" and r["frozen_prefix"] == 0
                 and r["head_width"] == 1), None)
    head = next((r for r in ok if r["model"] == "resnet20" and r["backend"] == "ort"
                 and r["frozen_prefix"] == TrainConfig.from_json(r["config"]).num_layers - 1), None)
    ort_rows = [r for r in ok if r["backend"] == "ort"]
    if "ort" in backends and ort_rows:
        if full and head:
            out["ort_all_but_head_over_full_resnet20"] = head["peak_rss_bytes"] / full["peak_rss_bytes"]
        out["ort_baseline_bytes"] = baselines["ort"]
        if fitting:
            out.update(upper_bound_summary("ort", ort_rows, store, baselines["ort"]))
    torch_rows = [r for r in ok if r["backend"] == "torch"]
    if "torch" in backends and torch_rows:      # fitted by bench/memory_model.py, on these rows and its own
        # under the constants edgefl has now (a refit after memory_model.py wrote new ones)
        for r, q in zip(torch_rows, predict_rows(torch_rows, store, "torch", DEFAULTS["torch"])):
            r["predicted_peak_bytes_fitted"] = q
            r["measured_over_predicted"] = r["peak_rss_bytes"] / q
        ratios = [r["measured_over_predicted"] for r in torch_rows]
        out["torch_under_constants"] = {"rows": len(torch_rows), "measured_over_predicted_min": min(ratios),
                                        "measured_over_predicted_max": max(ratios)}
    et_rows = [r for r in ok if r["backend"] == "executorch"]
    if "executorch" in backends and et_rows:
        out.update(executorch_summary(et_rows, store, baselines["executorch"], binary, fitting))
    return out


HEADLINES = ("ort_all_but_head_over_full_resnet20", "ort_baseline_bytes", "ort_constants", "ort_fit",
             "ort_leave_one_family_out", "torch_under_constants", "executorch_goals", "executorch_baseline",
             "executorch_constants", "executorch_fit", "executorch_leave_one_family_out", "executorch_arena",
             "executorch_phases")


def refit(path: Path, backends: list[str]) -> int:
    """The summaries again from the file's rows and measured baselines, nothing measured."""
    data = json.loads(path.read_text())
    baselines = {"ort": data.get("ort_baseline_bytes"),
                 "executorch": (data.get("executorch_baseline") or {}).get("baseline_bytes")}
    binary = Path((data.get("executorch_baseline") or {}).get("native_trainer_build", "edgefl-et-train"))
    backends = [b for b in backends if b == "torch" or baselines.get(b) is not None]
    data.update(summaries(data["rows"], backends, ProfileStore(persist=False), baselines, binary, True))
    path.write_text(json.dumps(data, indent=1) + "\n")
    for key in HEADLINES:
        if key in data and key.split("_")[0] in backends:
            print(f"{key}: {data[key]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="ort,torch,executorch")
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--configs", help="frozen prefix:head width pairs for every model, e.g. 0:1,19:1 (default: "
                                      "each backend's grid)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-examples", type=int, help="passed to edgefl-device train (default: its own, "
                                                          f"{EVAL_EXAMPLES}, on the data's {EVAL_EXAMPLES} examples)")
    ap.add_argument("--context", type=int, help="transformer context (default: the zoo's)")
    ap.add_argument("--no-fit", action="store_true", help="do not fit the runtimes' constants")
    ap.add_argument("--refit", action="store_true", help="no measuring: the summaries again from --output's rows")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "artifact_memory.json")
    args = ap.parse_args(argv)
    if args.refit:
        return refit(args.output, args.backends.split(","))

    import torch

    from edgefl.export.backends import get_backend
    from edgefl.zoo import build

    torch.set_num_threads(1)
    started = time.time()
    backends = [b for b in args.backends.split(",") if built(b)]
    missing = sorted(set(args.backends.split(",")) - set(backends))
    store = ProfileStore(persist=False)
    binary = None
    if "executorch" in backends:
        from edgefl.device_runtime import native
        # the trainer `edgefl-device train` runs (built once per source hash), pinned for the whole run: a
        # source edit meanwhile would otherwise leave the devices without a built trainer
        binary = Path(os.environ["EDGEFL_ET_TRAIN"]) if os.environ.get("EDGEFL_ET_TRAIN") else native.build()
        os.environ["EDGEFL_ET_TRAIN"] = str(binary)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefl-artifact-memory-") as tmp:
        tmp = Path(tmp)
        baseline = {"ort": ort_baseline(tmp) if "ort" in backends else None,
                    "executorch": native_baseline(binary) if binary else None}
        for name in args.models.split(","):
            ref = ModelRef.of(name, context=args.context) if name == "transformer" else ModelRef.of(name)
            torch.manual_seed(0)
            state = build(ref).state_dict()
            data = write_data(ref, tmp)
            L = store.full(ref).num_layers
            for backend in backends:
                for config in configs(L, args.configs or GRID.get(name)):
                    folder = tmp / f"{name}-{config.hash()}-{backend}"
                    try:
                        row = measure(backend, ref, config, state, data, folder, args.steps, store,
                                      args.eval_examples)
                    except Exception as exc:   # one backend failing on one config is a result, not the end
                        row = {"model": name, "ref": ref.to_json(), "backend": backend,
                               "frozen_prefix": config.frozen_prefix, "head_width": config.head_width,
                               "config": config.to_json(), "batch_size": BATCH,
                               "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                        print(f"{name} k={config.frozen_prefix} s={config.head_width:g} {backend}: {row['error']}",
                              flush=True)
                    rows.append(row)
                    if "error" not in row:
                        extra = (f"  python {row['python_peak_rss_bytes'] / MiB:6.1f} MiB  floor "
                                 f"{row['floor_bytes'] / MiB:6.1f} MiB" if "floor_bytes" in row else "")
                        print(f"{name:<12} k={config.frozen_prefix:<2} s={config.head_width:<4g} {backend:<10} "
                              f"peak {row['peak_rss_bytes'] / MiB:7.1f} MiB "
                              f"(predicted {row['predicted_peak_bytes'] / MiB:7.1f}) "
                              f"step {row['step_seconds'] * 1e3:7.1f} ms  artifacts {row['artifact_bytes'] / MiB:6.2f} "
                              f"MiB  upload {row['upload_bytes'] / MiB:6.2f} MiB{extra}", flush=True)
                    torch.set_num_threads(1)

    run = {"backends_measured": backends, "models": args.models.split(","), "date": time.strftime("%Y-%m-%d"),
           "steps": args.steps, "rows": len(rows), "runtime_seconds": round(time.time() - started, 1),
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    all_rows, runs, old = merge_rows(args.output, rows, run)
    result = {**old, "batch_size": BATCH, "runs": runs, "backends": sorted({r["backend"] for r in all_rows}),
              "backends_not_built": missing,
              "versions": {**old.get("versions", {}), **{b: get_backend(b).versions() for b in backends}},
              "constants_before_fit": {**old.get("constants_before_fit", {}),
                                       **{b: asdict(DEFAULTS[b]) for b in backends}}}
    if "executorch" in backends and baseline["executorch"] is None:
        baseline["executorch"] = (old.get("executorch_baseline") or {}).get("baseline_bytes")
    result.update(summaries(all_rows, backends, store, baseline, binary, not args.no_fit))
    result["rows"] = all_rows
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    for key in HEADLINES:
        if key in result and key.split("_")[0] in backends:
            print(f"{key}: {result[key]}")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output} "
          f"in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
