"""What every planner shares: the cost oracle, the one monotone search, and plan assembly.

A strategy's planning half is `plan(ctx) -> Plan`. Planners differ only in which candidate configs
they consider and how a fleet couples them; the search over candidates (`first_fit`) and the building of
group plans live here once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, TypeVar

from edgefl.cost.constants import AGENTS, DEFAULTS, RuntimeConstants, unmeasured_note
from edgefl.cost.model import Cost, config_cost
from edgefl.cost.profile_store import ProfileStore
from edgefl.fleet import Fleet, Group, default_agent
from edgefl.planning.plan import GroupPlan, Plan, SitOut, Step, violations
from edgefl.trainconfig import TrainConfig
from edgefl.units import format_bytes
from edgefl.zoo import ModelRef

T = TypeVar("T")

# head/width scales the planners choose from: multiples of 1/32 (SLT's s in (0, 1])
WIDTHS: tuple[float, ...] = tuple(k / 32 for k in range(32, 0, -1))


def first_fit(candidates: Sequence[T], fits: Callable[[T], bool]) -> Optional[int]:
    """Index of the first candidate that fits, candidates ordered from most to least demanding so
    that `fits` is monotone (False...False True...True). Galloping search: probes 0, 1, 3, 7, ... then
    bisects, so an answer d places from the start costs O(log d) evaluations (each may profile a model)."""
    lo, probe = 0, 0
    while probe < len(candidates) and not fits(candidates[probe]):
        lo = probe + 1
        probe = 2 * probe + 1
    if probe >= len(candidates):
        if lo >= len(candidates) or not fits(candidates[-1]):
            return None
        probe = len(candidates) - 1
    hi = probe  # candidates[hi] fits, everything before lo does not
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < len(candidates) else None


@dataclass
class PlanContext:
    """The planner's view of a fleet and a model: costs of configs per runtime, memoised."""
    fleet: Fleet
    model: ModelRef
    rounds: int = 100
    batch_size: int = 32
    optimizer: str = "sgd"
    local_epochs: int = 1
    store: ProfileStore = field(default_factory=ProfileStore)
    constants: dict[str, RuntimeConstants] = field(default_factory=lambda: dict(DEFAULTS))
    _costs: dict = field(default_factory=dict, repr=False)

    def with_model(self, model: ModelRef) -> "PlanContext":
        return PlanContext(self.fleet, model, self.rounds, self.batch_size, self.optimizer, self.local_epochs,
                           self.store, self.constants, self._costs)

    @property
    def num_layers(self) -> int:
        return self.store.full(self.model).num_layers

    @property
    def full_profile(self):
        return self.store.full(self.model)

    def config(self, **fields) -> TrainConfig:
        return TrainConfig(num_layers=self.num_layers, batch_size=self.batch_size, optimizer=self.optimizer,
                           local_epochs=self.local_epochs, **fields)

    def cost(self, config: TrainConfig, on: Group | str) -> Cost:
        """`config`'s cost on a group's devices: its runtime's training process and the agent beside it. `on`
        a runtime name: a device of that runtime with its default agent (edgefl.fleet.default_agent)."""
        runtime, agent = (on, default_agent(on)) if isinstance(on, str) else (on.runtime, on.agent)
        key = (self.model, config, runtime, agent)
        if key not in self._costs:
            process = config_cost(self.store, self.model, config, runtime, self.constants[runtime])
            self._costs[key] = replace(process, agent_bytes=AGENTS[agent].bytes(process.upload_bytes))
        return self._costs[key]

    def fits(self, config: TrainConfig, group: Group) -> bool:
        return not violations(self.cost(config, group), group, config)

    def best(self, candidates: Sequence[TrainConfig], group: Group) -> Optional[TrainConfig]:
        i = first_fit(candidates, lambda c: self.fits(c, group))
        return None if i is None else candidates[i]


