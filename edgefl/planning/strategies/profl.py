"""ProFL: progressive training by architectural block (ProFL, Wu et al.), as its paper describes it.

Blocks (sec. 4.1): ResNets by residual stage, the stem inside block 1 (CIFAR ResNet-20: layers [0, 7),
[7, 13), [13, 20)); `blocks` fewer merges stages at the stage end nearest an even share of the layers
(VGG11_bn, blocks=2: its first four convolutions and its last four, as sec. 4.1 splits it).

Steps (sec. 3.1, 3.2): progressive model shrinking trains blocks T..2 back to front, each with the output
module of the blocks after it; progressive model growing then trains blocks 1..T front to back with the
earlier blocks frozen, each block starting from what shrinking left in it. 2T - 1 steps.

Output modules and the Map (sec. 3.2): the module after block t is [theta_{t+1,Conv}, ..., theta_{T,Conv},
theta_L]. Shrinking's first step trains the whole model, theta_L being its classifier; at each switch the
server composes the next step's module from the pieces the last step trained (its later convs and its
linear, or the classifier), and after a shrinking step it distils that step's block into its conv
theta_{t,Conv} (edgefl.server.output_modules: what the Map's data, loss and schedule are, which the paper
leaves open). The pieces are one set of tensors in the paper; here each module is the conv auxiliary head at
its block's end, and copying the pieces at each switch is the same thing, since only the current step's
module trains. Growing's last step hands theta_L back to the classifier.

Who trains (sec. 3, 4.1): a round's clients are drawn from the pool of clients who can afford training
the current block (`pool`: the groups with a step in it); a client that can afford no block at all trains
only the output layer (the linear of the step's output module, the trainer option `output_layer_only`;
the classifier in steps that end there) in every step, so that its data is used; a client that can afford
some blocks sits out the steps of the others and is not drawn then.

Freezing (sec. 3.3, 4.4): after each round's aggregation the block being trained (its layers' parameters;
the output module's where no group trains the block) is snapshot; its effective movement over H rounds,
the least-squares slope of the last `window` movements, and the step switches once the movement is flat,
|slope| < phi, for W evaluations in a row (edgefl.planning.progress). The paper gives no values; the
defaults follow from its setting, not from results here: H = 5 and window = 5 rounds, the rounds in which
its 20-of-100 draw samples as many clients as the pool holds (one pass over the federation's data, the FL
counterpart of the epochs sec. 3.3 measures movement over); W = 3 so that one draw of clients cannot
freeze a block alone; phi = 0.01 per round, so EM moves less than 0.05 across the window: 5% of its
[0, 1] range. Freezing needs H + window + W - 1 = 12 snapshots at least. The last step trains to the end.

Departures, and why:
- The plan's round ranges are an even split: the steps switch online, so a plan can only say which steps
  exist and who trains in each. Steps the plan gives no rounds to (R below the number of steps) are absent.
- A block spanning several stages maps into one conv per stage (VGG11_bn's block 2: two, each pooling as
  its stage does), not one conv: the output module keeps the resolution each later block has.
- The Map runs on the server, on the seeded sample of the devices' data an emulation holds; a server without
  one (deployment) composes the module without distilling, and the round's decisions say so.
- A device training only the output layer is planned and checked against the whole output module's cost
  (an upper bound of its memory); the ORT and ExecuTorch trainers train the whole module (their training
  graphs are per config), the torch trainer only its linear; the server expects from each what it trains
  (edgefl.engines.deployed.as_exported).
- Mid-schedule the model is judged as the current step trains it (`evaluated_config`).
- `switch="schedule"` is not the paper's: each step ends with the plan's even split of the rounds, not when
  its block's movement flattens. It exists to measure what the freezing rule costs (bench/reproduce_profl.py,
  the ResNet column's evidence runs), not as a method.
`record.decisions` shows the step, EM, slope, switches and each composed output module.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from edgefl.planning.plan import Plan, Step
from edgefl.planning.progress import is_flat, movement_series, trend
from edgefl.planning.strategies.base import PlanContext, Strategy, deepest_trained, group_plan
from edgefl.planning.strategies.slt import round_schedule


def block_ends(ctx: PlanContext, blocks: Optional[int]) -> list[int]:
    """The layer each block ends at (the last one at the classifier): the architecture's stages, a stem
    (a first stage of other layer kinds than the next, the ResNets' conv + BN) inside block 1 (sec. 4.1:
    ResNets "based on the residual blocks"). `blocks` fewer than the stages merges them, each cut at the
    stage end nearest an even share of the layers (VGG11_bn, blocks=2: its first four convolutions and its
    last four, sec. 4.1)."""
    profile = ctx.full_profile
    L = profile.num_layers
    ends = sorted({b for b in profile.stages if 0 < b < L - 1})
    kinds = [p.kind for p in profile.layers]
    if len(ends) > 1 and not set(kinds[:ends[0]]) & set(kinds[ends[0]:ends[1]]):
        ends = ends[1:]                                   # the stem joins block 1
    ends.append(L)
    if blocks is not None and blocks < len(ends):
        cuts: list[int] = []
        for i in range(1, blocks):
            target = i * (L - 1) / blocks                 # layers but the classifier, split evenly
            free = [e for e in ends[:-1] if e > (cuts[-1] if cuts else 0)][: len(ends) - 1 - (blocks - 1 - i)]
            cuts.append(min(free, key=lambda e: (abs(e - target), e)))
        ends = cuts + [L]
    return ends


OUTPUT_LAYER = "output layer only"
SWITCHES = ("movement", "schedule")      # when a step ends: its block's movement is flat (sec. 3.3), or its rounds


@dataclass(frozen=True)
class OutputModuleChange:
    """The output module after the block ending at `to_end` is composed from the one after `from_end` (the
    model's classifier when `from_end` is the last layer); `mapped`: (start, end) of the block to distil."""
    from_end: int
    to_end: int
    mapped: Optional[tuple[int, int]] = None


class ProFL(Strategy):
    name = "profl"
    switch = "movement"          # what a checkpoint written before the option resumes with

    def __init__(self, blocks: Optional[int] = None, H: int = 5, W: int = 3, phi: float = 0.01, window: int = 5,
                 switch: str = "movement"):
        if switch not in SWITCHES:
            raise ValueError(f"ProFL switch {switch!r}: one of {SWITCHES}")
        self.blocks, self.H, self.W, self.phi, self.window, self.switch = blocks, H, W, phi, window, switch
        self.current = 0                       # index into the plan's step order
        self.last_trained: Optional[int] = None   # the step the last round trained (evaluation judges it)
        self.plan_: Optional[Plan] = None
        self.snapshots: deque = deque(maxlen=H + window + W - 1)   # all the last W slopes depend on
        self.keys: tuple[str, ...] = ()

    def order(self, plan: Plan) -> list[tuple[int, int]]:
        """The steps in the plan's order, named by their round range (shared by every group's step)."""
        return sorted({s.rounds for g in plan.groups.values() for s in g.steps})

    def configure_round(self, plan: Plan, round: int, group: str) -> Optional[Step]:
        self.plan_ = plan
        order = self.order(plan)
        if not order:
            return None
        key = order[min(self.current, len(order) - 1)]
        return next((s for s in plan.groups[group].steps if s.rounds == key), None)

    def idle_reason(self, plan: Plan, round: int, group: str) -> str:
        """The current step's sit-out: steps move online, so a round is named by the step it runs."""
        order = self.order(plan)
        return plan.groups[group].idle_reason(order[min(self.current, len(order) - 1)][0] if order else round)

    def evaluated_config(self, plan: Plan):
        """The model the current step trains: the blocks up to its end and its output module, until a step
        ends in the classifier (the last block, shrinking's first step and growing's last). Mid-schedule the
        whole model is no model at all: its later blocks were trained (shrinking) on features that growing's
        retraining of the earlier blocks has since replaced, and it scores at chance until growing reaches
        the classifier. Asked at every evaluation, since the step moves online; a round that switched steps is
        judged by the step it trained, not by the next one's untrained output module."""
        if not self.order(plan):
            return None
        step = self.current if self.last_trained is None else self.last_trained
        return deepest_trained([s.config for s in self.step_configs(plan, step)])

    def step_configs(self, plan: Optional[Plan] = None, step: Optional[int] = None) -> list[Step]:
        """Every group's step `step` (default: the current one) of `plan` (default: the one being run)."""
        plan = plan or self.plan_
        order = self.order(plan)
        key = order[min(self.current if step is None else step, len(order) - 1)]
        return [s for g in plan.groups.values() for s in g.steps if s.rounds == key]

    def tracked(self, state: Mapping[str, Any]) -> tuple[str, ...]:
        """Parameters of the block the current step trains (its output modules' if no group trains it)."""
        configs = [s.config for s in self.step_configs()]
        layers = sorted({i for c in configs for i in c.trained_layers})
        prefixes = tuple(f"layers.{i}." for i in layers) if layers else tuple(
            {c.aux_prefix for c in configs if c.aux_head is not None})
        return tuple(k for k in state if k.startswith(prefixes) and "running_" not in k and "num_batches" not in k)

    def observe(self, state: Mapping[str, Any]) -> None:
        """Append the tracked block's snapshot; a changed set of tensors (an output module that appeared)
        starts the history afresh."""
        keys = self.tracked(state)
        if keys != self.keys:
            self.snapshots.clear()
            self.keys = keys
        if keys:
            self.snapshots.append(np.concatenate([np.asarray(state[k]).astype(np.float32, copy=False).ravel()
                                                  for k in keys]))

    def output_change(self, step: int) -> Optional[OutputModuleChange]:
        """The output module the step after `step` trains with, composed from `step`'s (sec. 3.2); a
        shrinking step's block is mapped into it."""
        plan = self.plan_
        order = self.order(plan)
        if step + 1 >= len(order):
            return None
        here, there = self.step_configs(plan, step), self.step_configs(plan, step + 1)
        from_end, to_end = max(s.config.end for s in here), max(s.config.end for s in there)
        ends = sorted({s.config.end for g in plan.groups.values() for s in g.steps})
        start = max([e for e in ends if e < from_end], default=0)
        mapped = (start, from_end) if here[0].label.startswith("shrink") else None
        return OutputModuleChange(from_end, to_end, mapped)

    def after_round(self, round: int, record, state: Optional[Mapping[str, Any]] = None,
                    edit=None) -> None:
        if self.plan_ is None or state is None or not self.order(self.plan_):
            return
        self.last_trained = self.current
        self.observe(state)
        movements = movement_series(list(self.snapshots), self.H)
        slopes = trend(movements, self.window)
        d: dict[str, Any] = {"step": self.current, "step_label": self.step_configs()[0].label.split(":")[0]}
        if movements:
            d["effective_movement"] = movements[-1]
        if slopes:
            d["slope"] = slopes[-1]
        if self.current < len(self.order(self.plan_)) - 1 and self.step_ends(slopes, round):
            change = self.output_change(self.current)
            self.current += 1
            d["switched_to"] = self.current
            if edit is not None and change is not None:
                state, d["output_module"] = edit(change)
            self.keys = ()
            self.observe(state)   # a fresh history: the next block as it stands before its first round
        record.decisions.update(d)

    def step_ends(self, slopes: list[float], round: int) -> bool:
        """Whether the current step ends after `round`: its block's movement flat, the last W `slopes` of
        its EM below phi (sec. 3.3), or under switch="schedule" its share of the rounds done."""
        if self.switch == "schedule":
            return round >= self.order(self.plan_)[self.current][1]
        return is_flat(slopes, self.W, self.phi)

    def pool(self, plan: Plan, round: int) -> Optional[set[str]]:
        """The groups a round's devices are drawn from: those with a step in the current one, i.e. that can
        afford the current block, or that can afford no block and train the output layer (sec. 3, 4.1)."""
        order = self.order(plan)
        if not order:
            return None
        key = order[min(self.current, len(order) - 1)]
        return {name for name, g in plan.groups.items() if any(s.rounds == key for s in g.steps)}

    def trainer_options(self, round: int, step: Step, group=None) -> dict:
        """A device that can afford no block trains only the output module's last layer (sec. 4.1)."""
        return {"output_layer_only": 1} if step.label.endswith(OUTPUT_LAYER) and step.config.aux_head else {}

    def plan(self, ctx: PlanContext):
        L = ctx.num_layers
        ends = block_ends(ctx, self.blocks)
        starts = [0] + ends[:-1]
        T = len(ends)

        def train_block(t):
            s, e = starts[t], ends[t]
            return ctx.config(frozen_prefix=s, trained_end=e, aux_head="conv") if e < L else ctx.config(frozen_prefix=s)

        def output_layer(t):
            """The output module after block t, of which the device trains the last layer (the trainer option
            above); at the classifier, the classifier."""
            e = ends[t]
            return ctx.config(frozen_prefix=e, trained_end=e, aux_head="conv") if e < L else ctx.config(frozen_prefix=L - 1)

        order = [("shrink", t) for t in range(T - 1, 0, -1)] + [("grow", t) for t in range(T)]
        ranges = round_schedule(ctx.rounds, [i + 1 for i in range(len(order))], len(order))
        groups = {}
        for g in ctx.fleet.groups:
            no_block = not any(ctx.fits(train_block(t), g) for t in range(T))
            steps, idle = [], []
            for (stage, t), rounds in zip(order, ranges, strict=True):
                if rounds[0] > rounds[1]:
                    continue
                config, what = (output_layer(t), OUTPUT_LAYER) if no_block else (train_block(t), "block")
                if ctx.fits(config, g):
                    steps.append(Step(rounds=rounds, config=config, predicted=ctx.cost(config, g),
                                      label=f"{stage} block {t + 1}/{T}: {what}"))
                else:   # it affords another block, not this one: it is not drawn while this one trains
                    idle.append((rounds, config))
            groups[g.name] = group_plan(ctx, g, steps, [output_layer(t) for t in range(T)], idle=idle)
        notes = [f"blocks end at layers {ends}; {len(order)} steps (shrinking {T - 1}, growing {T})"]
        return self.new_plan(ctx, groups, notes)
