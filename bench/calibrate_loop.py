"""The closed loop on one machine: serve a plan to real ORT device processes, fit the runtime's overhead
from their measured peaks (`edgefl calibrate`), plan again with the calibration, serve again, and compare
how far the cost model's predicted peak was from the measured one in each run.

    python bench/calibrate_loop.py [--runtime ort] [--devices 3] [--rounds 2]

Writes bench/results/calibrate_loop.json: top-level `error_before` / `error_after` (median relative error
of predicted vs measured peak RSS over every report of run 1 / run 2) and the fitted shift.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from mosquitto import Mosquitto  # noqa: E402


def edgefl(*args) -> list[str]:
    return [sys.executable, "-m", "edgefl", *map(str, args)]


def errors(state: Path) -> list[float]:
    rounds = json.loads((state / "history.json").read_text())["rounds"]
    return [abs(r["predicted_peak_bytes"][d] - m) / m for r in rounds for d, m in r["measured_peak_bytes"].items()]


def served_run(folder: Path, broker: Mosquitto, fleet: Path, plan: Path, rounds: int, train_limit: int) -> Path:
    state = folder / "state"
    devices = subprocess.Popen(edgefl("fleet", "up", "--devices", fleet, "--broker", broker.url, "--dataset",
                                      "fashion-mnist", "--train-limit", train_limit, "--workdir", folder / "fleet"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        subprocess.run(edgefl("serve", "--plan", plan, "--broker", broker.url, "--state", state, "--rounds", rounds,
                              "--devices", fleet, "--round-timeout", 600, "--wait-online", 120),
                       check=True, capture_output=True, text=True)
    finally:
        devices.terminate()
        devices.wait(timeout=60)
    return state


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", default="ort", choices=("ort", "torch", "executorch"))
    p.add_argument("--devices", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default="cnn")
    p.add_argument("--method", default="fedolf")
    p.add_argument("--train-limit", type=int, default=1200)
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / "calibrate_loop.json")
    args = p.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="edgefl-calibrate-") as tmp:
        tmp = Path(tmp)
        fleet = tmp / "fleet.yaml"
        fleet.write_text(f"fleet:\n  name: loop\n  groups:\n    dev: {{count: {args.devices}, runtime: {args.runtime}, "
                         f"memory_budget: 4GiB}}\n")
        with Mosquitto(tmp / "broker") as broker:
            plan1, plan2 = tmp / "plan1.json", tmp / "plan2.json"
            subprocess.run(edgefl("plan", "--devices", fleet, "--model", args.model, "--method", args.method,
                                  "--rounds", args.rounds, "-o", plan1, "--format", "json"), check=True, capture_output=True)
            run1 = served_run(tmp / "run1", broker, fleet, plan1, args.rounds, args.train_limit)
            calibration = tmp / "calibration.json"
            subprocess.run(edgefl("calibrate", run1, "-o", calibration), check=True, capture_output=True)
            subprocess.run(edgefl("plan", "--devices", fleet, "--model", args.model, "--method", args.method,
                                  "--rounds", args.rounds, "--calibration", calibration, "-o", plan2, "--format", "json"),
                           check=True, capture_output=True)
            run2 = served_run(tmp / "run2", broker, fleet, plan2, args.rounds, args.train_limit)
            before, after = errors(run1), errors(run2)
            fit = json.loads(calibration.read_text())["fit"][args.runtime]
    result = {"error_before": statistics.median(before), "error_after": statistics.median(after),
              "error_before_max": max(before), "error_after_max": max(after),
              "shift_bytes": fit["shift_bytes"], "reports": [len(before), len(after)],
              "setup": vars(args) | {"output": None}, "machine": platform.machine(),
              "date": time.strftime("%Y-%m-%d"), "runtime_seconds": round(time.time() - started, 1)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("error_before", "error_after", "shift_bytes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
