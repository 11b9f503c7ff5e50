"""ONNX Runtime's buffer reuse, on (ORT's default) and off (what devices run), side by side.

ORT's allocation planner gives a tensor the buffer of an earlier, dead tensor of the same size, and keeps that
buffer from the first tensor's birth to the second's death. In a training graph the pairs span the whole step: a
forward temporary (a matmul's output before its bias add) lends its buffer to a gradient
of the same shape made in backward, so at the turn from forward to backward every lent buffer is allocated,
though none holds a live tensor. `edgefl.device_runtime.trainers.ort_trainer` turns reuse off in every session it
opens (`enable_mem_reuse`); this benchmark measures what that changes.

Each set (the zoo defaults of bench/artifact_memory.py: frozen prefix K x head width S, exported as `edgefl
export` writes it) is trained by `edgefl-device train`'s own child process (fixed allocator, one thread, torch
blocked, its default evaluation), once as devices run it and once with reuse turned back on, in alternating
order; `--repeats` runs of each. Per set: the peak RSS of both, the step peak above the loaded process, their
ratio, the median step time of both and its ratio, and whether the losses agree (they must: reuse moves buffers,
never values). The file is merged: a run keeps the rows of the models it did not measure.

Run: .venv/bin/python bench/ort_mem_reuse.py [--models resnet20,vit] [--configs 0:1,...] [--steps 10]
     [--repeats 2] [-o bench/results/ort_mem_reuse.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import artifact_memory as am  # noqa: E402

from edgefl.cost.profile_store import ProfileStore  # noqa: E402
from edgefl.device_runtime.child import check, run_process  # noqa: E402
from edgefl.zoo import ModelRef, build  # noqa: E402

MODELS = "resnet20,cnn,transformer,vgg11bn,densenet40,vit"
# the device's child, with ORT's default (reuse on) put back into its sessions' options
REUSE_ON = ("import sys\n"
            "from edgefl.device_runtime.trainers import ort_trainer\n"
            "own = ort_trainer.session_options\n"
            "def with_reuse(threads):\n"
            "    options = own(threads)\n"
            "    options.enable_mem_reuse = True\n"
            "    return options\n"
            "ort_trainer.session_options = with_reuse\n"
            "from edgefl.device_runtime.train_cmd import child_entry\n"
            "sys.exit(child_entry(sys.argv[1:]))\n")


def train(folder: Path, data: Path, steps: int, reuse: bool) -> dict:
    args = ["--artifacts", str(folder), "--data", str(data), "--steps", str(steps)]
    argv = [sys.executable, "-c", REUSE_ON, *args] if reuse else \
        [sys.executable, "-m", "edgefl.device_runtime.train_cmd", *args]
    return check(run_process(argv))


def row_for(name: str, config, folder: Path, data: Path, steps: int, repeats: int) -> dict:
    runs = {"off": [], "on": []}
    for i in range(repeats):
        for variant in (("off", "on") if i % 2 == 0 else ("on", "off")):
            runs[variant].append(train(folder, data, steps, variant == "on"))

    def summary(reports: list[dict]) -> dict:
        peak = max(r["peak_rss_bytes"] for r in reports)
        loaded = min(r["loaded_rss_bytes"] for r in reports)
        return {"peak_rss_bytes": peak, "loaded_rss_bytes": loaded, "step_peak_above_loaded_bytes": peak - loaded,
                "step_seconds": statistics.median(r["step_seconds"] for r in reports),
                "last_step_loss": reports[0]["last_step_loss"]}

    off, on = summary(runs["off"]), summary(runs["on"])
    return {"model": name, "frozen_prefix": config.frozen_prefix, "head_width": config.head_width,
            "batch_size": config.batch_size, "reuse_off": off, "reuse_on": on,
            "peak_off_over_on": off["peak_rss_bytes"] / on["peak_rss_bytes"],
            "step_peak_above_loaded_off_over_on": off["step_peak_above_loaded_bytes"]
            / on["step_peak_above_loaded_bytes"],
            "step_seconds_off_over_on": off["step_seconds"] / on["step_seconds"],
            "same_losses": all(r["last_step_loss"] == runs["off"][0]["last_step_loss"]
                               for r in runs["off"] + runs["on"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--configs", help="frozen prefix:head width pairs for every model (default: K in {0, L//2} "
                                      "at width 1)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-o", "--output", type=Path, default=Path("bench/results/ort_mem_reuse.json"))
    args = ap.parse_args(argv)

    import torch

    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import export_set

    store = ProfileStore(persist=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefl-ort-reuse-") as tmp:
        tmp = Path(tmp)
        for name in args.models.split(","):
            ref = ModelRef.of(name)
            torch.manual_seed(0)
            state = build(ref).state_dict()
            data = am.write_data(ref, tmp)
            L = store.full(ref).num_layers
            for config in am.configs(L, args.configs or f"0:1,{L // 2}:1"):
                folder = tmp / f"{name}-{config.hash()}"
                export_set(ref, config, state, get_backend("ort"), folder)
                row = row_for(name, config, folder, data, args.steps, args.repeats)
                rows.append(row)
                on, off = (row[v]["peak_rss_bytes"] / 2**20 for v in ("reuse_on", "reuse_off"))
                print(f"{name:12} k={config.frozen_prefix:<3} s={config.head_width:<5g} peak {on:7.1f} -> {off:7.1f} "
                      f"MiB ({row['peak_off_over_on']:.3f}; above loaded "
                      f"{row['step_peak_above_loaded_off_over_on']:.3f})  step time "
                      f"x{row['step_seconds_off_over_on']:.3f}  same losses {row['same_losses']}", flush=True)
    if args.output.exists():     # merged: the rows of models this run did not measure are kept
        measured = set(args.models.split(","))
        kept = [r for r in json.loads(args.output.read_text())["rows"] if r["model"] not in measured]
        rows = kept + rows
    ratios = [r["peak_off_over_on"] for r in rows]
    times = [r["step_seconds_off_over_on"] for r in rows]
    out = {"date": datetime.date.today().isoformat(), "doc": __doc__.split("\n\n")[1].replace("\n", " "),
           "steps": args.steps, "repeats": args.repeats,
           "machine": {"platform": platform.platform(), "python": platform.python_version()},
           "peak_off_over_on": {"min": min(ratios), "max": max(ratios)},
           "step_seconds_off_over_on": {"min": min(times), "max": max(times), "median": statistics.median(times)},
           "same_losses": all(r["same_losses"] for r in rows), "rows": rows}
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"peak off/on {min(ratios):.3f}-{max(ratios):.3f}; step time off/on {min(times):.3f}-{max(times):.3f}; "
          f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
