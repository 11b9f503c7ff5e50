"""What edgefl inside Flower costs: `edgefl flower` vs `edgefl emulate` vs plain Flower FedAvg, back to back.

The overhead-bound workload of bench/emulate_vs_flower.py (FedAvg, the 2-conv CNN, 1000 clients of 20
Fashion-MNIST images, 100 per round, batch 32, 1 local epoch), the same inputs for all three (that script's
`prepare`: data, partition, schedule, initial weights):
  emulate: `python -m edgefl emulate` (main environment), that script's run;
  flower:  plain Flower (bench/flower_app, Flower's message-API FedAvg with the schedule's clients), `flwr run`
           on a SuperLink in simulation mode, that script's run, from $EDGEFL_FLOWER_VENV (default .venv-flower);
  bridge:  `python -m edgefl flower` with emulate's options, from the same Flower environment.
Per system: end-to-end wall time (launch -> the command returned) and the peak RSS of its whole process tree
(Ray's daemons and actors, the SuperLink included; bench/proctree.py, sampled every 0.2 s). Headline:
bridge_over_flower (bridge end-to-end / plain Flower's) and bridge_over_emulate, and the same for peak RSS.

Run:    .venv/bin/python bench/flower_bridge.py [--rounds 20]
Writes bench/results/flower_bridge.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import emulate_vs_flower as evf  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "flower_bridge.json"


def run_bridge(w: evf.Workload, inputs: dict, venv: Path) -> dict:
    folder, rounds = inputs["folder"], inputs["rounds"]
    out = folder / "bridge-run"
    cmd = [str(venv / "bin" / "python"), "-m", "edgefl", "flower", "--devices", str(folder / "fleet.yaml"),
           "--model", "cnn", "--dataset", "fashion-mnist", "--method", "fedavg", "--rounds", str(rounds),
           "--clients-per-round", str(w.per_round), "--partition", "iid", "--seed", str(evf.SEED),
           "--batch-size", str(evf.BATCH), "--local-epochs", str(evf.EPOCHS), "--lr", str(evf.LR),
           "--eval-every", str(rounds), "-o", str(out)] + (["--train-limit", str(w.train_limit)] if w.train_limit else [])
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    launch, done, sampler, cpu = evf.run_measured(cmd, env, folder / "bridge.log")
    records = json.loads((out / "history.json").read_text())["rounds"]
    for rec, plan in zip(records, inputs["schedule"]["rounds"], strict=True):
        if sorted(rec["sampled"]) != plan["devices"]:
            raise SystemExit(f"edgefl flower round {rec['round']} trained other clients than the schedule")
    return {"end_to_end_s": done - launch, "cpu_s": cpu, "peak_rss_bytes": sampler.peak_bytes,
            "peak_processes": sampler.peak_processes, "round_loop_s": sum(r["wall_s"] for r in records),
            "final_accuracy": records[-1]["accuracy"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--workload", default="overhead_bound", choices=sorted(evf.WORKLOADS))
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    venv = Path(os.environ.get("EDGEFL_FLOWER_VENV", ROOT / ".venv-flower"))
    if not (venv / "bin" / "flwr").exists():
        raise SystemExit(f"no Flower environment at {venv}; create it with: python3 -m venv .venv-flower && "
                         ".venv-flower/bin/pip install -e '.[flower,report]' (or set EDGEFL_FLOWER_VENV)")
    w = evf.WORKLOADS[args.workload]
    result = {"rounds": args.rounds, "workload": w.name, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "load_before": evf.load(), "systems": {}}
    runners = {"emulate": evf.run_edgefl, "flower": lambda w, i: evf.run_flower(w, i, venv),
               "bridge": lambda w, i: run_bridge(w, i, venv)}
    with tempfile.TemporaryDirectory(prefix="flower-bridge-") as tmp:
        inputs = evf.prepare(w, args.rounds, Path(tmp))
        for name, run in runners.items():
            row = run(w, inputs)
            result["systems"][name] = {k: row[k] for k in ("end_to_end_s", "cpu_s", "peak_rss_bytes",
                                                           "final_accuracy") if k in row}
            print(f"{name:8}", json.dumps(result["systems"][name]), flush=True)
    s = result["systems"]
    result["load_after"] = evf.load()
    result["bridge_over_flower"] = s["bridge"]["end_to_end_s"] / s["flower"]["end_to_end_s"]
    result["bridge_over_emulate"] = s["bridge"]["end_to_end_s"] / s["emulate"]["end_to_end_s"]
    result["bridge_rss_over_flower"] = s["bridge"]["peak_rss_bytes"] / s["flower"]["peak_rss_bytes"]
    result["bridge_rss_over_emulate"] = s["bridge"]["peak_rss_bytes"] / s["emulate"]["peak_rss_bytes"]
    result["machine"] = evf.versions(venv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print({k: v for k, v in result.items() if k.startswith("bridge_")})


if __name__ == "__main__":
    main()
