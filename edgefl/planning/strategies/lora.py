"""Heterogeneous LoRA (Cho et al. 2023, as CAFF App. B runs it): every device trains low-rank adapters
B A on the linear weights of the blocks, with the largest rank its budgets allow,

    r_c = max r  s.t.  M(F^r) <= M_c  and  U(F^r) <= U_c  and  O(F^r) <= O_c      (the form of CAFF eq. 6),

costs from edgefl.cost.model (LoRA: frozen base weights, adapters and their rank-r intermediates; activations
as in full training, CAFF App. A). The embedding stays frozen (CAFF sec. 4.1); LayerNorms and the output
layer train in full. Ranks run from `max_rank` (capped at the smallest side of any adapted weight) down
to 1; a group that cannot train rank 1 is excluded.

Training half (edgefl.server.lowrank): the server keeps the adapters at the largest rank asked for; a device of
rank r gets their first r components, and each component is averaged over the devices that trained it
(mode 'trained', HeteroFL's rule for nested slices), then merged into the global weights.
"""
from __future__ import annotations

from edgefl.planning.strategies.base import PlanContext, Strategy, group_plan, whole_run
from edgefl.trainconfig import TrainConfig

EMBEDDED = ("transformer", "vit")     # layer 0 is an embedding table / patch embedding: kept frozen


def frozen_embedding(ctx: PlanContext) -> int:
    return 1 if ctx.model.name in EMBEDDED else 0


def rank_cap(ctx: PlanContext, max_rank: int) -> int:
    """max_rank, or less where an adapted weight is smaller: a rank beyond min(P, Q) adds nothing."""
    layers = ctx.full_profile.layers[frozen_embedding(ctx): ctx.num_layers - 1]
    sides = [min(p, q) for layer in layers for p, q, _, _ in layer.linears]
    return max(1, min([max_rank, *sides]))


def rank_configs(ctx: PlanContext, mode: str, max_rank: int) -> list[TrainConfig]:
    """Configs from the highest rank to rank 1 (most to least demanding: every cost grows with the rank)."""
    f = frozen_embedding(ctx)
    return [ctx.config(frozen_prefix=f, rank=r, rank_mode=mode) for r in range(rank_cap(ctx, max_rank), 0, -1)]


class HeterogeneousLoRA(Strategy):
    name = "lora"
    aggregation = "trained"

    def __init__(self, max_rank: int = 32):
        self.max_rank = max_rank

    def plan(self, ctx: PlanContext):
        ranked = rank_configs(ctx, "lora", self.max_rank)
        groups = {}
        for g in ctx.fleet.groups:
            config = ctx.best(ranked, g)
            label = f"rank {config.rank}" if config else ""
            groups[g.name] = group_plan(ctx, g, whole_run(ctx, g, config, label), ranked[-1:])
        return self.new_plan(ctx, groups)
