"""Plan: per device group and round range, the TrainConfig and its predicted Cost; and `verify`.

plan.json is schema-versioned and validated on read. `verify(plan, fleet)` rejects any step whose
predicted cost exceeds its group's budgets; every planner's output goes through it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from edgefl.cost.model import Cost
from edgefl.errors import ConfigError, InfeasiblePlanError
from edgefl.fleet import Fleet, Group
from edgefl.outdir import write_atomic
from edgefl.trainconfig import TrainConfig
from edgefl.units import format_bytes, format_flops
from edgefl.zoo import ModelRef

SCHEMA = "edgefl.plan/1"


@dataclass(frozen=True)
class Step:
    rounds: tuple[int, int]                    # first and last round, inclusive, 1-based
    config: TrainConfig
    predicted: Cost
    sequence: tuple[TrainConfig, ...] = ()     # configs trained one after another in a round (FeDepth)
    label: str = ""

    def to_json(self) -> dict:
        d = {"rounds": list(self.rounds), "label": self.label, "config": self.config.to_json(),
             "predicted": self.predicted.to_json()}
        if self.sequence:
            d["sequence"] = [c.to_json() for c in self.sequence]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Step":
        pred = {k: v for k, v in d["predicted"].items() if k not in ("training_bytes", "peak_memory_bytes")}
        return cls(rounds=tuple(d["rounds"]), config=TrainConfig.from_json(d["config"]), predicted=Cost(**pred),
                   sequence=tuple(TrainConfig.from_json(c) for c in d.get("sequence", [])), label=d.get("label", ""))


@dataclass
class GroupPlan:
    name: str
    count: int
    runtime: str
    memory_budget_bytes: int
    upload_budget_bytes: Optional[int]
    flops_budget: Optional[float]
    examples: Optional[int]
    min_memory_bytes: Optional[int]            # smallest memory budget that lets the group take part
    steps: list[Step] = field(default_factory=list)
    reason: str = ""                            # why excluded, or what limits it
    flags: tuple[str, ...] = ()                 # method-specific marks, e.g. 'mutual-distillation'

    @property
    def excluded(self) -> bool:
        return not self.steps

    def step_at(self, round: int) -> Optional[Step]:
        """The step this group trains in `round`, or None if it sits the round out."""
        return next((s for s in self.steps if s.rounds[0] <= round <= s.rounds[1]), None)

    def to_json(self) -> dict:
        return {"count": self.count, "runtime": self.runtime, "examples": self.examples,
                "budget": {"memory_bytes": self.memory_budget_bytes, "upload_bytes": self.upload_budget_bytes,
                           "flops_per_round": self.flops_budget},
                "excluded": self.excluded, "min_memory_bytes": self.min_memory_bytes, "reason": self.reason,
                "flags": list(self.flags), "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, name: str, d: dict) -> "GroupPlan":
        b = d["budget"]
        return cls(name=name, count=d["count"], runtime=d["runtime"], memory_budget_bytes=b["memory_bytes"],
                   upload_budget_bytes=b["upload_bytes"], flops_budget=b["flops_per_round"], examples=d.get("examples"),
                   min_memory_bytes=d["min_memory_bytes"], steps=[Step.from_json(s) for s in d["steps"]],
                   reason=d.get("reason", ""), flags=tuple(d.get("flags", ())))


@dataclass
class Plan:
    method: str
    model: ModelRef
    rounds: int
    batch_size: int
    optimizer: str
    local_epochs: int
    groups: dict[str, GroupPlan]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "method": self.method, "model": self.model.to_json(), "rounds": self.rounds,
                "batch_size": self.batch_size, "optimizer": self.optimizer, "local_epochs": self.local_epochs,
                "groups": {n: g.to_json() for n, g in self.groups.items()}, "notes": self.notes}

    def write(self, path: str | Path) -> None:
        write_atomic(Path(path), (json.dumps(self.to_json(), indent=2) + "\n").encode(), durable=False)

    @classmethod
    def from_json(cls, d: dict, where: str = "plan.json") -> "Plan":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ConfigError(f"{where}: schema is {found!r}, expected {SCHEMA!r}; regenerate it with 'edgefl plan'")
        try:
            return cls(method=d["method"], model=ModelRef.from_json(d["model"]), rounds=d["rounds"],
                       batch_size=d["batch_size"], optimizer=d["optimizer"], local_epochs=d["local_epochs"],
                       groups={n: GroupPlan.from_json(n, g) for n, g in d["groups"].items()},
                       notes=list(d.get("notes", [])))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{where}: malformed plan ({type(exc).__name__}: {exc}); regenerate it with 'edgefl plan'") from None

    @classmethod
    def read(cls, path: str | Path) -> "Plan":
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the plan ({exc.strerror})") from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not JSON ({exc}); regenerate it with 'edgefl plan'") from None
        return cls.from_json(data, str(path))


def round_flops(cost: Cost, group: Group | GroupPlan, config: TrainConfig) -> Optional[float]:
    """FLOPs a device spends in one round: per-sample FLOPs x local examples x local epochs."""
    if group.examples is None:
        return None
    return cost.flops_per_sample * group.examples * config.local_epochs


def violations(cost: Cost, group: Group | GroupPlan, config: TrainConfig) -> list[str]:
    out = []
    if cost.peak_memory_bytes > group.memory_budget_bytes:
        out.append(f"peak memory {format_bytes(cost.peak_memory_bytes)} > budget {format_bytes(group.memory_budget_bytes)}")
    if group.upload_budget_bytes is not None and cost.upload_bytes > group.upload_budget_bytes:
        out.append(f"upload {format_bytes(cost.upload_bytes)} > budget {format_bytes(group.upload_budget_bytes)}")
    flops = round_flops(cost, group, config)
    if group.flops_budget is not None and flops is not None and flops > group.flops_budget:
        out.append(f"{format_flops(flops)} per round > budget {format_flops(group.flops_budget)}")
    return out


def verify(plan: Plan, fleet: Fleet) -> Plan:
    """Reject a plan that does not cover the fleet or whose predicted cost exceeds any budget."""
    names = {g.name for g in fleet.groups}
    if set(plan.groups) != names:
        raise InfeasiblePlanError(f"plan groups {sorted(plan.groups)} do not match fleet groups {sorted(names)}")
    for group in fleet.groups:
        gp = plan.groups[group.name]
        last = 0
        for step in gp.steps:
            first, end = step.rounds
            if not (last < first <= end <= plan.rounds):
                raise InfeasiblePlanError(f"group {group.name}: step rounds {step.rounds} overlap or leave 1..{plan.rounds}")
            last = end
            bad = violations(step.predicted, group, step.config)
            if bad:
                raise InfeasiblePlanError(f"group {group.name} (device {group.device_ids[0]}), rounds {first}-{end}: "
                                          + "; ".join(bad))
    return plan
