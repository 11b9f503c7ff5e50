"""`edgefl-device train`: train one artifact set on local data, no coordinator (what an operator runs first
on a freshly flashed device), and report loss before and after, trained-tensor bytes, peak RSS, time.

The training runs in a fresh child process so its peak RSS (VmHWM) is the training's own, measured under
the allocator policy the cost model is calibrated for: glibc's mmap threshold fixed at 128 KiB through
MALLOC_MMAP_THRESHOLD_ in the child's environment (read by glibc at start; edgefl.cost.measure documents why).
For the ort runtime the child blocks torch from import, so nothing can pull it in unseen.

Data: a folder holding x.npy and y.npy, or an .npz holding arrays x and y (`edgefl data export` writes
one client's share), read a batch at a time and checked against the set before the first step (`load_data`):
data the model cannot take is a one-line error naming the file, never a trained-on garbage loss. Loss
before/after is the eval-mode loss on the first `--eval-examples` examples.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from edgefl.device_runtime.child import MMAP_THRESHOLD  # edgefl.cost.measure's policy (a test checks they agree)
from edgefl.device_runtime.local_data import load_data
from edgefl.device_runtime.peaks import PhasePeaks, vm_status
from edgefl.errors import ConfigError


def add_parser(sub) -> None:
    from edgefl.device_runtime.help_format import Help

    p = sub.add_parser("train", help="train one artifact set on local data and report what it cost",
                       description="Train one artifact set on local data in a fresh process and report loss, peak "
                                   "memory beside the predicted peak, and time.", formatter_class=Help)
    p.add_argument("--artifacts", required=True, type=Path, metavar="DIR", help="artifact set folder (holds "
                                                                                "manifest.json)")
    p.add_argument("--data", required=True, type=Path, metavar="PATH",
                   help="folder with x.npy and y.npy, or an .npz with x and y")
    p.add_argument("--steps", type=int, default=20, metavar="N", help="training steps")
    p.add_argument("--runtime", choices=("ort", "executorch", "torch"), help="default: the artifact's backend")
    p.add_argument("--trainer", choices=("auto", "native", "python"), default="auto",
                   help="ExecuTorch sets: the native trainer (auto, built with 'edgefl-device build-native') or the "
                        "Python reference trainer (imports torch)")
    p.add_argument("--lr", type=float, default=0.05, metavar="X", help="learning rate")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the batches drawn")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="threads the training process uses")
    p.add_argument("--eval-examples", type=int, default=256, metavar="N",
                   help="examples the loss before/after is measured on (0: skip, peak RSS of training alone)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="a table to read, or JSON")


def train(args: argparse.Namespace) -> dict:
    """The child's work: load, evaluate, train `steps` steps, evaluate; what it measured."""
    from edgefl.device_runtime.trainers.base import open_trainer

    t0 = time.perf_counter()
    phases = PhasePeaks()
    trainer = open_trainer(args.artifacts, args.runtime, threads=args.threads)
    m = trainer.manifest
    x, y = load_data(args.data, trainer.artifacts)
    loaded_rss = vm_status("VmRSS")
    phases.end("load")
    n = min(len(x), args.eval_examples)
    skipped = {"loss": None, "accuracy": None}
    before = trainer.evaluate(x.head(n), y.head(n)) if n else skipped
    t1 = time.perf_counter()
    losses = trainer.fit(x, y, args.lr, args.steps, args.seed)
    step_s = (time.perf_counter() - t1) / max(args.steps, 1)
    after = trainer.evaluate(x.head(n), y.head(n)) if n else skipped
    phases.end("train")
    upload_bytes = trainer.write_upload(os.devnull)     # as a round writes it, to no file
    phases.end("upload")
    return {"runtime": trainer.runtime, "config_hash": m.config_hash, "artifact_id": m.id, "steps": len(losses),
            "batch_size": m.batch_size, "lr": args.lr, "examples": len(x),
            "loss_before": before["loss"], "loss_after": after["loss"],
            "accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"],
            "first_step_loss": losses[0] if losses else None, "last_step_loss": losses[-1] if losses else None,
            "trained_tensor_bytes": upload_bytes, "peak_rss_bytes": phases.whole, "loaded_rss_bytes": loaded_rss,
            "phase_peak_rss_bytes": phases.peaks,
            "predicted_peak_bytes": (m.predicted or {}).get("peak_memory_bytes"),
            "step_seconds": step_s, "wall_seconds": time.perf_counter() - t0, "threads": args.threads,
            "mmap_threshold": int(os.environ.get("MALLOC_MMAP_THRESHOLD_", 0)) or None,
            "torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None, "trainer": "python"}


