"""FedAvg three ways, back to back on this machine: edgefl emulate, Flower's simulation, a lean loop.

Workloads (issue 3, item 7), both the 2-conv CNN on Fashion-MNIST, batch 32, 1 local epoch, SGD lr 0.05
(momentum 0.9, weight decay 1e-5, cosine-annealed to 0.005 over the rounds, as `edgefl emulate --lr 0.05`
does), 20 rounds, test accuracy measured once, after the last round:
  compute_bound:  100 clients iid over the 60,000 training images, 10 per round;
  overhead_bound: 1000 clients with 20 images each (a seeded 20,000-image subset), 100 per round.

Systems, each in its own process tree, started cold:
  edgefl: `python -m edgefl emulate --method fedavg ...` (main environment), a one-group fleet of N devices;
  flower: a SuperLink in simulation mode started by this script (own port, own FLWR_HOME and Ray temp dir)
          and `flwr run bench/flower_app <link> --stream`, Flower's current default simulation path, from the
          environment in $EDGEFL_BENCH_VENV (default .venv-bench) holding flwr[simulation] (pyproject's
          `bench` extra) and torch 2.13.0; default client resources (2 CPUs per client);
  lean:   bench/lean_fedavg.py (main environment).
Same data, partition, initial weights, learning rates and seeds everywhere: this script computes the
partition with edgefl's own partitioner and the per-round client sample, learning rate and local seed as
edgefl's coordinator does, hands them to Flower (whose seeded client selection is the one step its FedAvg
overrides) and to the lean loop, and checks afterwards that edgefl sampled the same clients.

Per system: startup_s (launch -> first round starts), round_loop_s (first round's start -> last round's
end, final evaluation included), end_to_end_s (launch -> results on disk and the command returned),
steady_rounds_per_s (rounds 2..R; Flower starts Ray lazily inside round 1), peak RSS of the process tree
(sampled every 0.2 s, children included), final accuracy. Headline keys: speedup (Flower end-to-end /
edgefl's, compute_bound), speedup_overhead_bound (edgefl steady rounds/s over Flower's, overhead_bound),
vs_lean (edgefl round loop / lean's, compute_bound), rss_ratio (edgefl peak / Flower peak, compute_bound).

Setup:  python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 -e '.[bench]'
Run:    .venv/bin/python bench/emulate_vs_flower.py [--rounds 20] [--workloads compute_bound,overhead_bound]
Writes bench/results/emulate_vs_flower.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "flower_app"))
from fedbench import task  # noqa: E402
from proctree import TreeSampler, stop_tree, wait_for  # noqa: E402

from edgefl.data import (  # noqa: E402
    load_dataset,
    parse_partition,
    subset,  # noqa: E402  (the subset `edgefl emulate --train-limit` takes)
)
from edgefl.fleet import parse_fleet  # noqa: E402
from edgefl.server.coordinator import Coordinator, LoopSettings  # noqa: E402
from edgefl.zoo import ModelRef, build  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "emulate_vs_flower.json"
APP = ROOT / "bench" / "flower_app"
SEED, LR, LR_FINAL, BATCH, EPOCHS = 0, 0.05, 0.005, 32, 1


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    clients: int
    per_round: int
    train_limit: int | None = None     # None: the whole training set


WORKLOADS = {w.name: w for w in (Workload("compute_bound", 100, 10), Workload("overhead_bound", 1000, 100, 20_000))}


def fleet_yaml(w: Workload) -> str:
    return f"fleet:\n  name: {w.name}\n  groups:\n    c: {{count: {w.clients}, memory_budget: 8GiB, runtime: torch}}\n"


def prepare(w: Workload, rounds: int, folder: Path) -> dict:
    """The inputs every system shares, written to `folder`; returns their paths and the schedule."""
    train = subset(load_dataset("fashion-mnist", split="train"), w.train_limit, SEED)
    test = load_dataset("fashion-mnist", split="test")
    shares = parse_partition("iid").split(train.y, w.clients, SEED)
    raw = {k: np.rint(d.x * 255).astype(np.uint8) for k, d in (("train", train), ("test", test))}
    assert np.array_equal(task.images(raw["train"]), train.x), "uint8 round trip must rebuild edgefl's floats"
    np.savez(folder / "data.npz", x_train=raw["train"], y_train=train.y, x_test=raw["test"], y_test=test.y,
             partition_indices=np.concatenate(shares), partition_offsets=np.cumsum([0] + [len(s) for s in shares]))

    fleet = parse_fleet(fleet_yaml(w))
    settings = LoopSettings(rounds=rounds, clients_per_round=w.per_round, seed=SEED, lr=LR, lr_final=LR_FINAL)
    schedule = make_schedule(fleet, settings)
    (folder / "schedule.json").write_text(json.dumps(schedule))
    (folder / "fleet.yaml").write_text(fleet_yaml(w))
    torch.manual_seed(SEED)            # as edgefl's server model initialises the global weights
    state = build(ModelRef.of("cnn", num_classes=10, input_shape=(1, 28, 28))).state_dict()
    np.savez(folder / "initial.npz", *[v.numpy() for v in state.values()])
    return {"folder": folder, "schedule": schedule, "rounds": rounds}


def make_schedule(fleet, settings: LoopSettings) -> dict:
    """Per round: the devices edgefl's coordinator samples, their partition indices (sorted device order),
    the local seed it gives each and the round's learning rate."""
    from edgefl.planning.strategies import get_strategy

    # only its sample() is used; FedAvg draws from every device (no pool)
    sampler = Coordinator(fleet, None, get_strategy("fedavg"), None, None, settings, examples=len)
    index = {d: i for i, d in enumerate(sampler.devices)}
    rounds = []
    for r in range(1, settings.rounds + 1):
        sampled = sampler.sample(r)
        seeds = [(zlib.crc32(f"{settings.seed}/{d}".encode()) & 0x7FFFFFFF) + r for d in sampled]
        rounds.append({"round": r, "devices": sampled, "clients": [index[d] for d in sampled], "seeds": seeds,
                       "lr": settings.lr_at(r)})
    return {"rounds": rounds}


