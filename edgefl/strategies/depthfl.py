"""DepthFL: each device trains the first d layers with an early-exit classifier at depth d, d the
deepest cut point whose cost fits (the full model when it fits).

Training half (DepthFL's self-distillation): a device of depth d also holds the exits below d, one
linear classifier at each candidate depth b < d (the cut points the planner chooses depths from, shared
with every device deep enough to hold them), and minimises the sum of every exit's cross-entropy plus
`distill` x the mean KL between each exit and the others (device_runtime objectives.SelfDistillation).
The planner's cost counts only the exit at d: the extra linear heads' weights and kept activations are
left out of the prediction.
"""
from __future__ import annotations

from typing import Optional

from edgefl.plan import GroupPlan, Plan, Step
from edgefl.profile import ProfileStore
from edgefl.strategies.base import PerGroupStrategy, PlanContext


def depth_cuts(profile) -> list[int]:
    """The boundaries a device's depth may end at, short of the full model (deepest first)."""
    return [b for b in reversed(profile.cut_points) if b < profile.num_layers - 1]


class DepthFL(PerGroupStrategy):
    name = "depthfl"

    def __init__(self, distill: float = 1.0, store: Optional[ProfileStore] = None):
        self.distill = distill
        self.store = store
        self.exits: Optional[tuple[int, ...]] = None

    def candidates(self, ctx: PlanContext):
        cuts = depth_cuts(ctx.full_profile)
        self.exits = tuple(sorted(cuts))
        return [ctx.config()] + [ctx.config(trained_end=b, aux_head="linear") for b in cuts]

    def configure_round(self, plan: Plan, round: int, group: str) -> Optional[Step]:
        if self.exits is None:  # a plan read from disk: the cut points come from the model's profile
            self.store = self.store or ProfileStore()
            self.exits = tuple(sorted(depth_cuts(self.store.full(plan.model))))
        return super().configure_round(plan, round, group)

    def trainer_options(self, round: int, step: Step, group: Optional[GroupPlan] = None) -> dict:
        exits = tuple(b for b in self.exits or () if step.config.frozen_prefix < b < step.config.end)
        return {"exits": exits, "distill": self.distill} if exits else {}
