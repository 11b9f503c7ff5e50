"""Training step time and peak RSS of one device-side set per runtime, side by side on the same CPU.

For each set (a model and its frozen prefix / head width, batch 32) the same suffix is trained `--steps` steps on
the same local data by: the native ExecuTorch trainer with edgefl's kernels (`--kernels edgefl`, the default),
ONNX Runtime and the torch set (`edgefl-device train`), and a plain PyTorch loop over the eager split model
(torch.optim.SGD, no edgefl trainer in between, glibc's default allocator: the others run with a device's 128 KiB
mmap threshold); on request (`--runtimes ...,native_shipped`) the native trainer
on the wheel's kernels alone, whose convolutions are direct loops (seconds per step: not a default). One thread everywhere. The runtimes run in turn, `--runs` rounds, so load on the machine falls on
all of them alike; each figure is the median over the rounds, and every ratio is to the plain torch loop of the
same rounds (and edgefl over shipped kernels for the native trainer). Each runtime's first and last loss are
recorded: first losses agree to rounding; last losses of the ResNet sets drift apart over 30 steps on random
labels (a rounding difference grows there: tests/export/test_parity.py holds the runtimes to torch).

`--before BINARY:WORK[:AARCH64_BINARY]` adds `native_before`: another build of the native trainer (an earlier
commit's, say) on the sets an earlier exporter wrote under WORK (<set>/executorch, as `--work` holds them), run
in the same turns (and under qemu with `--qemu`, given its aarch64 build).

`--qemu` adds the aarch64 column: the cross-built native trainer under qemu-user, each kernel set measured on x86.
Emulation makes its absolute times meaningless; what it reports is each kernel set's step under qemu over the
same set's x86 step, so an arm64-only regression shows as a ratio apart from the x86 one (and from the other
kernel set's, when both ran).

    python bench/device_speed.py [--sets cnn-full,...] [--steps 30] [--runs 3] [--qemu [--qemu-steps 5] [--qemu-runs N]] [--work DIR]
                                 [--before BINARY:WORK[:AARCH64_BINARY]]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
BATCH, EXAMPLES = 32, 256
# name -> (model, layers, frozen prefix, head width)
SETS = {"cnn-full": ("cnn", 4, 0, 1.0), "cnn-frozen2": ("cnn", 4, 2, 1.0),
        "resnet20-full": ("resnet20", 20, 0, 1.0), "resnet20-frozen10": ("resnet20", 20, 10, 1.0),
        "resnet20-frozen10-width0.25": ("resnet20", 20, 10, 0.25)}
RUNTIMES = ("native", "native_shipped", "native_before", "ort", "torch_set", "plain_torch")
DEFAULT_RUNTIMES = ("native", "ort", "torch_set", "plain_torch")


def config_of(name: str):
    from edgefl.trainconfig import TrainConfig
    _, layers, frozen, width = SETS[name]
    return TrainConfig(num_layers=layers, frozen_prefix=frozen, head_start=None if width == 1 else frozen + 1,
                       head_width=width, batch_size=BATCH)


def state_of(model: str):
    import torch

    from edgefl.zoo import ModelRef, build
    torch.manual_seed(0)
    return build(ModelRef.of(model)).state_dict()


def prepare(name: str, work: Path, backends=("executorch", "ort", "torch")) -> dict[str, Path]:
    """Each backend's set exported once under `work` (reused by later runs), and the local data."""
    import numpy as np

    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import export_set
    from edgefl.zoo import ModelRef, build
    model = SETS[name][0]
    ref, out = ModelRef.of(model), {}
    for backend in backends:
        folder = work / name / backend
        if not (folder / "manifest.json").is_file():
            t0 = time.time()
            export_set(ref, config_of(name), state_of(model), get_backend(backend), folder)
            print(f"  exported {name} for {backend} in {time.time() - t0:.0f} s", flush=True)
        out[backend] = folder
    data = work / name / "data"
    if not (data / "y.npy").is_file():
        data.mkdir(parents=True, exist_ok=True)
        m = build(ref)
        rng = np.random.default_rng(0)
        np.save(data / "x.npy", rng.standard_normal((EXAMPLES, *m.input_shape)).astype(np.float32))
        np.save(data / "y.npy", rng.integers(0, m.num_classes, EXAMPLES))
    out["data"] = data
    return out


def run_json(argv: list[str], env: dict | None = None, unset: tuple[str, ...] = ()) -> dict:
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env={**inherited, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name}: " + (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1])
    return json.loads(r.stdout.strip().splitlines()[-1] if "{" in r.stdout.strip().splitlines()[-1] else r.stdout)


def native_step(binary: Path, paths: dict, steps: int, kernels: str, prefix: list[str] = (),
                env: dict | None = None) -> dict:
    r = run_json([*prefix, str(binary), "--artifacts", str(paths["executorch"]), "--data", str(paths["data"]),
                  "--steps", str(steps), "--threads", "1", "--kernels", kernels, "--seed", "0"],
                 env={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), **(env or {})})
    return {"step_seconds": r["step_seconds"], "peak_rss_bytes": r["peak_rss_bytes"],
            "loss_first": r["loss_first"], "loss_last": r["loss_last"], "cpu_level": r.get("cpu_level"),
            "gemm_level": r.get("gemm_level")}