def run(args: argparse.Namespace) -> int:
    """Start the child (the native trainer for ExecuTorch sets), relay its one-line error or print its report."""
    if args.steps < 1 or args.eval_examples < 0 or args.threads < 1:
        raise ConfigError(f"--steps and --threads must be >= 1 and --eval-examples >= 0 (got {args.steps}, "
                          f"{args.threads}, {args.eval_examples})")
    from edgefl.device_runtime.child import check, run_process
    from edgefl.device_runtime.native import choose

    common = ["--artifacts", args.artifacts, "--data", args.data, "--steps", args.steps, "--lr", repr(args.lr),
              "--seed", args.seed, "--threads", args.threads, "--eval-examples", args.eval_examples]
    native = choose(args.runtime or _backend(args.artifacts) or "", args.trainer)
    if native is not None:
        from edgefl.manifest import ArtifactSet

        # the native trainer checks shapes, labels and NaN itself but takes any numbers it can convert
        # (uint8 pixels as floats of 0..255): the whole check runs here, before it starts
        load_data(args.data, ArtifactSet.open(args.artifacts, verify=False))
        report = check(run_process([str(a) for a in (native, *common)], args.threads))
        renamed = {"loss_first": "first_step_loss", "loss_last": "last_step_loss",
                   "upload_bytes": "trained_tensor_bytes", "wall_s": "wall_seconds"}
        report = {renamed.get(k, k): v for k, v in report.items()}
        report["mmap_threshold"] = MMAP_THRESHOLD
    else:
        argv = [sys.executable, "-m", "edgefl.device_runtime.train_cmd", *common]
        argv += ["--runtime", args.runtime] if args.runtime else []
        report = check(run_process([str(a) for a in argv], args.threads))
    return _finish(args, report)


def _finish(args: argparse.Namespace, report: dict) -> int:
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


def print_report(r: dict) -> None:
    from edgefl.units import format_bytes

    rows = [("runtime", f"{r['runtime']} ({r.get('trainer', 'python')} trainer)"), ("config", r["config_hash"]),
            ("steps", f"{r['steps']} x batch {r['batch_size']}"),
            ("loss", f"{r['loss_before']:.4f} -> {r['loss_after']:.4f}" if r["loss_before"] is not None
             else f"first step {r['first_step_loss']:.4f}, last step {r['last_step_loss']:.4f}"),
            ("accuracy", f"{r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f}" if r["accuracy_before"] is not None
             else "not measured"),
            ("trained tensors", format_bytes(r["trained_tensor_bytes"])),
            ("peak RSS", format_bytes(r["peak_rss_bytes"]) + (f" (predicted {format_bytes(r['predicted_peak_bytes'])})"
                                                              if r.get("predicted_peak_bytes") else "")),
            ("step time", f"{r['step_seconds'] * 1e3:.1f} ms"), ("wall time", f"{r['wall_seconds']:.2f} s")]
    phases = r.get("phase_peak_rss_bytes") or {}
    if all(phases.values()) and phases:       # where the peak is: loading, training or building the upload
        rows.insert(-2, ("peak by phase", ", ".join(f"{name} {format_bytes(v)}" for name, v in phases.items())))
    for key, value in rows:
        print(f"{key:16} {value}")


def child_entry(argv: list[str]) -> int:
    from edgefl.device_runtime.child import child_main

    parser = argparse.ArgumentParser(prog="edgefl-device train")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *argv])
    return child_main(lambda: train(args), args.runtime or _backend(args.artifacts))


def _backend(folder: Path) -> str | None:
    try:
        return json.loads((folder / "manifest.json").read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None   # open_trainer reports it properly


if __name__ == "__main__":
    sys.exit(child_entry(sys.argv[1:]))
