"""`edgefl emulate` with its devices in this process and in Ray actors: rounds per second, peak memory, and the
per-round cost the Ray engine adds.

Workload: the overhead-bound one of bench/emulate_vs_flower.py at a tenth of the fleet, the same work per
round: FedAvg, the 2-conv CNN on Fashion-MNIST, 100 devices with 20 images each (a seeded 2,000-image
subset, iid), all 100 train every round (1 local epoch, batch 32: one step each), lr 0.05 cosine-annealed,
evaluation on 2,000 test images after the last round only. One intra-op torch thread everywhere
(OMP_NUM_THREADS=1), so every engine trains alike and the results are compared bit for bit.

Engines, each in a fresh process (the driver: what `edgefl emulate` runs, via edgefl.engines.local with
the CLI's wiring) and, for Ray, a fresh cluster of `ray start --block` nodes on this machine
(bench/ray_cluster.py):
  local:           devices in the driver (InMemoryTransport), the default engine;
  ray_1node_1cpu:  one node with 1 CPU: one device actor, the same compute as local, so the difference is
                   what Ray adds (serialising weights and reports, scheduling, the object store);
  ray_1node_2cpu:  one node with 2 CPUs: two actors;
  ray_2nodes:      two nodes with 1 CPU each: one actor on each.
This machine has 2 cores shared with the driver, so the two-actor rows show scaling only as far as 2 cores
allow.

Per engine: steady_s_per_round (rounds 2 .. R-1: round 1 starts the actors and puts the data shards in the
object store, round R evaluates), rounds_per_s = 1 / that, steady_cpu_s_per_round (CPU seconds of every
process of the driver and the cluster, daemons included: on a machine shared with other work it says more
than wall time), peak_rss_bytes (summed over all those processes, sampled every 0.2 s), weights_sha256.
Each engine runs --repeats times (default 3), the engines in turn; an engine's row is its run with the median
s/round, with every run's s/round beside it. Headline: ray_overhead_wall = ray_1node_1cpu's s/round over local's
of the same repeat - 1, the median over repeats (goal <= 0.10), with its range; ray_overhead_cpu the same for CPU
seconds; identical = every run's final weights and history equal local's.

Run:    .venv/bin/python bench/emulate_scaling.py [--rounds 6] [--repeats 3] [--engines local,ray_1node_1cpu,...]
        [--per-device 20] [--output bench/results/emulate_scaling.json]
Writes bench/results/emulate_scaling.json (--per-device 200: the same fleet with ten times the training per
device, where Ray's fixed cost per device weighs less).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import psutil  # noqa: E402
from proctree import TreeSampler, tree  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "emulate_scaling.json"
ENGINES = {"local": None, "ray_1node_1cpu": [1], "ray_1node_2cpu": [2], "ray_2nodes": [1, 1]}
DEVICES, TEST, SEED, LR, BATCH = 100, 2000, 0, 0.05, 32


def child(engine: str, address: str | None, rounds: int, per_device: int, out: Path) -> None:
    """One run in this process, as `edgefl emulate --method fedavg` wires it; writes round times and results."""
    import torch

    from edgefl.data import load_dataset, subset
    from edgefl.data.shares import device_shares
    from edgefl.engines.local import emulate
    from edgefl.fleet import parse_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.server.coordinator import LoopSettings
    from edgefl.server.history import record_to_json
    from edgefl.transport.memory import InMemoryTransport
    from edgefl.zoo import ModelRef

    fleet = parse_fleet(f"fleet:\n  groups:\n    c: {{count: {DEVICES}, memory_budget: 8GiB, runtime: torch}}\n")
    train = subset(load_dataset("fashion-mnist", split="train"), DEVICES * per_device, SEED)
    test = subset(load_dataset("fashion-mnist", split="test"), TEST, SEED + 1)
    strategy = get_strategy("fedavg")
    ref = ModelRef.of("cnn", num_classes=10, input_shape=(1, 28, 28))
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=rounds, batch_size=BATCH)), fleet)
    share_of = device_shares(fleet, train, "iid", SEED, source="fashion-mnist")
    settings = LoopSettings(rounds=rounds, clients_per_round=DEVICES, seed=SEED, eval_every=rounds, lr=LR,
                            lr_final=LR / 10)
    ends: list[float] = []
    if engine == "local":
        context = nullcontext(InMemoryTransport)
    else:
        from edgefl.engines.ray import ray_engine
        context = ray_engine(address, plan.model, "cpu")
    with context as transport:
        if engine != "local":
            print(transport.describe(), flush=True)
        records, server = emulate(fleet, plan, strategy, plan.model, train, test,
                                  [share_of[d] for d in sorted(share_of)], settings, "cpu",
                                  lambda r: ends.append(time.time()), transport=transport)
    digest = hashlib.sha256()
    for k in sorted(server.state):
        digest.update(k.encode() + server.state[k].numpy().tobytes())
    history = [{k: v for k, v in record_to_json(r).items() if k != "wall_s"} for r in records]
    out.write_text(json.dumps({"ends": ends, "walls": [r.wall_s for r in records], "accuracy": records[-1].accuracy,
                               "weights_sha256": digest.hexdigest(),
                               "history_sha256": hashlib.sha256(json.dumps(history).encode()).hexdigest(),
                               "torch_threads": torch.get_num_threads()}))


def name_all(sampler: TreeSampler, names: dict) -> None:
    """(pid, start) -> process name (driver, an actor, raylet, gcs_server, ...), for the CPU breakdown."""
    driver = sampler.roots[-1] if sampler.roots else None     # added last, once started
    for p in tree(sampler.roots):
        key = next((k for k in list(sampler.cpu) if k[0] == p.pid), None)
        if key is not None:
            try:       # named again at every tick: a Ray worker takes its actor's name once it becomes one
                names[key] = "driver" if p.pid == driver else p.name()
            except psutil.Error:
                pass


def measure(engine: str, rounds: int, per_device: int, folder: Path) -> dict:
    from ray_cluster import ray_cluster

    cpus, nodes = ENGINES[engine], []
    out, log = folder / f"{engine}.json", folder / f"{engine}.log"
    with (ray_cluster(cpus, nodes=nodes) if cpus else nullcontext((None, os.environ))) as (address, env):
        env = {**env, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--child", engine, "--rounds", str(rounds), "--per-device", str(per_device),
               "--out", str(out)]
        cmd += ["--address", address] if address else []
        names: dict = {}
        sampler = TreeSampler([n.pid for n in nodes])
        sampler.on_tick = lambda: name_all(sampler, names)
        with open(log, "w") as sink, sampler:
            launch = time.time()
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            sampler.add(proc.pid)
            code = proc.wait()
            done = time.time()
    if code != 0:
        raise SystemExit(f"{engine} failed ({code}):\n{log.read_text()[-3000:]}")
    res = json.loads(out.read_text())
    ends, walls = res["ends"], res["walls"]
    steady = range(1, rounds - 1)            # rounds 2 .. R-1
    wall = sum(walls[i] for i in steady) / len(steady)
    cpu = sum(sampler.cpu_at(ends[i]) - sampler.cpu_at(ends[i] - walls[i]) for i in steady) / len(steady)
    return {"nodes_cpus": cpus, "steady_s_per_round": wall, "rounds_per_s": 1 / wall,
            "steady_cpu_s_per_round": cpu, "first_round_s": walls[0], "last_round_s_with_eval": walls[-1],
            "driver_start_to_end_s": done - launch, "peak_rss_bytes": sampler.peak_bytes,
            "peak_processes": sampler.peak_processes, "final_accuracy": res["accuracy"],
            "cpu_s_by_process": by_name(sampler.cpu, names),
            "weights_sha256": res["weights_sha256"], "history_sha256": res["history_sha256"],
            "said": log.read_text().strip().splitlines()[:1] if cpus else []}


def by_name(cpu: dict, names: dict) -> dict:
    """CPU seconds of the whole run (startup and data loading included) by process name, largest first."""
    out: dict = {}
    for key, seconds in cpu.items():
        name = names.get(key, "other")
        out[name] = out.get(name, 0.0) + seconds
    return dict(sorted(((k, round(v, 2)) for k, v in out.items() if v >= 0.05), key=lambda kv: -kv[1]))


def median_run(runs: list[dict]) -> dict:
    """The run with the median steady s/round (the lower middle one of an even count), with every run's
    steady wall and CPU seconds per round beside it."""
    ranked = sorted(runs, key=lambda r: r["steady_s_per_round"])
    return {**ranked[(len(ranked) - 1) // 2],
            "steady_s_per_round_runs": [r["steady_s_per_round"] for r in runs],
            "steady_cpu_s_per_round_runs": [r["steady_cpu_s_per_round"] for r in runs]}


def overheads(local: list[dict], ray: list[dict]) -> dict:
    """What Ray adds per round, wall and CPU: the median over repeats of ray's s/round over local's of the
    same repeat, - 1 (neighbours in time: drift of the machine cancels), with the range over repeats."""
    out = {}
    for kind, key in (("wall", "steady_s_per_round"), ("cpu", "steady_cpu_s_per_round")):
        ratios = [r[key] / l[key] - 1 for l, r in zip(local, ray, strict=True)]
        out[f"ray_overhead_{kind}"] = statistics.median(ratios)
        out[f"ray_overhead_{kind}_range"] = [min(ratios), max(ratios)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--per-device", type=int, default=20, help="training images per device (20: overhead-bound)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine, in turn; each engine's median is kept")
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--child")
    ap.add_argument("--address")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats: at least 1")
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (the first and the last are not steady)")
    if args.child:
        return child(args.child, args.address, args.rounds, args.per_device, args.out)
    engines = args.engines.split(",")
    if unknown := set(engines) - set(ENGINES):
        ap.error(f"--engines: unknown {sorted(unknown)}; choose from {list(ENGINES)}")
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="edgefl-scaling-") as tmp:
        for repeat in range(args.repeats):          # engines in turn: a slow spell of the machine hits each alike
            for engine in engines:
                runs[engine].append(measure(engine, args.rounds, args.per_device, Path(tmp)))
                print(engine, repeat + 1, json.dumps({k: v for k, v in runs[engine][-1].items() if "sha" not in k}),
                      flush=True)
    results = {e: median_run(r) for e, r in runs.items()}
    summary = {"workload": f"fedavg, cnn, Fashion-MNIST, {DEVICES} devices x {args.per_device} images, all {DEVICES} "
                           f"per round, batch {BATCH}, 1 epoch, {args.rounds} rounds, eval once on {TEST} images",
               "rounds": args.rounds, "repeats": args.repeats, "omp_num_threads": 1, "cores": os.cpu_count(),
               "loadavg_1_5_15_after": list(os.getloadavg()), "engines": results}
    if "local" in results:
        base = results["local"]
        summary["identical"] = all(r["weights_sha256"] == base["weights_sha256"]
                                   and r["history_sha256"] == base["history_sha256"] for rs in runs.values() for r in rs)
        if "ray_1node_1cpu" in results:
            summary.update(overheads(runs["local"], runs["ray_1node_1cpu"]))
            summary["ray_overhead_goal"] = 0.10
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "engines"}, indent=2))


if __name__ == "__main__":
    main()
