"""Plan: per device group and round range, the TrainConfig and its predicted Cost; and `verify`.

plan.json is schema-versioned and validated on read. `verify(plan, fleet)` rejects any step whose
predicted cost exceeds its group's budgets, and a group that takes part but is left without a step in some
round and no word why: every round of such a group is a step's or a named sit-out's (`SitOut`: the rounds and
the budget that keeps the group out). Every planner's output goes through it.
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


@dataclass(frozen=True)
class SitOut:
    """Rounds a group that takes part trains nothing, and why: the budgets its least demanding configuration of
    those rounds breaks ('upload 6.35 MiB > budget 1.91 MiB')."""
    rounds: tuple[int, int]                    # first and last round, inclusive
    reason: str

    def to_json(self) -> dict:
        return {"rounds": list(self.rounds), "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict) -> "SitOut":
        return cls(rounds=tuple(d["rounds"]), reason=d["reason"])

    def describe(self) -> str:
        first, last = self.rounds
        return f"{'round' if first == last else 'rounds'} {first}{'' if first == last else f'-{last}'}: {self.reason}"


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
    sits_out: list[SitOut] = field(default_factory=list)   # rounds without a step, each with its reason
    agent: str = "native"                       # the device agent its steps' predicted peaks include

    @property
    def excluded(self) -> bool:
        return not self.steps

    def step_at(self, round: int) -> Optional[Step]:
        """The step this group trains in `round`, or None if it sits the round out."""
        return next((s for s in self.steps if s.rounds[0] <= round <= s.rounds[1]), None)

    def idle_reason(self, round: int) -> str:
        """Why this group trains nothing in `round` (a round it has no step in)."""
        if self.excluded:
            return f"its group is excluded: {self.reason}"
        out = next((o for o in self.sits_out if o.rounds[0] <= round <= o.rounds[1]), None)
        if out is not None:
            return f"its group sits out {out.describe()}"
        last = max(span.rounds[1] for span in [*self.steps, *self.sits_out])
        return f"round {round} is past the plan, which ends at round {last}" if round > last else \
            f"the plan gives its group no step in round {round}"

    def to_json(self) -> dict:
        return {"count": self.count, "runtime": self.runtime, "agent": self.agent, "examples": self.examples,
                "budget": {"memory_bytes": self.memory_budget_bytes, "upload_bytes": self.upload_budget_bytes,
                           "flops_per_round": self.flops_budget},
                "excluded": self.excluded, "min_memory_bytes": self.min_memory_bytes, "reason": self.reason,
                "flags": list(self.flags), "steps": [s.to_json() for s in self.steps],
                "sits_out": [o.to_json() for o in self.sits_out]}

    @classmethod
    def from_json(cls, name: str, d: dict) -> "GroupPlan":
        b = d["budget"]
        return cls(name=name, count=d["count"], runtime=d["runtime"], memory_budget_bytes=b["memory_bytes"],
                   upload_budget_bytes=b["upload_bytes"], flops_budget=b["flops_per_round"], examples=d.get("examples"),
                   min_memory_bytes=d["min_memory_bytes"], steps=[Step.from_json(s) for s in d["steps"]],
                   reason=d.get("reason", ""), flags=tuple(d.get("flags", ())),
                   sits_out=[SitOut.from_json(o) for o in d.get("sits_out", [])], agent=d.get("agent", "native"))


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
        for step in gp.steps:
            bad = violations(step.predicted, group, step.config)
            if bad:
                raise InfeasiblePlanError(f"group {group.name} (device {group.device_ids[0]}), rounds "
                                          f"{step.rounds[0]}-{step.rounds[1]}: " + "; ".join(bad))
        if not gp.excluded:
            _covers(gp, plan.rounds)
    return plan


def _covers(gp: GroupPlan, rounds: int) -> None:
    """Every round of 1..rounds is one step's or one named sit-out's, in order; an InfeasiblePlanError naming the
    first round that is not (a planner that left a group out of a round without saying why)."""
    spans = sorted([(s.rounds, "step") for s in gp.steps] + [(o.rounds, "sit-out") for o in gp.sits_out])
    last = 0
    for (first, end), what in spans:
        if not (first == last + 1 and first <= end <= rounds):
            raise InfeasiblePlanError(f"group {gp.name}: a {what} spans rounds {first}-{end}, after round {last} of "
                                      f"1..{rounds}: steps and sit-outs must cover each round once; regenerate the "
                                      "plan with 'edgefl plan'")
        last = end
    if last != rounds:
        raise InfeasiblePlanError(f"group {gp.name}: rounds {last + 1}-{rounds} have neither a step nor a named "
                                  "sit-out; regenerate the plan with 'edgefl plan'")