def timings(launch: float, starts: list[float], ends: list[float], done: float, sampler: TreeSampler,
            cpu_total: float = 0.0) -> dict:
    """Wall-clock figures from the round boundaries, and the CPU seconds the process tree spent in each
    phase (interpolated from the sampler's timeline; `cpu_total`: the exact count where the OS gave one)."""
    steady = sum(e - s for s, e in zip(starts[1:], ends[1:]))
    cpu = sampler.cpu_at
    steady_cpu = sum(cpu(e) - cpu(s) for s, e in zip(starts[1:], ends[1:]))
    return {"startup_s": starts[0] - launch, "round_loop_s": ends[-1] - starts[0], "end_to_end_s": done - launch,
            "first_round_s": ends[0] - starts[0],
            "steady_rounds_per_s": (len(starts) - 1) / steady if steady > 0 else None,
            "rounds_per_s": len(starts) / (ends[-1] - starts[0]),
            "startup_cpu_s": cpu(starts[0]), "round_loop_cpu_s": cpu(ends[-1]) - cpu(starts[0]),
            "cpu_s": max(cpu_total, sampler.timeline[-1][1] if sampler.timeline else 0.0),
            "steady_cpu_s_per_round": steady_cpu / max(len(starts) - 1, 1),
            "peak_rss_bytes": sampler.peak_bytes, "peak_processes": sampler.peak_processes}


