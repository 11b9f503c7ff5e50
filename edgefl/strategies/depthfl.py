"""DepthFL: each device trains the first d layers with an early-exit classifier at depth d, d the
deepest cut point whose cost fits (the full model when it fits)."""
from edgefl.strategies.base import PerGroupStrategy, PlanContext


class DepthFL(PerGroupStrategy):
    name = "depthfl"

    def candidates(self, ctx: PlanContext):
        full = ctx.full_profile
        cuts = [b for b in reversed(full.cut_points) if b < full.num_layers - 1]
        return [ctx.config()] + [ctx.config(trained_end=b, aux_head="linear") for b in cuts]
