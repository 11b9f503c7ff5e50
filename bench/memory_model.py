"""How well the cost model predicts memory: predicted vs measured, over the zoo (torch runtime).

    .venv/bin/python bench/memory_model.py [--quick] [--models resnet20,cnn] [--jobs 2] [--fit]

For every zoo model, every frozen prefix k in 0..L-1 (SLT-style: frozen_prefix = k, head_start = k+1
scaled by s, trained to the end; k = L-1 has no head to scale), s in {0.125, 0.25, 0.5, 1} and batch in
{8, 32}:

* activation bytes: the cost model's `activation_bytes` vs `edgefl.cost.measure.measure_activation_bytes`
  (in this process, the full grid);
* training bytes: the cost model's `training_bytes` vs the peak RSS growth of a fresh process running
  the training steps (`edgefl.cost.measure.measure_peak`), under the allocator policy the constants are
  calibrated for (glibc's mmap threshold fixed: `allocator='fixed'`). A fresh process costs seconds, so
  peaks are sampled (see `sampling` in the output); `--jobs` of them run at a time (RSS is per process,
  so running two side by side does not change it; only `step_seconds` feels the shared cores). The
  batch-32 peaks are measured once more under glibc's default policy (`default_allocator` in the output)
  to show what fragmentation does to the same predictions.

Writes bench/results/memory_model.json. `--fit` fits the torch runtime's constants (edgefl/cost/constants.py)
as an upper bound ("a plan is a promise", edgefl.cost.upper_bound) on every peak measured here (baseline: the
torch import RSS measured here, plus the measured growth) and on the torch rows of
bench/results/artifact_memory.json (`edgefl-device train` on exported torch sets, its evaluation included):
every peak predicted >= measured + max(2%, 1 MiB). The loops measured here are bare training loops, the
device rows device processes: the fixed term covers the loops, and the device process's own bytes and the
weight copies its artifact loading holds are fitted on the device rows on top (RuntimeConstants.device_bytes,
PeakTerms.device). The result has measured / predicted per model family and where, and leave-one-family-out
(fitted on the other families, checked on the held-out one, loops and devices apart). `--refit` fits the rows
of an earlier output without measuring again.
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
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefl.cost.constants import DEFAULTS, RuntimeConstants, family  # noqa: E402
from edgefl.cost.model import cost, step_peak_bytes  # noqa: E402
from edgefl.cost.profile_store import ProfileStore  # noqa: E402
from edgefl.cost.upper_bound import FITTED, MARGIN_BYTES, MARGIN_FRACTION, fit_families  # noqa: E402
from edgefl.cost.upper_bound import grid as fit_grid  # noqa: E402
from edgefl.trainconfig import TrainConfig  # noqa: E402
from edgefl.zoo import ModelRef, model_names  # noqa: E402

WIDTHS = (0.125, 0.25, 0.5, 1.0)
BATCHES = (8, 32)
PEAK_WIDTHS = (0.125, 1.0)          # widths whose peaks are measured at a sampled prefix
PEAK_PREFIXES = 6                   # at most this many sampled prefixes per model (all for L <= 20)
DEFAULT_ALLOCATOR_BATCHES = (32,)   # peaks measured again under glibc's default policy
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


def peak_points(rows: list[dict], import_rss: int, store: ProfileStore) -> list[dict]:
    """Every measured torch peak as {model, where, terms, peak}: this benchmark's (import RSS + growth) and
    the device rows of bench/results/artifact_memory.json."""
    points = []
    for r in rows:
        if r.get("measured_growth_bytes"):
            points.append({"model": r["model"], "where": "emulation", "config": r["config"], "ref": r["ref"],
                           "peak": import_rss + r["measured_growth_bytes"]})
    device = ROOT / "bench" / "results" / "artifact_memory.json"
    if device.is_file():
        for r in json.loads(device.read_text())["rows"]:
            if r["backend"] == "torch" and "error" not in r:
                points.append({"model": r["model"], "where": "device", "config": r["config"], "ref": r["ref"],
                               "peak": r["peak_rss_bytes"]})
    for p in points:
        config, ref = TrainConfig.from_json(p["config"]), ModelRef.from_json(p["ref"])
        profile = store.profile(ref, None if config.head_width == 1 else config.widths)
        # a training loop here, a device process there (RuntimeConstants.device_bytes tells them apart)
        p["terms"] = replace(cost(profile, config, "torch", constants=DEFAULTS["torch"]).terms,
                             device=p["where"] == "device")
    return points


def fit(points: list[dict], import_rss: int, exclude: str | None = None) -> RuntimeConstants:
    """torch's constants on `points` (edgefl.cost.upper_bound.fit_families); `exclude`: leave that family out."""
    peaks: dict[str, tuple[list, list]] = {}
    for p in points:
        if family(p["model"]) != exclude:
            terms, measured = peaks.setdefault(family(p["model"]), ([], []))
            terms.append(p["terms"])
            measured.append(p["peak"])
    return fit_families(peaks, replace(DEFAULTS["torch"], baseline_bytes=import_rss), factors=fit_grid(2.0, 0.01),
                        trained_copies=fit_grid(2.0, 0.1), frozen_copies=fit_grid(1.0, 0.1))


