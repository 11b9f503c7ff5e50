"""One method on one fleet through edgefl's emulation, summarised for a result table.

Shared by bench/reproduce_slt.py and bench/reproduce_caff.py: plan (and verify) with the method's own
planner, emulate with the coordinator's round loop, and keep per method the accuracy curve, the final
and best accuracy, the groups the plan excluded and the wall time.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from edgefl.engines.local import emulate
from edgefl.fleet import Fleet, parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, Strategy, get_strategy
from edgefl.server.coordinator import LoopSettings
from edgefl.zoo import ModelRef


def one_group_fleet(name: str, devices: int, budget_bytes: int, runtime: str = "torch") -> Fleet:
    return parse_fleet(f"fleet:\n  name: {name}\n  groups:\n    devices: "
                       f"{{count: {devices}, memory_budget: {int(budget_bytes)}B, runtime: {runtime}}}\n")


def run_method(method: str | Strategy, fleet: Fleet, ref: ModelRef, train, test, shares, settings: LoopSettings,
               batch_size: int = 32, device: str = "cpu", plan_context: Optional[dict] = None,
               initial: Optional[Callable[[ModelRef], dict]] = None, **emulate_kwargs) -> dict:
    """`initial(model)`: the weights to start from for the model the plan chose (pretrained LMs)."""
    strategy = get_strategy(method) if isinstance(method, str) else method
    start = time.perf_counter()
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=settings.rounds, batch_size=batch_size,
                                            **(plan_context or {}))), fleet)
    excluded = {g.name: g.reason for g in plan.groups.values() if g.excluded}
    if len(excluded) == len(plan.groups):
        return {"excluded": excluded, "final": None, "best": None, "curve": [], "wall_s": time.perf_counter() - start}
    if initial is not None:
        emulate_kwargs["initial_state"] = initial(plan.model)
    records, _ = emulate(fleet, plan, strategy, plan.model, train, test, shares, settings, device, **emulate_kwargs)
    curve = [(r.round, r.accuracy) for r in records if r.accuracy is not None]
    accuracies = [a for _, a in curve]
    peaks: dict[str, list[int]] = {}
    for r in records:
        for device, peak in r.predicted_peak_bytes.items():
            peaks.setdefault(r.sampled.get(device, "?"), []).append(peak)
    # the papers' efficiency columns, summed over the run as the loop recorded them
    costs = {"download_bytes": sum(r.download_bytes for r in records),
             "upload_bytes": sum(r.upload_bytes for r in records),
             "download_saved_bytes": sum(r.download_saved_bytes for r in records),
             "training_flops": sum(r.flops for r in records),
             "device_rounds": sum(len(r.predicted_peak_bytes) for r in records),
             "max_predicted_peak_bytes_per_group": {g: max(v) for g, v in sorted(peaks.items())}}
    row = {"final": accuracies[-1], "best": max(accuracies), "curve": curve, "excluded": excluded,
           "model": plan.model.label(), "notes": plan.notes, "wall_s": time.perf_counter() - start,
           "seconds_per_round": sum(r.wall_s for r in records) / len(records), "costs": costs}
    if any(r.decisions.get("step_label") for r in records):     # an online schedule (ProFL): which step each round trained
        row["steps"] = [[r.round, r.decisions["step_label"]] for r in records if r.decisions.get("step_label")]
        # what its freezing rule saw: the step's effective movement and its slope, after each round (None before
        # its window fills), and the rounds it switched after
        row["movement"] = [[r.round, r.decisions.get("effective_movement"), r.decisions.get("slope"),
                            r.decisions.get("switched_to")] for r in records if r.decisions.get("step_label")]
    return row
