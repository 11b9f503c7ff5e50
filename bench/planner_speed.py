"""Planner speed: a 100,000-device fleet in 10 groups, every method; and `edgefl plan` wall time.

Writes bench/results/planner_speed.json. Planning time excludes model profiling (profiles are computed
once before timing, as the on-disk cache does for repeated runs); the CLI timings include everything a
user waits for: interpreter start, imports, profiling on a cold cache, planning and printing.
Run: python bench/planner_speed.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgefl.cost.profile_store import ProfileStore
from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import STRATEGIES, PlanContext, get_strategy
from edgefl.zoo import ModelRef

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "planner_speed.json"


def big_fleet():
    runtimes = ["ort", "torch", "ort", "executorch", "ort", "torch", "ort", "torch", "ort", "ort"]
    lines = ["fleet:", "  name: hundred-thousand", "  groups:"]
    for i in range(10):
        budget = 60 + 90 * i                                 # 60 MiB ... 870 MiB
        extra = f", upload_budget: {1 + i}MB" if i % 3 == 0 else ""
        lines.append(f"    g{i}: {{count: 10000, memory_budget: {budget}MiB, runtime: {runtimes[i]}{extra}}}")
    return parse_fleet("\n".join(lines))


def time_planning(model: ModelRef, method: str, fleet, store, repeats=3) -> dict:
    get_strategy(method).plan(PlanContext(fleet, model, store=store))      # profiles the model (not timed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan = verify(get_strategy(method).plan(PlanContext(fleet, model, store=store)), fleet)
        times.append(time.perf_counter() - start)
    return {"seconds": min(times), "median_seconds": statistics.median(times),
            "groups_taking_part": sum(not g.excluded for g in plan.groups.values())}


def time_cli(args: list[str], cache: str) -> float:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "edgefl", "plan", *args], capture_output=True, text=True,
                       env={**os.environ, "EDGEFL_CACHE": cache})
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"edgefl plan {' '.join(args)} failed: {r.stderr}")
    return elapsed


def main():
    start = time.perf_counter()
    fleet = big_fleet()
    parse_seconds = time.perf_counter() - start
    store = ProfileStore(persist=False)
    rows = {}
    for method in STRATEGIES:
        model = ModelRef.of("transformer", layers=6) if method == "caff" else ModelRef.of("resnet20")
        rows[method] = {"model": model.label(), **time_planning(model, method, fleet, store)}
        print(f"{method:10} {rows[method]['seconds'] * 1000:8.1f} ms  ({model.label()})", flush=True)

    example = str(ROOT / "examples" / "fleet.yaml")
    cli = {}
    for method in STRATEGIES:
        args = ["--devices", example, "--model", "resnet20", "--method", method]
        with tempfile.TemporaryDirectory() as cache:
            cold = time_cli(args, cache)
            warm = time_cli(args, cache)
        cli[method] = {"cold_cache_seconds": cold, "warm_cache_seconds": warm}
        print(f"edgefl plan --method {method:10} cold {cold:5.2f} s  warm {warm:5.2f} s", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        args = ["--devices", example, "--model", "transformer", "--method", "caff"]
        cli["caff-transformer"] = {"cold_cache_seconds": time_cli(args, cache), "warm_cache_seconds": time_cli(args, cache)}
    print(f"edgefl plan --model transformer --method caff: {cli['caff-transformer']}")

    result = {
        "devices": fleet.device_count, "groups": len(fleet.groups),
        "max_plan_seconds": max(r["seconds"] for r in rows.values()),
        "fleet_parse_seconds": parse_seconds,
        "max_cli_cold_seconds": max(c["cold_cache_seconds"] for c in cli.values()),
        "max_cli_warm_seconds": max(c["warm_cache_seconds"] for c in cli.values()),
        "per_method": rows, "cli": cli,
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"max planning time {result['max_plan_seconds'] * 1000:.1f} ms for {fleet.device_count} devices; "
          f"CLI cold max {result['max_cli_cold_seconds']:.2f} s; wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