def fit_summary(points: list[dict], import_rss: int) -> dict:
    """The fit on every point; measured / predicted per family and where (under the family's constants, and
    under the generic ones a model of an unmeasured family gets); leave-one-family-out."""
    fitted = fit(points, import_rss)
    out = {"constants": asdict(fitted), "margin": f"max({MARGIN_FRACTION:.0%} of the peak, {MARGIN_BYTES} B)",
           "points": len(points), "in_sample": {}, "generic": {}, "leave_one_family_out": {}}
    generic = replace(fitted, families=())
    for p in points:
        p["ratio"] = p["peak"] / p["terms"].peak(fitted.for_model(p["model"]))
        p["ratio_generic"] = p["peak"] / p["terms"].peak(generic)
    for name in sorted({family(p["model"]) for p in points}):
        for where in ("emulation", "device"):
            mine = [p for p in points if family(p["model"]) == name and p["where"] == where]
            if mine:
                for key, field in (("in_sample", "ratio"), ("generic", "ratio_generic")):
                    got = [p[field] for p in mine]
                    out[key][f"{name}/{where}"] = {"peaks": len(got), "measured_over_predicted_min": min(got),
                                                   "measured_over_predicted_max": max(got)}
        k = replace(fit(points, import_rss, exclude=name), families=())
        held = [p for p in points if family(p["model"]) == name]
        got = [p["peak"] / p["terms"].peak(k) for p in held]
        out["leave_one_family_out"][f"held_out_{name}"] = {
            "constants": {f: getattr(k, f) for f in FITTED},
            "measured_over_predicted_min": min(got), "measured_over_predicted_max": max(got),
            **{where: {"peaks": len(mine), "measured_over_predicted_min": min(mine),
                       "measured_over_predicted_max": max(mine)}
               for where in ("emulation", "device")
               if (mine := [g for g, p in zip(got, held) if p["where"] == where])}}
    ratios = [p["ratio"] for p in points]
    out["measured_over_predicted_min"], out["measured_over_predicted_max"] = min(ratios), max(ratios)
    for p in points:
        del p["terms"]
    return out


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
    ap.add_argument("--fit", action="store_true", help="fit the torch constants as an upper bound on every peak")
    ap.add_argument("--refit", action="store_true", help="no measuring: fit the rows of the existing --output")
    ap.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "memory_model.json")
    args = ap.parse_args(argv)
    if args.refit:
        return refit(args.output)

    import torch

    from edgefl.cost.measure import MMAP_THRESHOLD, measure_activation_bytes, measure_peak

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
        "allocator": {"peaks": f"glibc mmap threshold fixed at {MMAP_THRESHOLD} bytes (edgefl.cost.measure."
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
        result["fit"] = fit_summary(peak_points(rows, import_rss, store), import_rss)
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
        print_fit(result["fit"])
    print(f"wrote {args.output} in {result['runtime_seconds']:.0f}s")
    return 0


def print_fit(f: dict) -> None:
    k = f["constants"]
    print(f"upper-bound fit on {f['points']} peaks: fixed {k['workspace_fixed_bytes'] / MiB:.1f} MiB, factor "
          f"{k['workspace_factor']}, trained copies {k['trained_weight_copies']}, frozen copies "
          f"{k['frozen_weight_copies']}; measured/predicted {f['measured_over_predicted_min']:.3f}.."
          f"{f['measured_over_predicted_max']:.3f}")
    for key, v in {**f["in_sample"], **{f"generic {k}": v for k, v in f["generic"].items()},
                   **f["leave_one_family_out"]}.items():
        print(f"   {key:<24} {v['measured_over_predicted_min']:.3f}..{v['measured_over_predicted_max']:.3f}")


def refit(path: Path) -> int:
    result = json.loads(path.read_text())
    store = ProfileStore(persist=False)
    result["fit"] = fit_summary(peak_points(result["rows"], result["torch_import_rss_bytes"], store),
                                result["torch_import_rss_bytes"])
    path.write_text(json.dumps(result, indent=1))
    print_fit(result["fit"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