def device_train_step(runtime: str, folder: Path, data: Path, steps: int) -> dict:
    r = run_json([sys.executable, "-m", "edgefl.device_runtime.cli", "train", "--artifacts", str(folder),
                  "--data", str(data), "--steps", str(steps), "--threads", "1", "--eval-examples", "0",
                  "--runtime", runtime, "--trainer", "python", "--format", "json"])
    return {"step_seconds": r["step_seconds"], "peak_rss_bytes": r["peak_rss_bytes"],
            "loss_first": r["first_step_loss"], "loss_last": r["last_step_loss"]}


def plain_torch_child(name: str, data: Path, steps: int) -> dict:
    """The eager split model trained by a bare loop (this process: its own peak)."""
    import numpy as np
    import torch

    from edgefl.export.split import split
    from edgefl.server.submodel import index_sets
    from edgefl.zoo import ModelRef
    torch.set_num_threads(1)
    ref, config = ModelRef.of(SETS[name][0]), config_of(name)
    parts = split(ref, config, state_of(ref.name), index_sets(ref, config))
    opt = torch.optim.SGD(parts.suffix.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-5)
    x, y = np.load(data / "x.npy"), np.load(data / "y.npy")
    rng, losses = np.random.default_rng(0), []
    parts.suffix.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = np.sort(rng.permutation(len(x))[:BATCH])
        features = parts.features(torch.from_numpy(x[idx]))
        loss, _ = parts.suffix(*features, torch.from_numpy(y[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    step_s = (time.perf_counter() - t0) / steps
    hwm = [int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")]
    return {"step_seconds": step_s, "peak_rss_bytes": hwm[0] if hwm else resource.getrusage(0).ru_maxrss * 1024,
            "loss_first": losses[0], "loss_last": losses[-1]}


def plain_torch_step(name: str, data: Path, steps: int) -> dict:
    # glibc's default allocator, as a torch user runs it: under the device's 128 KiB mmap threshold (what the
    # edgefl runtimes run with, device_runtime/peaks.py) every large tensor is a fresh mapping, and a step of
    # plain torch was 1.5x (the CNN) to 1.9x (ResNet-20 frozen 10) slower here
    return run_json([sys.executable, __file__, "--plain-child", name, "--data", str(data), "--steps", str(steps)],
                    env={"OMP_NUM_THREADS": "1"}, unset=("MALLOC_MMAP_THRESHOLD_",))


def measure_set(name: str, paths: dict, binary: Path, steps: int, runs: int, runtimes: list[str],
                before: tuple[Path, ...] | None = None) -> dict:
    samples = {r: [] for r in runtimes}
    for i in range(runs):
        for runtime in runtimes:            # in turn: each round sees every runtime under the same load
            if runtime == "native":
                s = native_step(binary, paths, steps, "edgefl")
            elif runtime == "native_shipped":
                s = native_step(binary, paths, steps, "shipped")
            elif runtime == "native_before":
                s = native_step(before[0], {"executorch": before[1] / name / "executorch", "data": paths["data"]},
                                steps, "edgefl")
            elif runtime == "ort":
                s = device_train_step("ort", paths["ort"], paths["data"], steps)
            elif runtime == "torch_set":
                s = device_train_step("torch", paths["torch"], paths["data"], steps)
            else:
                s = plain_torch_step(name, paths["data"], steps)
            samples[runtime].append(s)
            print(f"  {name} run {i + 1} {runtime:15} {s['step_seconds'] * 1e3:8.1f} ms  "
                  f"peak {s['peak_rss_bytes'] / 2**20:6.1f} MiB", flush=True)
    row = {}
    for runtime, ss in samples.items():
        row[runtime] = {"step_ms": statistics.median(s["step_seconds"] for s in ss) * 1e3,
                        "step_ms_runs": [s["step_seconds"] * 1e3 for s in ss],
                        "peak_rss_bytes": int(statistics.median(s["peak_rss_bytes"] for s in ss)),
                        "loss_first": ss[0]["loss_first"], "loss_last": ss[0]["loss_last"]}
        for key in ("cpu_level", "gemm_level"):
            if ss[0].get(key):
                row[runtime][key] = ss[0][key]
    if "plain_torch" in row:
        base = row["plain_torch"]["step_ms"]
        for runtime in row:
            row[runtime]["over_plain_torch"] = row[runtime]["step_ms"] / base
    if "native" in row and "native_shipped" in row:
        new, old = row["native"], row["native_shipped"]
        row["native_edgefl_over_shipped"] = {
            "step": new["step_ms"] / old["step_ms"], "peak_rss": new["peak_rss_bytes"] / old["peak_rss_bytes"],
            "same_losses": (new["loss_first"], new["loss_last"]) == (old["loss_first"], old["loss_last"])}
    return row


def qemu_column(name: str, paths: dict, x86: dict, steps: int, runs: int, before: tuple = ()) -> dict:
    """Both kernel sets' aarch64 step under qemu-user over their own x86 step (relative only)."""
    import shutil

    from edgefl.device_runtime import native
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        return {"skipped": "no qemu-aarch64 (apt-get install qemu-user-static)"}
    binary = native.build("linux-aarch64")
    # the cross toolchain's libc (tests/integration/test_native_aarch64.py runs the trainer the same way)
    prefix, env = [qemu, "-L", "/usr/aarch64-linux-gnu"], {"LD_LIBRARY_PATH": str(native.runtime_libraries("linux-aarch64"))}
    out = {}
    runs_of = {"native": (binary, paths, "edgefl"), "native_shipped": (binary, paths, "shipped")}
    if len(before) == 3:
        runs_of["native_before"] = (before[2], {"executorch": before[1] / name / "executorch",
                                                "data": paths["data"]}, "edgefl")
    runs_of = {key: spec for key, spec in runs_of.items() if key in x86}
    times: dict = {key: [] for key in runs_of}
    for _ in range(runs):                  # in turn, as on x86: load on the machine falls on every build alike
        for key, (program, sets, kernels) in runs_of.items():
            times[key].append(native_step(program, sets, steps, kernels, prefix, env)["step_seconds"] * 1e3)
    for key, ms in times.items():
        out[key] = {"step_ms_under_qemu": statistics.median(ms), "step_ms_under_qemu_runs": ms,
                    "over_x86": statistics.median(ms) / x86[key]["step_ms"]}
    if "native" in out and "native_shipped" in out:
        out["edgefl_over_shipped_under_qemu"] = (out["native"]["step_ms_under_qemu"]
                                                 / out["native_shipped"]["step_ms_under_qemu"])
    if "native" in out and "native_before" in out:
        out["native_over_before_under_qemu"] = (out["native"]["step_ms_under_qemu"]
                                                / out["native_before"]["step_ms_under_qemu"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--runtimes", default=",".join(DEFAULT_RUNTIMES))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--qemu", action="store_true")
    p.add_argument("--qemu-steps", type=int, default=5, help="steps per run under qemu (emulation is slow)")
    p.add_argument("--qemu-runs", type=int, help="runs in turn under qemu (default: --runs; a ResNet-20 step is "
                                                  "about a minute there)")
    p.add_argument("--work", type=Path, help="export cache (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "device_speed.json")
    p.add_argument("--before", help="BINARY:WORK: another trainer build and the sets its exporter wrote")
    p.add_argument("--plain-child", help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_child:
        print(json.dumps(plain_torch_child(args.plain_child, args.data, args.steps)))
        return 0
    from edgefl.device_runtime.native import require_trainer
    sets, runtimes = args.sets.split(","), args.runtimes.split(",")
    unknown = [s for s in sets if s not in SETS] + [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        print(f"device_speed: unknown set or runtime {', '.join(unknown)}; sets: {', '.join(SETS)}; runtimes: "
              f"{', '.join(RUNTIMES)}", file=sys.stderr)
        return 2
    binary = require_trainer()
    before = None
    if args.before:
        before = tuple(Path(part) for part in args.before.split(":", 2))
        runtimes = [*runtimes, "native_before"] if "native_before" not in runtimes else runtimes
    work = args.work or Path(tempfile.mkdtemp(prefix="device_speed-"))
    backends = [b for b, r in (("executorch", "native"), ("executorch", "native_shipped"), ("ort", "ort"),
                               ("torch", "torch_set")) if r in runtimes]
    result = {"machine": platform.machine(), "processor": platform.processor() or None, "cpus": os.cpu_count(),
              "threads": 1, "steps": args.steps, "runs": args.runs, "batch_size": BATCH,
              "qemu_steps": args.qemu_steps if args.qemu else None,
              "qemu_runs": (args.qemu_runs or args.runs) if args.qemu else None,
              "load_average_at_start": os.getloadavg()[0], "sets": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    every = {}
    for name in sets:
        print(name, flush=True)
        every[name] = paths = prepare(name, work, tuple(dict.fromkeys(backends)))
        row = measure_set(name, paths, binary, args.steps, args.runs, runtimes, before)
        if "native_before" in row:
            row["native_over_before"] = {"step": row["native"]["step_ms"] / row["native_before"]["step_ms"],
                                         "peak_rss": row["native"]["peak_rss_bytes"]
                                         / row["native_before"]["peak_rss_bytes"]}
        result["sets"][name] = row
        result["load_average_at_end"] = os.getloadavg()[0]     # a shared machine: how busy it was
        args.out.write_text(json.dumps(result, indent=2) + "\n")      # each set as it finishes
    # the aarch64 column after every x86 figure: emulation takes most of the run, and its figures are ratios,
    # so work beside it spoils no x86 step time
    for name in sets if args.qemu else ():
        print(f"{name} under qemu", flush=True)
        row = result["sets"][name]
        if "native" in row:
            row["aarch64_qemu_relative"] = qemu_column(name, every[name], row, args.qemu_steps,
                                                       args.qemu_runs or args.runs, before or ())
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