def run_measured(cmd: list[str], env: dict, log: Path, on_tick=None, extra_roots=()) -> tuple[float, float, TreeSampler, float]:
    """Run `cmd` to completion under a process-tree sampler: (launch time, end time, sampler, CPU seconds
    of the process and the children it waited for, from the OS)."""
    with open(log, "w") as out, TreeSampler(extra_roots, on_tick=on_tick) as sampler:
        launch = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        sampler.add(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        done = time.time()
    if code != 0:
        raise SystemExit(f"{cmd[:4]} failed with exit code {code}; its log:\n{log.read_text()[-3000:]}")
    return launch, done, sampler, usage.ru_utime + usage.ru_stime


def run_edgefl(w: Workload, inputs: dict) -> dict:
    folder, rounds = inputs["folder"], inputs["rounds"]
    out = folder / "edgefl-run"
    history = out / "history.json"
    seen: list[tuple[float, dict]] = []          # (write time, content) of the first history version seen

    def watch():
        if not seen and history.exists():
            try:
                seen.append((history.stat().st_mtime, json.loads(history.read_text())))
            except (OSError, ValueError):
                pass                               # replaced while reading: caught at the next tick
    cmd = [sys.executable, "-m", "edgefl", "emulate", "--devices", str(folder / "fleet.yaml"), "--model", "cnn",
           "--dataset", "fashion-mnist", "--method", "fedavg", "--rounds", str(rounds),
           "--clients-per-round", str(w.per_round), "--partition", "iid", "--seed", str(SEED),
           "--batch-size", str(BATCH), "--local-epochs", str(EPOCHS), "--lr", str(LR), "--eval-every", str(rounds),
           "-o", str(out)] + (["--train-limit", str(w.train_limit)] if w.train_limit else [])
    launch, done, sampler, cpu = run_measured(cmd, os.environ.copy(), folder / "edgefl.log", on_tick=watch)
    records = json.loads(history.read_text())["rounds"]
    for rec, plan in zip(records, inputs["schedule"]["rounds"], strict=True):
        if sorted(rec["sampled"]) != plan["devices"] or sum(rec["participating_devices"].values()) != w.per_round:
            raise SystemExit(f"edgefl round {rec['round']} trained other clients than the schedule")
    # the coordinator times each round (wall_s); the history file's write times place them on the clock
    first_time, first = seen[0]
    start = first_time - sum(r["wall_s"] for r in first["rounds"])
    starts, ends, t = [], [], start
    for r in records:
        starts.append(t)
        ends.append(t + r["wall_s"])
        t = ends[-1]
    ends[-1] = history.stat().st_mtime            # the loop's real end, callbacks between rounds included
    return {**timings(launch, starts, ends, done, sampler, cpu), "final_accuracy": records[-1]["accuracy"]}


def run_lean(w: Workload, inputs: dict) -> dict:
    folder = inputs["folder"]
    cmd = [sys.executable, str(ROOT / "bench" / "lean_fedavg.py"), "--data", str(folder / "data.npz"),
           "--schedule", str(folder / "schedule.json"), "--initial", str(folder / "initial.npz"),
           "--out", str(folder / "lean.json"), "--batch-size", str(BATCH), "--local-epochs", str(EPOCHS)]
    launch, done, sampler, cpu = run_measured(cmd, os.environ.copy(), folder / "lean.log")
    res = json.loads((folder / "lean.json").read_text())
    return {**timings(launch, res["round_start"], res["round_end"], done, sampler, cpu),
            "final_accuracy": res["accuracy"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flower_env(venv: Path, home: Path) -> dict:
    return {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "RAY_TMPDIR": str(home / "ray"),
            "VIRTUAL_ENV": str(venv)}


def run_flower(w: Workload, inputs: dict, venv: Path) -> dict:
    folder = inputs["folder"]
    home, port = folder / "flwr-home", free_port()
    (home / "ray").mkdir(parents=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    env = flower_env(venv, home)
    run_config = " ".join(f'{k}="{folder / v}"' for k, v in (("data", "data.npz"), ("schedule", "schedule.json"),
                                                            ("initial", "initial.npz"), ("out", "flower.json")))
    link_log = open(folder / "superlink.log", "w")
    launch = time.time()
    link = subprocess.Popen([str(venv / "bin" / "flower-superlink"), "--insecure", "--simulation", "--isolation",
                             "subprocess", "--host", "127.0.0.1", "--port", str(port),
                             "--disable-runtime-dependency-installation"],
                            stdout=link_log, stderr=subprocess.STDOUT, env=env, cwd=folder)
    try:
        def ready() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                return link.poll() is not None
        if not wait_for(ready, 60) or link.poll() is not None:
            raise SystemExit(f"flower-superlink did not start; see {folder / 'superlink.log'}")
        cmd = [str(venv / "bin" / "flwr"), "run", str(APP), "bench", "--stream",
               "--federation-config", f"num-supernodes={w.clients}", "-c", run_config]
        _, done, sampler, _ = run_measured(cmd, env, folder / "flower.log", extra_roots=[link.pid])
    finally:
        stop_tree(link.pid)
        link_log.close()
    res = json.loads((folder / "flower.json").read_text())
    return {**timings(launch, res["round_start"], res["round_end"], done, sampler),
            "final_accuracy": res["accuracy"], "client_resources": "Flower default (num_cpus=2 per client)"}


def versions(venv: Path) -> dict:
    code = "import flwr, ray, torch; print(flwr.__version__, ray.__version__, torch.__version__)"
    flwr_v, ray_v, torch_v = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                                            text=True, check=True).stdout.split()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "flwr": flwr_v, "ray": ray_v,
            "flower_env_torch": torch_v, "cpus": os.cpu_count()}


def load() -> dict:
    return {"loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--systems", default="edgefl,flower,lean")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for every system (default: each library's own choice)")
    args = p.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)   # inherited by every process of every system
    venv = Path(os.environ.get("EDGEFL_BENCH_VENV", ROOT / ".venv-bench"))
    systems = args.systems.split(",")
    if "flower" in systems and not (venv / "bin" / "flwr").exists():
        raise SystemExit(f"no Flower environment at {venv}; create it with: python3 -m venv .venv-bench && "
                         ".venv-bench/bin/pip install torch==2.13.0 -e '.[bench]' (or set EDGEFL_BENCH_VENV)")
    runners = {"edgefl": run_edgefl, "lean": run_lean, "flower": lambda w, i: run_flower(w, i, venv)}
    result = {"rounds": args.rounds, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "workloads": {},
              "load_before": load()}
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        with tempfile.TemporaryDirectory(prefix="evf-") as tmp:
            inputs = prepare(w, args.rounds, Path(tmp))
            row = {"workload": dataclasses.asdict(w), "systems": {}}
            for system in systems:
                row["systems"][system] = runners[system](w, inputs)
                result["workloads"][name] = row
                save(result, args.output, None)           # a long run keeps what it has measured
                print(f"{name:15} {system:7}", json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                                           for k, v in row["systems"][system].items()}), flush=True)
            row["load_after"] = load()
        result["workloads"][name] = row
    save(result, args.output, venv if "flower" in systems else None)
    print({k: result[k] for k in ("speedup", "speedup_overhead_bound", "vs_lean", "rss_ratio", "goals")})


