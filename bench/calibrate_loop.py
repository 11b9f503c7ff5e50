"""The closed loop on one machine: serve a plan to real device processes, calibrate from their measured
peaks (`edgefl calibrate`), plan again with the calibration, serve again; and check that the calibration
learned the runtimes, not the data.

    python bench/calibrate_loop.py [--runtimes ort,ort,executorch,torch] [--examples 15000] [--rounds 2]
                                   [--model cnn] [--method fedolf]

One group per runtime listed (a runtime listed twice: a group of two devices), each device holding a
Fashion-MNIST share of `--examples` examples (the fleet's `examples:`; 4 devices x 15,000 is the whole
training split) and training one pass over it per round. Each group's memory budget is the predicted peak
of the model trained whole under the built-in constants plus 2%, so it is admitted with little to spare:
a calibration that learned a device's data as runtime overhead would exclude it.

Writes bench/results/calibrate_loop.json: per run, per runtime, measured / predicted peak over every
report (`band`, goal [0.85, 1.0]); the fitted shift per runtime and the refused reports; which groups
each plan admitted (`admits_every_group_again`: the calibrated plan admits every group the first did).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from mosquitto import Mosquitto  # noqa: E402

GOAL = (0.85, 1.0)


def edgefl(*args) -> list[str]:
    return [sys.executable, "-m", "edgefl", *map(str, args)]


def bands(state: Path, plan: dict) -> dict:
    """Per runtime: (min, max) measured / predicted peak over the run's reports, and how many."""
    runtime_of = {name: g["runtime"] for name, g in plan["groups"].items()}
    ratios: dict[str, list[float]] = {}
    for r in json.loads((state / "history.json").read_text())["rounds"]:
        for device, measured in r["measured_peak_bytes"].items():
            ratios.setdefault(runtime_of[r["sampled"][device]], []).append(measured / r["predicted_peak_bytes"][device])
    return {rt: {"min": min(v), "max": max(v), "reports": len(v),
                 "in_goal": GOAL[0] <= min(v) and max(v) <= GOAL[1]} for rt, v in ratios.items()}


def served_run(folder: Path, broker: Mosquitto, fleet: Path, plan: Path, rounds: int) -> Path:
    state = folder / "state"
    devices = subprocess.Popen(edgefl("fleet", "up", "--devices", fleet, "--broker", broker.url, "--dataset",
                                      "fashion-mnist", "--workdir", folder / "fleet"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        subprocess.run(edgefl("serve", "--plan", plan, "--broker", broker.url, "--state", state, "--rounds", rounds,
                              "--devices", fleet, "--round-timeout", 1800, "--wait-online", 300),
                       check=True, capture_output=True, text=True)
    finally:
        devices.terminate()
        devices.wait(timeout=60)
    return state


def fleet_file(path: Path, runtimes: list[str], examples: int, model: str) -> dict[str, int]:
    """One group per runtime; budgets: the whole model's predicted peak under the built-in constants + 2%."""
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext
    from edgefl.zoo import ModelRef

    ctx = PlanContext(parse_fleet("fleet: {groups: {g: {count: 1, memory_budget: 4GiB}}}"), ModelRef.of(model))
    budgets = {rt: int(ctx.cost(ctx.config(), rt).peak_memory_bytes * 1.02) for rt in dict.fromkeys(runtimes)}
    groups = "".join(f"    {rt}: {{count: {n}, runtime: {rt}, memory_budget: {budgets[rt]}, examples: {examples}}}\n"
                     for rt, n in Counter(runtimes).items())
    path.write_text(f"fleet:\n  name: calibrate-loop\n  groups:\n{groups}")
    return budgets


def plan(fleet: Path, out: Path, args, *extra) -> dict:
    subprocess.run(edgefl("plan", "--devices", fleet, "--model", args.model, "--method", args.method, "--rounds",
                          args.rounds, "-o", out, "--format", "json", *extra), check=True, capture_output=True)
    return json.loads(out.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtimes", default="ort,ort,executorch,torch")
    p.add_argument("--examples", type=int, default=15000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default="cnn")
    p.add_argument("--method", default="fedolf")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "calibrate_loop.json")
    args = p.parse_args(argv)
    started = time.time()
    runtimes = args.runtimes.split(",")
    with tempfile.TemporaryDirectory(prefix="edgefl-calibrate-") as tmp:
        tmp = Path(tmp)
        fleet = tmp / "fleet.yaml"
        budgets = fleet_file(fleet, runtimes, args.examples, args.model)
        with Mosquitto(tmp / "broker") as broker:
            plan1 = plan(fleet, tmp / "plan1.json", args)
            run1 = served_run(tmp / "run1", broker, fleet, tmp / "plan1.json", args.rounds)
            calibration = tmp / "calibration.json"
            calibrate = subprocess.run(edgefl("calibrate", run1, "-o", calibration), check=True, capture_output=True,
                                       text=True)
            plan2 = plan(fleet, tmp / "plan2.json", args, "--calibration", calibration)
            run2 = served_run(tmp / "run2", broker, fleet, tmp / "plan2.json", args.rounds)
            cal = json.loads(calibration.read_text())
            admitted = [{n for n, g in p_["groups"].items() if not g["excluded"]} for p_ in (plan1, plan2)]
            result = {
                "run1": bands(run1, plan1), "run2": bands(run2, plan2), "goal": list(GOAL),
                "fit": cal["fit"], "refused": cal["refused"], "calibrate_output": calibrate.stdout.strip().splitlines(),
                "admitted": {"plan1": sorted(admitted[0]), "plan2": sorted(admitted[1])},
                "admits_every_group_again": admitted[0] <= admitted[1],
                "plan2_notes": plan2["notes"], "budgets": budgets,
                "setup": {**{k: v for k, v in vars(args).items() if k != "output"}, "dataset": "fashion-mnist"},
                "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"),
                "runtime_seconds": round(time.time() - started, 1)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("run1", "run2", "admits_every_group_again", "refused")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
