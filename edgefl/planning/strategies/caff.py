"""CAFF: federated finetuning of tiny pretrained transformers under memory, upload and FLOP budgets.

From a set of pretrained architectures F_l (the LM with l in {3, 6, 9, 12} layers by default) the
feasible set holds those where every device has some t in [1, l] meeting all its budgets (eq. 1/2).
Among them CAFF picks the F_l that maximises the mean over devices of their largest feasible t_c, ties
going to the deeper model (eq. 3). Device c trains its last t_c transformer layers plus the output
LayerNorm and linear; embeddings stay frozen. When no architecture suits every group, the one that
lets the most devices take part is chosen and the rest are reported as excluded.
"""
from __future__ import annotations

from typing import Optional, Sequence

from edgefl.planning.strategies.base import PlanContext, Strategy, group_plan, whole_run
from edgefl.zoo import ModelRef

DEFAULT_DEPTHS = (3, 6, 9, 12)


def architectures(model: ModelRef, depths: Optional[Sequence[int]] = None) -> list[ModelRef]:
    """The candidate F_l: for the transformer, one per depth; any other model stands alone."""
    if model.name != "transformer":
        return [model]
    args = {k: v for k, v in model.args.items() if k != "layers"}
    return [ModelRef.of("transformer", layers=l, **args) for l in sorted(set(depths or DEFAULT_DEPTHS))]


class CAFF(Strategy):
    name = "caff"
    aggregation = "sampled"   # CAFF eq. 4/5: layer-wise weighted averaging over the round's devices

    def __init__(self, depths: Optional[Sequence[int]] = None):
        self.depths = depths

    def trainable(self, ctx: PlanContext, t: int):
        """Train the last t blocks and the output layer; the layer list is [embedding, blocks..., head]."""
        return ctx.config(frozen_prefix=ctx.num_layers - 1 - t)

    def per_group_t(self, ctx: PlanContext) -> dict[str, Optional[int]]:
        blocks = ctx.num_layers - 2 if ctx.model.name == "transformer" else ctx.num_layers - 1
        ranked = [self.trainable(ctx, t) for t in range(blocks, 0, -1)]   # most layers first
        best = {g.name: ctx.best(ranked, g) for g in ctx.fleet.groups}
        return {name: (ctx.num_layers - 1 - c.frozen_prefix if c else None) for name, c in best.items()}

    def plan(self, ctx: PlanContext):
        scored = []
        for ref in architectures(ctx.model, self.depths):
            actx = ctx.with_model(ref)
            t = self.per_group_t(actx)
            devices = sum(g.count for g in ctx.fleet.groups if t[g.name] is not None)
            mean_t = sum(g.count * t[g.name] for g in ctx.fleet.groups if t[g.name]) / max(devices, 1)
            feasible = devices == ctx.fleet.device_count
            depth = actx.num_layers
            scored.append(((feasible, devices, mean_t, depth), ref, actx, t))
        (_, _, mean_t, _), ref, actx, t = max(scored, key=lambda row: row[0])
        groups = {g.name: group_plan(actx, g, whole_run(actx, g, self.trainable(actx, t[g.name]) if t[g.name] else None),
                                     [self.trainable(actx, 1)])
                  for g in ctx.fleet.groups}
        notes = ["architectures (feasible for all, devices, mean t_c): " + "; ".join(
            f"{r.label()}: {'yes' if k[0] else 'no'}, {k[1]}, {k[2]:.2f}" for k, r, _, _ in scored),
            f"chosen {ref.label()} (CAFF eq. 3: maximise mean t_c, ties to the deeper model)"]
        plan = self.new_plan(actx, groups, notes)
        return plan
