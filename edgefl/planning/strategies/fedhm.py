"""FedHM (Yao et al. 2021, as CAFF App. B runs it): low-rank factorisation with a per-device rank. A device
whose budgets allow it trains the model in full (CAFF: the least constrained device trains it without
SVD); every other device trains the blocks' linear weights as factors of rank

    z_c = max z  s.t.  M(F^z) <= M_c  and  U(F^z) <= U_c  and  O(F^z) <= O_c                 (CAFF eq. 6),

with costs from edgefl.cost.model (W in R^{P x Q} becomes U diag(S) in R^{P x z} and V^T in R^{z x Q}). The
embedding stays frozen and the output layer trains in full, as for Heterogeneous LoRA. Full training is
not always dearer than a high rank (the factors' intermediates cost activations), so it is tried first
and the ranks are searched only when it does not fit.

Training half (edgefl.server.lowrank): the server sends each device the truncated SVD of the global weights and
reconstructs W = U V from what it sends back; full matrices are averaged (mode 'trained').
"""
from __future__ import annotations

from edgefl.planning.strategies.base import PlanContext, Strategy, group_plan, whole_run
from edgefl.planning.strategies.lora import frozen_embedding, rank_configs


class FedHM(Strategy):
    name = "fedhm"
    aggregation = "trained"

    def __init__(self, max_rank: int = 32):
        self.max_rank = max_rank

    def plan(self, ctx: PlanContext):
        full = ctx.config(frozen_prefix=frozen_embedding(ctx))
        ranked = rank_configs(ctx, "factor", self.max_rank)
        groups = {}
        for g in ctx.fleet.groups:
            config = full if ctx.fits(full, g) else ctx.best(ranked, g)
            label = "" if config is None else ("full rank" if config.rank is None else f"rank {config.rank}")
            groups[g.name] = group_plan(ctx, g, whole_run(ctx, g, config, label), [full, ranked[-1]])
        return self.new_plan(ctx, groups)
