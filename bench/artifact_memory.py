"""What an exported artifact set costs a device: peak RSS, step time, bytes, vs the cost model.

    .venv/bin/python bench/artifact_memory.py [--backends ort,torch,executorch] [--models resnet20,transformer]
                                              [--steps 20] [--context 256] [--no-fit]

For ResNet-20 (3x32x32, 10 classes) and the transformer LM (zoo defaults), each backend whose export
module and trainer exist, frozen prefix in {0, middle, all-but-head} x head width {0.25, 1} (SLT-style:
head_start = frozen_prefix + 1; all-but-head has no hidden layer left to narrow): export the set, then
train it `--steps` steps at batch 32 in a fresh device process exactly as an operator would
(`edgefl-device train --eval-examples 0 --format json`: glibc's mmap threshold fixed at 128 KiB, one
thread, torch blocked for ORT) on 32 random examples, and record its peak RSS (VmHWM), step time, the
artifact bytes (suffix + prefix), the upload bytes and the cost model's predicted peak.

The ORT runtime's constants (edgefl/calibration.py) are calibrated here: `baseline_bytes` is measured (a
fresh process importing onnxruntime through the torch-free shim and opening one session), and
`workspace_fixed_bytes` / `workspace_factor` are fitted by least squares on the relative error of the
predicted peak over every ORT row (the closed form of bench/memory_model.py's fit). Rows keep the
prediction under the constants in force when the bench ran and under the fitted ones.

Writes bench/results/artifact_memory.json; headline: `ort_all_but_head_over_full_resnet20` (peak RSS of
the all-but-head set over the full-model set, one run) and the fitted constants with their worst error.
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

from edgefl.calibration import DEFAULTS, RuntimeConstants  # noqa: E402
from edgefl.cost import cost  # noqa: E402
from edgefl.profile import ProfileStore  # noqa: E402
from edgefl.trainconfig import TrainConfig  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402

MiB = 2**20
BATCH = 32
WIDTHS = (0.25, 1.0)


def built(backend: str) -> bool:
    """Its export module, its trainer and their runtime are installed (the ExecuTorch pair joins by existing)."""
    import importlib.util

    from edgefl.device_runtime.trainers.base import _TRAINERS
    from edgefl.export.backends import _BACKENDS
    return all(importlib.util.find_spec(m) is not None
               for m in (_BACKENDS[backend][0], _TRAINERS[backend][0], *_BACKENDS[backend][3]))


def configs(L: int) -> list[TrainConfig]:
    out = []
    for k in (0, L // 2, L - 1):
        for s in WIDTHS if k + 1 < L else (1.0,):
            head = None if s == 1 else k + 1
            out.append(TrainConfig(num_layers=L, frozen_prefix=k, head_start=head, head_width=s, batch_size=BATCH))
    return out


def write_data(ref: ModelRef, folder: Path, seed: int = 0) -> Path:
    import numpy as np

    from edgefl.zoo import build
    model = build(ref)
    rng = np.random.default_rng(seed)
    if ref.name == "transformer":
        x = rng.integers(0, model.num_classes, (BATCH, *model.input_shape))
        y = rng.integers(0, model.num_classes, BATCH * model.input_shape[0])
    else:
        x = rng.standard_normal((BATCH, *model.input_shape)).astype(np.float32)
        y = rng.integers(0, model.num_classes, BATCH)
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
            "from edgefl.device_runtime.trainers.ort_trainer import _session_options\n"
            "training_api(); import onnxruntime\n"
            f"s = onnxruntime.InferenceSession({str(folder / 'probe.onnx')!r}, _session_options(1))\n"
            "print([int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0])")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    runs = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env=env).stdout) for _ in range(3)]
    return int(statistics.median(runs))


def train_on_device(folder: Path, data: Path, steps: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "train", "--artifacts", str(folder),
                        "--data", str(data), "--steps", str(steps), "--eval-examples", "0", "--format", "json"],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return json.loads(r.stdout)


def predicted_peak(store: ProfileStore, ref: ModelRef, config: TrainConfig, runtime: str,
                   constants: RuntimeConstants) -> int:
    widths = None if config.head_width == 1 else config.widths
    return cost(store.profile(ref, widths), config, runtime, constants=constants).peak_memory_bytes


def fit(rows: list[dict], store: ProfileStore, baseline: int) -> RuntimeConstants:
    """workspace_factor c on a grid; for each, the workspace_fixed_bytes F >= 0 minimising the summed squared
    relative error of the predicted peak is closed-form (the peak is F plus a part that does not depend
    on F); keep the best (F, c)."""
    best = None
    for step in range(0, 301):
        c = step / 100                                                  # 0.00 .. 3.00
        k = replace(DEFAULTS["ort"], baseline_bytes=baseline, workspace_fixed_bytes=0, workspace_factor=c)
        rest = [predicted_peak(store, ModelRef.from_json(r["ref"]), TrainConfig.from_json(r["config"]), "ort", k)
                for r in rows]
        ms = [r["peak_rss_bytes"] for r in rows]
        F = max(0.0, sum((m - q) / m**2 for m, q in zip(ms, rest)) / sum(1 / m**2 for m in ms))
        sse = sum(((q + F - m) / m) ** 2 for m, q in zip(ms, rest))
        if best is None or sse < best[0]:
            best = (sse, int(F), c)
    _, F, c = best
    return replace(DEFAULTS["ort"], baseline_bytes=baseline, workspace_fixed_bytes=F, workspace_factor=c,
                   source=f"fit on {len(rows)} ORT peaks (bench/artifact_memory.py)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="ort,torch,executorch")
    ap.add_argument("--models", default="resnet20,transformer")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--context", type=int, help="transformer context (default: the zoo's)")
    ap.add_argument("--no-fit", action="store_true", help="do not fit the ORT constants")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "artifact_memory.json")
    args = ap.parse_args(argv)

    import torch

    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import export_set

    torch.set_num_threads(1)
    started = time.time()
    backends = [b for b in args.backends.split(",") if built(b)]
    missing = sorted(set(args.backends.split(",")) - set(backends))
    store = ProfileStore(persist=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefl-artifact-memory-") as tmp:
        tmp = Path(tmp)
        baseline = ort_baseline(tmp) if "ort" in backends else None
        for name in args.models.split(","):
            ref = ModelRef.of(name, context=args.context) if name == "transformer" else ModelRef.of(name)
            torch.manual_seed(0)
            from edgefl.zoo import build
            state = build(ref).state_dict()
            data = write_data(ref, tmp)
            L = store.full(ref).num_layers
            for config in configs(L):
                for backend in backends:
                    row = {"model": name, "ref": ref.to_json(), "backend": backend, "frozen_prefix": config.frozen_prefix,
                           "head_width": config.head_width, "config": config.to_json(), "batch_size": BATCH}
                    folder = tmp / f"{name}-{config.hash()}-{backend}"
                    try:
                        t0 = time.time()
                        a = export_set(ref, config, state, get_backend(backend), folder)
                        row["export_seconds"] = round(time.time() - t0, 2)
                        row["artifact_bytes"] = a.suffix.artifact_bytes + (a.prefix.artifact_bytes if a.prefix else 0)
                        row["upload_bytes"] = a.suffix.upload_bytes
                        report = train_on_device(folder, data, args.steps)
                    except Exception as exc:   # one backend failing on one config is a result, not the end
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                        rows.append(row)
                        print(f"{name} k={config.frozen_prefix} s={config.head_width:g} {backend}: {row['error']}",
                              flush=True)
                        continue
                    row.update({k: report[k] for k in ("peak_rss_bytes", "loaded_rss_bytes", "step_seconds",
                                                       "trained_tensor_bytes", "first_step_loss", "last_step_loss")})
                    row["predicted_peak_bytes"] = predicted_peak(store, ref, config, backend, DEFAULTS[backend])
                    row["error_before_fit"] = (row["predicted_peak_bytes"] - row["peak_rss_bytes"]) / row["peak_rss_bytes"]
                    rows.append(row)
                    print(f"{name:<12} k={config.frozen_prefix:<2} s={config.head_width:<4g} {backend:<10} "
                          f"peak {row['peak_rss_bytes'] / MiB:7.1f} MiB "
                          f"(predicted {row['predicted_peak_bytes'] / MiB:7.1f}) "
                          f"step {row['step_seconds'] * 1e3:7.1f} ms  artifacts {row['artifact_bytes'] / MiB:6.2f} MiB  "
                          f"upload {row['upload_bytes'] / MiB:6.2f} MiB", flush=True)
                    torch.set_num_threads(1)

    result = {"steps": args.steps, "batch_size": BATCH, "backends": backends, "backends_not_built": missing,
              "date": time.strftime("%Y-%m-%d"),
              "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
              "versions": {b: get_backend(b).versions() for b in backends}}
    ok = [r for r in rows if "error" not in r]
    full = next((r for r in ok if r["model"] == "resnet20" and r["backend"] == "ort" and r["frozen_prefix"] == 0
                 and r["head_width"] == 1), None)
    head = next((r for r in ok if r["model"] == "resnet20" and r["backend"] == "ort"
                 and r["frozen_prefix"] == TrainConfig.from_json(r["config"]).num_layers - 1), None)
    if full and head:
        result["ort_all_but_head_over_full_resnet20"] = head["peak_rss_bytes"] / full["peak_rss_bytes"]
    ort_rows = [r for r in ok if r["backend"] == "ort"]
    if ort_rows and not args.no_fit:
        fitted = fit(ort_rows, store, baseline)
        for r in ort_rows:
            r["predicted_peak_bytes_fitted"] = predicted_peak(store, ModelRef.from_json(r["ref"]),
                                                              TrainConfig.from_json(r["config"]), "ort", fitted)
            r["error_after_fit"] = (r["predicted_peak_bytes_fitted"] - r["peak_rss_bytes"]) / r["peak_rss_bytes"]
        result["ort_constants"] = asdict(fitted)
        result["ort_worst_peak_error_after_fit"] = max(abs(r["error_after_fit"]) for r in ort_rows)
        # out of sample: fitted on one model's peaks, the worst error on the other's
        models = sorted({r["model"] for r in ort_rows})
        if len(models) > 1:
            cross = {}
            for name in models:
                k = fit([r for r in ort_rows if r["model"] == name], store, baseline)
                cross[f"fit_on_{name}"] = max(
                    abs(predicted_peak(store, ModelRef.from_json(r["ref"]), TrainConfig.from_json(r["config"]), "ort", k)
                        - r["peak_rss_bytes"]) / r["peak_rss_bytes"] for r in ort_rows if r["model"] != name)
            result["ort_worst_peak_error_other_model"] = cross
    if ort_rows:
        result["ort_worst_peak_error_before_fit"] = max(abs(r["error_before_fit"]) for r in ort_rows)
    result["constants_before_fit"] = {b: asdict(DEFAULTS[b]) for b in backends}
    result["runtime_seconds"] = round(time.time() - started, 1)
    result["rows"] = rows
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    for key in ("ort_all_but_head_over_full_resnet20", "ort_constants", "ort_worst_peak_error_before_fit",
                "ort_worst_peak_error_after_fit", "ort_worst_peak_error_other_model"):
        if key in result:
            print(f"{key}: {result[key]}")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output} "
          f"in {result['runtime_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
