"""What a device holds, per agent kind x runtime: the agent's idle and peak resident memory, its training
process's peak, against what the plan predicted for the whole device and the group's budget.

One served run per (agent, runtime) on a real mosquitto (`edgefl fleet up --agent ...`, `edgefl serve`), one
device, `--rounds` rounds of FedAvg on the CNN. The agent's VmRSS is sampled from outside every 50 ms
(/proc/<pid>/status) from the moment it is online; idle is its VmRSS before the first instruction, peak its
VmHWM after the last round. The training process's peak is the report's (`child_peak_bytes`), the whole
device's the report's `peak_rss_bytes` (agent + training process).

    python bench/device_memory.py [--rounds 3] [--out bench/results/device_memory.json]

The agent terms of the cost model (edgefl.cost.constants.AGENTS): per kind, the largest agent peak this
measures less its two copies of the round's upload (the trained tensors), rounded up to a MiB.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MiB = 2**20
# the native agent trains ExecuTorch only (a fleet file refuses it for another runtime)
CASES = [("native", "executorch"), ("python", "executorch"), ("python", "ort"), ("python", "torch")]


def vm(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class Sampler(threading.Thread):
    """The agent's VmRSS every 50 ms: (seconds since start, bytes)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.samples, self.done = pid, [], threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.done.wait(0.05):
            try:
                self.samples.append((time.monotonic() - t0, vm(self.pid, "VmRSS")))
            except (OSError, StopIteration):
                return


def measure(agent: str, runtime: str, rounds: int, budget: str) -> dict:
    from served_run import ServedRun, write_plan

    with tempfile.TemporaryDirectory(prefix="edgefl-devmem-") as tmp:
        folder = Path(tmp)
        text = (f"fleet:\n  name: one\n  groups:\n    g: {{count: 1, runtime: {runtime}, agent: {agent}, "
                f"memory_budget: {budget}, examples: 400}}\n")
        fleet, plan = write_plan(folder, text, "fedavg", rounds)
        with ServedRun(folder, fleet, plan, train_limit=400, agent=agent) as run:
            pid = None
            for _ in range(600):
                pid = run.device_pids().get("g-0")
                if pid:
                    break
                time.sleep(0.1)
            assert pid, run.logs()
            time.sleep(3.0)                   # online and idle: nothing sent yet
            idle = vm(pid, "VmRSS")
            sampler = Sampler(pid)
            sampler.start()
            history = run.serve(folder / "state", rounds, "--round-timeout", "600")
            agent_hwm = vm(pid, "VmHWM")
            sampler.done.set()
        records = history["rounds"]
        predicted = json.loads(plan.read_text())["groups"]["g"]["steps"][0]["predicted"]
        metrics = [r["device_metrics"].get("g-0", {}) for r in records]
        return {"agent": agent, "runtime": runtime, "rounds": rounds, "upload_bytes": predicted["upload_bytes"],
                "budget_bytes": int(
                    json.loads(plan.read_text())["groups"]["g"]["budget"]["memory_bytes"]),
                "agent_idle_rss_bytes": idle, "agent_peak_bytes": agent_hwm,
                "agent_rss_sampled_max_bytes": max((b for _, b in sampler.samples), default=idle),
                "child_peak_bytes": [m.get("child_peak_bytes") for m in metrics],
                "device_peak_bytes": [r["measured_peak_bytes"].get("g-0") for r in records],
                "predicted_peak_bytes": predicted["peak_memory_bytes"],
                "predicted_agent_bytes": predicted.get("agent_bytes", 0),
                "status": [("ok" if "g-0" in (r.get("examples") or {}) else (r.get("failed") or {}).get("g-0", "missing"))
                           for r in records]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", default="1GiB", help="the group's memory budget (large: nothing is refused)")
    ap.add_argument("--cases", default=",".join(f"{a}:{r}" for a, r in CASES),
                    help="agent:runtime pairs, comma-separated")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "device_memory.json")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        agent, runtime = case.split(":")
        row = measure(agent, runtime, args.rounds, args.budget)
        rows.append(row)
        print(f"{agent:6} {runtime:10} agent idle {row['agent_idle_rss_bytes'] / MiB:6.1f} MiB, peak "
              f"{row['agent_peak_bytes'] / MiB:6.1f} MiB; child peak {max(filter(None, row['child_peak_bytes']), default=0) / MiB:6.1f} MiB; "
              f"device {max(filter(None, row['device_peak_bytes']), default=0) / MiB:6.1f} MiB <= predicted "
              f"{row['predicted_peak_bytes'] / MiB:6.1f} MiB; {row['status']}", flush=True)
    per_kind: dict[str, int] = {}
    for row in rows:
        own = row["agent_peak_bytes"] - 2 * row["upload_bytes"]
        per_kind[row["agent"]] = max(per_kind.get(row["agent"], 0), own)
    out = {"machine": platform.machine(), "python": platform.python_version(), "rounds": args.rounds, "rows": rows,
           "agent_resident_bytes": {k: -(-v // MiB) * MiB for k, v in per_kind.items()}}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"agent constants (max peak per kind, MiB up): "
          f"{ {k: v // MiB for k, v in out['agent_resident_bytes'].items()} } -> {args.out}")


if __name__ == "__main__":
    main()
