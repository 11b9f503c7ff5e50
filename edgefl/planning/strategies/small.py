"""Small model: every device trains the same width-scaled model end to end, s set by the tightest
group that can train any width (SLT sec. 3, 'Small model')."""
from typing import Optional

from edgefl.planning.plan import Plan
from edgefl.planning.strategies.base import WIDTHS, PlanContext, Strategy, group_plan, whole_run
from edgefl.trainconfig import TrainConfig


class SmallModel(Strategy):
    name = "small"

    def plan(self, ctx: PlanContext):
        ranked = [ctx.config(head_start=0, head_width=s) for s in WIDTHS]
        chosen = {g.name: ctx.best(ranked, g) for g in ctx.fleet.groups}
        able = [c for c in chosen.values() if c is not None]
        common = min(able, key=lambda c: c.head_width) if able else None
        groups = {g.name: group_plan(ctx, g, whole_run(ctx, g, common if chosen[g.name] else None), ranked[-1:])
                  for g in ctx.fleet.groups}
        notes = [f"common width s = {common.head_width:g}"] if common else []
        return self.new_plan(ctx, groups, notes)

    def evaluated_config(self, plan: Plan) -> Optional[TrainConfig]:
        """The common width-s model every device trains (SLT's baseline is that small model, not the full one)."""
        return next((g.steps[0].config for g in plan.groups.values() if g.steps), None)