def save(result: dict, path: Path, venv) -> None:
    result.update(headline(result["workloads"]))
    result["machine"] = versions(venv) if venv is not None else {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def headline(rows: dict) -> dict:
    """The issue's four ratios and its goals, from whatever systems and workloads ran (None where missing)."""
    def get(workload, system, key):
        return rows.get(workload, {}).get("systems", {}).get(system, {}).get(key)

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = {"speedup": ratio(get("compute_bound", "flower", "end_to_end_s"), get("compute_bound", "edgefl", "end_to_end_s")),
           "speedup_overhead_bound": ratio(get("overhead_bound", "edgefl", "steady_rounds_per_s"),
                                           get("overhead_bound", "flower", "steady_rounds_per_s")),
           "speedup_overhead_bound_whole_loop": ratio(get("overhead_bound", "edgefl", "rounds_per_s"),
                                                      get("overhead_bound", "flower", "rounds_per_s")),
           "vs_lean": ratio(get("compute_bound", "edgefl", "round_loop_s"), get("compute_bound", "lean", "round_loop_s")),
           # the same ratios in CPU seconds of each process tree: what each system costs, whatever else runs
           "speedup_cpu": ratio(get("compute_bound", "flower", "cpu_s"), get("compute_bound", "edgefl", "cpu_s")),
           "speedup_overhead_bound_cpu": ratio(get("overhead_bound", "flower", "steady_cpu_s_per_round"),
                                               get("overhead_bound", "edgefl", "steady_cpu_s_per_round")),
           "vs_lean_cpu": ratio(get("compute_bound", "edgefl", "round_loop_cpu_s"),
                                get("compute_bound", "lean", "round_loop_cpu_s")),
           "rss_ratio": ratio(get("compute_bound", "edgefl", "peak_rss_bytes"), get("compute_bound", "flower", "peak_rss_bytes"))}
    gaps = {w: None if None in (get(w, "flower", "final_accuracy"), get(w, "edgefl", "final_accuracy")) else
            round(100 * abs(get(w, "edgefl", "final_accuracy") - get(w, "flower", "final_accuracy")), 3) for w in rows}
    out["accuracy_gap_points"] = gaps
    checks = {"vs_lean <= 1.15": (out["vs_lean"], lambda v: v <= 1.15), "speedup >= 1.3": (out["speedup"], lambda v: v >= 1.3),
              "rss_ratio <= 0.4": (out["rss_ratio"], lambda v: v <= 0.4),
              "speedup_overhead_bound >= 3": (out["speedup_overhead_bound"], lambda v: v >= 3),
              **{f"accuracy within 1 point of Flower ({w})": (g, lambda v: v <= 1.0) for w, g in gaps.items()}}
    out["goals"] = {k: None if v is None else bool(test(v)) for k, (v, test) in checks.items()}
    return out


if __name__ == "__main__":
    main()
