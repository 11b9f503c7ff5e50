"""How well the cost model predicts memory: predicted vs measured, over the zoo (torch runtime).

    .venv/bin/python bench/memory_model.py [--quick] [--models resnet20,cnn] [--jobs 2] [--fit]

For every zoo model, every frozen prefix k in 0..L-1 (SLT-style: frozen_prefix = k, head_start = k+1
scaled by s, trained to the end; k = L-1 has no head to scale), s in {0.125, 0.25, 0.5, 1} and batch in
{8, 32}:

* activation bytes: the cost model's `activation_bytes` vs `edgefl.measure.measure_activation_bytes`
  (in this process, the full grid);
* training bytes: the cost model's `training_bytes` vs the peak RSS growth of a fresh process running
  the training steps (`edgefl.measure.measure_peak`), under the allocator policy the constants are
  calibrated for (glibc's mmap threshold fixed: `allocator='fixed'`). A fresh process costs seconds, so
  peaks are sampled (see `sampling` in the output); `--jobs` of them run at a time (RSS is per process,
  so running two side by side does not change it; only `step_seconds` feels the shared cores). The
  batch-32 peaks are measured once more under glibc's default policy (`default_allocator` in the output)
  to show what fragmentation does to the same predictions.

Writes bench/results/memory_model.json. `--fit` also least-squares-fits the torch runtime's
`workspace_fixed_bytes` and `workspace_factor` (edgefl/calibration.py) on the fit models' peaks
(resnet*, cnn) and reports the errors the fitted constants would give on every model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefl.calibration import DEFAULTS, RuntimeConstants  # noqa: E402
from edgefl.cost import cost, step_peak_bytes  # noqa: E402
from edgefl.profile import ProfileStore  # noqa: E402
from edgefl.trainconfig import TrainConfig  # noqa: E402
from edgefl.zoo import ModelRef, model_names  # noqa: E402

WIDTHS = (0.125, 0.25, 0.5, 1.0)
BATCHES = (8, 32)
PEAK_WIDTHS = (0.125, 1.0)          # widths whose peaks are measured at a sampled prefix
PEAK_PREFIXES = 6                   # at most this many sampled prefixes per model (all for L <= 20)
DEFAULT_ALLOCATOR_BATCHES = (32,)   # peaks measured again under glibc's default policy
FIT_MODELS = ("resnet20", "resnet32", "resnet44", "resnet56", "cnn")
MiB = 2**20


def model_ref(name: str, transformer_layers: int) -> ModelRef:
    return ModelRef.of(name, layers=transformer_layers) if name == "transformer" else ModelRef.of(name)


def slt_config(L: int, k: int, s: float, batch: int) -> TrainConfig:
    if k + 1 >= L:
        return TrainConfig(num_layers=L, frozen_prefix=k, batch_size=batch)
    return TrainConfig(num_layers=L, frozen_prefix=k, head_start=k + 1, head_width=s, batch_size=batch)


def grid(L: int, prefixes, widths, batches):
    seen = set()
    for batch in batches:
        for k in prefixes:
            for s in widths:
                c = slt_config(L, k, s, batch)
                if c not in seen:
                    seen.add(c)
                    yield c


def peak_prefixes(L: int, quick: bool) -> list[int]:
    if quick:
        return sorted({0, 7 % L, L - 1})
    if L <= 20:
        return list(range(L))
    stride = math.ceil((L - 1) / (PEAK_PREFIXES - 1))
    return sorted(set(range(0, L, stride)) | {L - 1})


def torch_import_rss() -> int:
    code = ("import torch\n"
            "print([int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def rel_error(pred: int, meas: int) -> float:
    return (pred - meas) / meas


def summary(errors: list[float]) -> tuple[float | None, float | None]:
    if not errors:
        return None, None
    a = [abs(e) for e in errors]
    return max(a), statistics.median(a)


def predicted_training(row: dict, k: RuntimeConstants) -> int:
    """training_bytes from a row's recorded components under other constants (what --fit tries); the
    same arithmetic as edgefl.cost.cost."""
    p = row["predicted"]
    acts, grads = p["activation_bytes"], p["gradient_bytes"]
    workspace = (k.workspace_fixed_bytes + row["batch_size"] * row["input_bytes"]
                 + max(0, int(k.workspace_factor * row["step_peak_bytes"]) - acts - grads))
    return (p["weights_frozen_bytes"] + p["weights_trained_bytes"] + grads + p["optimizer_bytes"] + acts
            + workspace)


def fit(rows: list[dict], base: RuntimeConstants) -> RuntimeConstants:
    """Least squares on relative error over the fit models' peaks: for each workspace_factor c on a grid,
    the workspace_fixed_bytes F minimising sum ((pred - meas) / meas)^2 is closed-form (pred is F plus a
    part that does not depend on F); keep the (F, c) with the smallest sum."""
    pts = [r for r in rows if r["model"] in FIT_MODELS and r.get("measured_growth_bytes")]
    best = None
    for step in range(0, 201):
        c = 1.0 + step / 200                                    # 1.000 .. 2.000
        rest = [predicted_training(r, RuntimeConstants(0, 0, c, "")) for r in pts]
        ms = [r["measured_growth_bytes"] for r in pts]
        F = sum((m - q) / m ** 2 for m, q in zip(ms, rest)) / sum(1 / m ** 2 for m in ms)
        sse = sum(((q + F - m) / m) ** 2 for m, q in zip(ms, rest))
        if best is None or sse < best[0]:
            best = (sse, int(F), c)
    _, F, c = best
    return RuntimeConstants(base.baseline_bytes, F, c, f"fit on {len(pts)} peaks of {', '.join(FIT_MODELS)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one model, a few configs")
    ap.add_argument("--models", help="comma-separated zoo names (default: every zoo model)")
    ap.add_argument("--transformer-layers", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=2, help="peak-measuring processes at a time")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-peaks", action="store_true", help="activation bytes only")
    ap.add_argument("--no-default-allocator", action="store_true",
                    help="skip the peaks under glibc's default allocator policy")
    ap.add_argument("--fit", action="store_true", help="fit the torch workspace constants on resnet/cnn peaks")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "memory_model.json")
    args = ap.parse_args(argv)

    import torch

    from edgefl.measure import MMAP_THRESHOLD, measure_activation_bytes, measure_peak

    # the in-process activation measurements run one step each on small batches: a second intra-op
    # thread only spins (and fights the peak processes for the 2 cores), so one thread
    torch.set_num_threads(1)
    started = time.time()
    names = args.models.split(",") if args.models else (["resnet20"] if args.quick else model_names())
    constants = DEFAULTS["torch"]
    store = ProfileStore(persist=False)     # always the current profiler, never a stale cache
    import_rss = torch_import_rss()
    rows, sampling = [], {}
    for name in names:
        ref = model_ref(name, args.transformer_layers)
        L = store.full(ref).num_layers
        prefixes = sorted({0, 7 % L, L - 1}) if args.quick else range(L)
        widths = (0.25, 1.0) if args.quick else WIDTHS
        batches = (8,) if args.quick else BATCHES
        sampled = set(peak_prefixes(L, args.quick))
        peak_widths = widths if args.quick else PEAK_WIDTHS
        sampling[name] = {"layers": L, "peak_prefixes": sorted(sampled), "peak_widths": list(peak_widths),
                          "peak_batches": list(batches)}
        t0 = time.time()
        for config in grid(L, prefixes, widths, batches):
            widths_vec = None if config.head_width == 1 else config.widths
            profile = store.profile(ref, widths_vec)
            c = cost(profile, config, "torch", constants=constants)
            measured = measure_activation_bytes(ref, config)
            rows.append({"model": name, "ref": ref.to_json(), "num_layers": L, "frozen_prefix": config.frozen_prefix,
                         "head_start": config.head_start, "head_width": config.head_width,
                         "batch_size": config.batch_size, "config": config.to_json(),
                         "predicted_activation_bytes": c.activation_bytes, "measured_activation_bytes": measured,
                         "activation_error": rel_error(c.activation_bytes, measured),
                         "predicted_training_bytes": c.training_bytes, "predicted": c.to_json(),
                         "step_peak_bytes": step_peak_bytes(profile, config), "input_bytes": profile.input_bytes,
                         "peak_sampled": config.frozen_prefix in sampled and config.head_width in peak_widths})
        print(f"{name}: {sum(r['model'] == name for r in rows)} activation configs in {time.time() - t0:.0f}s",
              flush=True)

    if not args.no_peaks:
        todo = [(r, "fixed") for r in rows if r["peak_sampled"]]
        if not args.no_default_allocator:
            todo += [(r, "default") for r in rows if r["peak_sampled"] and r["batch_size"] in DEFAULT_ALLOCATOR_BATCHES]
        t0 = time.time()

        def one(job):
            row, allocator = job
            config = TrainConfig.from_json(row["config"])
            return row, allocator, measure_peak(ModelRef.from_json(row["ref"]), config, "torch", steps=args.steps,
                                                warmup=args.warmup, allocator=allocator)

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for i, (row, allocator, m) in enumerate(pool.map(one, todo)):
                if allocator == "fixed":
                    row["peak"] = m
                    row["measured_growth_bytes"] = m["peak_rss_growth_bytes"]
                    row["training_bytes_error"] = rel_error(row["predicted_training_bytes"], m["peak_rss_growth_bytes"])
                else:
                    row["peak_default_allocator"] = m
                    row["default_allocator_error"] = rel_error(row["predicted_training_bytes"],
                                                               m["peak_rss_growth_bytes"])
                if (i + 1) % 20 == 0 or i + 1 == len(todo):
                    print(f"peaks: {i + 1}/{len(todo)} in {time.time() - t0:.0f}s", flush=True)

    def errors_of(subset, key):
        return [r[key] for r in subset if r.get(key) is not None]

    per_model = {}
    for name in names:
        sub = [r for r in rows if r["model"] == name]
        amax, amed = summary(errors_of(sub, "activation_error"))
        tmax, tmed = summary(errors_of(sub, "training_bytes_error"))
        dmax, dmed = summary(errors_of(sub, "default_allocator_error"))
        per_model[name] = {"activation_error_max": amax, "activation_error_median": amed,
                           "training_bytes_error_max": tmax, "training_bytes_error_median": tmed,
                           "configs": len(sub), "peak_configs": len(errors_of(sub, "training_bytes_error")),
                           "default_allocator": {"training_bytes_error_max": dmax,
                                                 "training_bytes_error_median": dmed,
                                                 "peak_configs": len(errors_of(sub, "default_allocator_error"))}}
    amax, amed = summary(errors_of(rows, "activation_error"))
    tmax, tmed = summary(errors_of(rows, "training_bytes_error"))
    dmax, dmed = summary(errors_of(rows, "default_allocator_error"))
    result = {
        "activation_error_max": amax, "activation_error_median": amed,
        "training_bytes_error_max": tmax, "training_bytes_error_median": tmed,
        "per_model": per_model,
        "allocator": {"peaks": f"glibc mmap threshold fixed at {MMAP_THRESHOLD} bytes (edgefl.measure."
                               "configure_allocator); the constants are fitted under this policy",
                      "default_allocator": {"what": "the same predictions vs peaks under glibc's default (dynamic) "
                                                    f"mmap threshold, batch {list(DEFAULT_ALLOCATOR_BATCHES)} only",
                                            "training_bytes_error_max": dmax,
                                            "training_bytes_error_median": dmed}},
        "torch_import_rss_bytes": import_rss,
        "constants": {"torch": {"baseline_bytes": constants.baseline_bytes,
                                "workspace_fixed_bytes": constants.workspace_fixed_bytes,
                                "workspace_factor": constants.workspace_factor, "source": constants.source}},
        "sampling": {"activation": "full grid: every frozen prefix x head width x batch" if not args.quick
                     else "quick subset",
                     "peaks": f"fresh process per config ({args.warmup} warmup + {args.steps} timed steps, "
                              f"torch.set_num_threads(1), {args.jobs} at a time); head widths {list(PEAK_WIDTHS)} "
                              f"at the frozen prefixes listed per model (every prefix for L <= 20, else a stride "
                              f"giving at most {PEAK_PREFIXES})",
                     "per_model": sampling},
        "quick": args.quick,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"),
        "runtime_seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    if args.fit and not args.no_peaks:
        fitted = fit(rows, RuntimeConstants(import_rss, 0, 0.0, ""))
        errs = {}
        for name in names:
            e = [rel_error(predicted_training(r, fitted), r["measured_growth_bytes"])
                 for r in rows if r["model"] == name and r.get("measured_growth_bytes")]
            errs[name] = dict(zip(("max", "median"), summary(e)))
        result["fit"] = {"baseline_bytes": import_rss, "workspace_fixed_bytes": fitted.workspace_fixed_bytes,
                         "workspace_factor": fitted.workspace_factor, "source": fitted.source,
                         "training_bytes_error": errs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))

    print(f"\n{'model':<12} {'act max':>8} {'act med':>8} {'train max':>9} {'train med':>9} "
          f"{'glibc max':>9} {'glibc med':>9}  configs/peaks")
    fmt = lambda v: f"{100 * v:7.2f}%" if v is not None else "       -"  # noqa: E731
    for name, m in per_model.items():
        d = m["default_allocator"]
        print(f"{name:<12} {fmt(m['activation_error_max'])} {fmt(m['activation_error_median'])} "
              f"{fmt(m['training_bytes_error_max'])}  {fmt(m['training_bytes_error_median'])}  "
              f"{fmt(d['training_bytes_error_max'])}  {fmt(d['training_bytes_error_median'])}  "
              f"{m['configs']}/{m['peak_configs']}")
    print(f"{'all':<12} {fmt(amax)} {fmt(amed)} {fmt(tmax)}  {fmt(tmed)}  {fmt(dmax)}  {fmt(dmed)}")
    print(f"torch import RSS {import_rss / MiB:.1f} MiB; constants {constants}")
    if "fit" in result:
        f = result["fit"]
        print(f"fit: workspace_fixed_bytes={f['workspace_fixed_bytes']} ({f['workspace_fixed_bytes'] / MiB:.1f} MiB), "
              f"workspace_factor={f['workspace_factor']}")
        for name, e in f["training_bytes_error"].items():
            print(f"   {name:<12} max {fmt(e['max'])} median {fmt(e['median'])}")
    print(f"wrote {args.output} in {result['runtime_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