class Strategy:
    """A method: `plan` (planning half) and the hooks the round loop calls (training half).
    Subclasses set `name`, implement `plan` and override only the hooks they change."""
    name: ClassVar[str] = ""
    # aggregation rule (edgefl.server.aggregate, folded as reports arrive): 'trained' averages each entry over the
    # devices that trained it (FedOLF alg. 1, ProFL eq. 1, FeDepth); 'sampled' also counts sampled devices
    # that did not train it, with the previous global value (the CoCoFL/CAFF layer-wise rule)
    aggregation: ClassVar[str] = "trained"
    # static batch normalisation (HeteroFL sec. 3.2): the global model is evaluated with BN statistics the
    # server estimates on devices' data, not with the average of running statistics that devices gathered
    # through models of different widths (where a channel's statistics depend on how many channels feed it)
    static_bn: ClassVar[bool] = False

    def plan(self, ctx: PlanContext) -> Plan:
        raise NotImplementedError

    def configure_round(self, plan: Plan, round: int, group: str) -> Optional[Step]:
        """The step a device of `group` trains in `round`; the plan's, unless a method decides online."""
        return plan.groups[group].step_at(round)

    def pool(self, plan: Plan, round: int) -> Optional[set[str]]:
        """The groups `round`'s devices are drawn from (None: every group): a method that trains only the
        devices able to take part draws from those alone (ProFL)."""
        return None

    def idle_reason(self, plan: Plan, round: int, group: str) -> str:
        """Why a device of `group` trains nothing in `round` (configure_round gave it no step)."""
        return plan.groups[group].idle_reason(round)

    def trainer_options(self, round: int, step: Step, group: Optional[GroupPlan] = None) -> dict:
        """Method-specific switches for the device's trainer (FjORD's widths, DepthFL's exits and
        distillation, m-FeDepth's mutual learning); `group` is the device's group plan (its flags)."""
        return {}

    def evaluated_config(self, plan: Plan) -> Optional[TrainConfig]:
        """The model the global weights are evaluated as: that of this config (its widths, its slice of each
        tensor), or the whole model (None). A method whose devices all train one fixed slice (the small
        model) is judged by that slice: the rest of the global tensors never leaves its initialisation.
        Asked at every evaluation: a method whose trained model moves over the run (ProFL) answers for now."""
        return None

    def after_round(self, round: int, record, state: Optional[Mapping[str, Any]] = None,
                    edit: Optional[Callable[[Any], tuple[Mapping[str, Any], dict]]] = None) -> None:
        """Online decisions after aggregation (ProFL's block freezing). `state`: the new global tensors by
        name (read them with numpy); write what was decided into `record.decisions`. `edit(change)`: the
        server changes the global state as asked (ProFL's output modules) and answers (new state, what it did)."""

    def new_plan(self, ctx: PlanContext, groups: dict[str, GroupPlan], notes: Sequence[str] = ()) -> Plan:
        runtimes = sorted({g.runtime for g in groups.values()})
        unmeasured = [unmeasured_note(ctx.constants[r], r, ctx.model.name) for r in runtimes]
        return Plan(method=self.name, model=ctx.model, rounds=ctx.rounds, batch_size=ctx.batch_size,
                    optimizer=ctx.optimizer, local_epochs=ctx.local_epochs, groups=groups,
                    notes=list(notes) + [n for n in unmeasured if n])


def deepest_trained(configs: Sequence[TrainConfig]) -> Optional[TrainConfig]:
    """The model to judge a method by when its devices train `configs`: the whole model (None) once one of
    them reaches the classifier; else the deepest of them, judged by its exit there (layers and classifier no
    device reaches keep their initial weights, so the whole model would be judged by a random classifier)."""
    if not configs or any(c.end == c.num_layers for c in configs):
        return None
    return max(configs, key=lambda c: c.end)


def group_plan(ctx: PlanContext, group: Group, steps: Sequence[Step], cheapest: Sequence[TrainConfig],
               flags: Sequence[str] = (), reason: str = "",
               idle: Sequence[tuple[tuple[int, int], TrainConfig]] = ()) -> GroupPlan:
    """A group's plan. `cheapest`: the least demanding configs the method could give this group; the
    smallest of their peak memories is the budget that would let the group take part. `idle`: the round ranges
    the group gets no step in, each with the least demanding config the method had for it: the budgets that
    config breaks are why the group sits those rounds out (adjacent ranges kept out by the same budgets merge)."""
    costs = [(ctx.cost(c, group), c) for c in cheapest]
    low_cost, low_config = min(costs, key=lambda pair: pair[0].peak_memory_bytes)
    sits_out: list[SitOut] = []
    for rounds, config in sorted(idle, key=lambda pair: pair[0]):
        why = "; ".join(violations(ctx.cost(config, group), group, config)) or "no configuration fits"
        if sits_out and sits_out[-1].reason == why and sits_out[-1].rounds[1] + 1 == rounds[0]:
            rounds = (sits_out.pop().rounds[0], rounds[1])
        sits_out.append(SitOut(rounds, why))
    if not steps and not reason:
        bad = violations(low_cost, group, low_config)
        if sits_out:
            reason = "no round it can train: " + ", ".join(o.describe() for o in sits_out)
        elif not bad:
            reason = "no step of this method fits the group's budgets"
        else:
            reason = "its smallest configuration breaks the budget: " + "; ".join(bad)
            if low_cost.peak_memory_bytes > group.memory_budget_bytes:
                reason += f"; a memory budget of {format_bytes(low_cost.peak_memory_bytes)} would fit it"
    return GroupPlan(name=group.name, count=group.count, runtime=group.runtime, agent=group.agent,
                     memory_budget_bytes=group.memory_budget_bytes, upload_budget_bytes=group.upload_budget_bytes,
                     flops_budget=group.flops_budget, examples=group.examples,
                     min_memory_bytes=low_cost.peak_memory_bytes, steps=list(steps), reason=reason, flags=tuple(flags),
                     sits_out=sits_out if steps else [])


def whole_run(ctx: PlanContext, group: Group, config: Optional[TrainConfig], label: str = "") -> list[Step]:
    """One step spanning every round, or none if the group has no config."""
    if config is None:
        return []
    return [Step(rounds=(1, ctx.rounds), config=config, predicted=ctx.cost(config, group), label=label)]


class PerGroupStrategy(Strategy):
    """Methods where each group independently takes the best of a ranked candidate list for all rounds."""

    def candidates(self, ctx: PlanContext) -> Sequence[TrainConfig]:
        """Configs from most to least demanding; the planner picks the first that fits."""
        raise NotImplementedError

    def plan(self, ctx: PlanContext) -> Plan:
        ranked = list(self.candidates(ctx))
        groups = {}
        for g in ctx.fleet.groups:
            groups[g.name] = group_plan(ctx, g, whole_run(ctx, g, ctx.best(ranked, g)), ranked[-1:])
        return self.new_plan(ctx, groups)
