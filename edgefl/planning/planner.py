"""The planner: a method's strategy over a fleet and a model, made into a Plan that `verify` has checked.

What `edgefl plan`, `edgefl emulate` and the benchmarks plan with. `strategy_for` sets a method up from the
options that only some methods take (CAFF's candidate depths, ProFL's block count); `plan_fleet` plans and
verifies, and with a calibration file adds to the plan's notes what it changed against the built-in constants.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from edgefl.cost.calibrate import calibration_notes
from edgefl.cost.constants import load_calibration
from edgefl.errors import ConfigError
from edgefl.fleet import Fleet
from edgefl.planning.calibration import plan_changes
from edgefl.planning.plan import Plan, verify
from edgefl.planning.strategies import PlanContext, Strategy, get_strategy
from edgefl.zoo import ModelRef


def strategy_for(method: str, depths: Optional[list[int]] = None, blocks: Optional[int] = None) -> Strategy:
    """The strategy of `method`; `depths`: CAFF's candidate transformer depths (another method takes one);
    `blocks`: ProFL's number of blocks (default: the model's stages)."""
    strategy = get_strategy(method)
    if method == "caff" and depths:
        strategy.depths = depths
    if method == "profl":
        strategy.blocks = blocks
    elif blocks is not None:
        raise ConfigError("--blocks: only --method profl takes it")
    if depths and len(depths) > 1 and method != "caff":
        raise ConfigError(f"--layers: a list of depths is for --method caff; give one depth for {method}")
    return strategy


def plan_fleet(strategy: Strategy, fleet: Fleet, model: ModelRef, *, rounds: int = 100, batch_size: int = 32,
               optimizer: str = "sgd", local_epochs: int = 1, calibration: Optional[Path] = None,
               where: str = "fleet") -> Plan:
    """`strategy`'s plan for `fleet` training `model`, verified against every group's budgets. `where`: the
    fleet file, for errors. `calibration`: runtime constants from 'edgefl calibrate' instead of the built-in."""
    for g in fleet.groups:
        if g.flops_budget is not None and g.examples is None:
            raise ConfigError(f"{where}: fleet.groups.{g.name}.flops_budget needs examples (local dataset size) "
                              "to turn FLOPs per sample into FLOPs per round; add e.g. 'examples: 500'")
    context = PlanContext(fleet, model, rounds=rounds, batch_size=batch_size, optimizer=optimizer,
                          local_epochs=local_epochs, constants=load_calibration(calibration))
    plan = verify(strategy.plan(context), fleet)
    if calibration is not None:      # what the calibration changed, and why, in the plan's own notes
        without = strategy.plan(replace(context, constants=load_calibration(None), _costs={}))
        plan.notes.extend(calibration_notes(calibration, context.constants, model.name) + plan_changes(without, plan))
    return plan
