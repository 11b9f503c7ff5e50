"""DepthFL: each device trains the first d layers with an early-exit classifier at depth d, d the
deepest cut point whose cost fits (the full model when it fits).

Training half (DepthFL's self-distillation): a device of depth d also holds the exits below d, one
linear classifier at each candidate depth b < d (the cut points the planner chooses depths from, shared
with every device deep enough to hold them), and minimises the sum of every exit's cross-entropy plus
`distill` x the mean KL between each exit and the others (device_runtime objectives.SelfDistillation).
Those exits are part of the config (`TrainConfig.exits`), so the planner's cost counts their weights,
gradients, optimizer state, kept activations, FLOPs and upload (edgefl.cost.model).
"""
from __future__ import annotations

from typing import Optional

from edgefl.planning.plan import GroupPlan, Plan, Step
from edgefl.planning.strategies.base import PerGroupStrategy, PlanContext, deepest_trained
from edgefl.trainconfig import TrainConfig


def depth_cuts(profile) -> list[int]:
    """The boundaries a device's depth may end at, short of the full model (deepest first)."""
    return [b for b in reversed(profile.cut_points) if b < profile.num_layers - 1]


class DepthFL(PerGroupStrategy):
    name = "depthfl"

    def __init__(self, distill: float = 1.0):
        self.distill = distill

    def candidates(self, ctx: PlanContext):
        cuts = depth_cuts(ctx.full_profile)
        full = ctx.config(exits=tuple(sorted(cuts)))
        return [full] + [ctx.config(trained_end=b, aux_head="linear", exits=tuple(sorted(c for c in cuts if c < b)))
                         for b in cuts]

    def trainer_options(self, round: int, step: Step, group: Optional[GroupPlan] = None) -> dict:
        exits = step.config.exits
        return {"exits": exits, "distill": self.distill} if exits else {}

    def evaluated_config(self, plan: Plan) -> Optional[TrainConfig]:
        """The full model when some group trains it; else the deepest depth any group trains."""
        return deepest_trained([s.config for g in plan.groups.values() if not g.excluded for s in g.steps])
