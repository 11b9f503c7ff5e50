"""ProFL: progressive training by architectural block.

Blocks follow the architecture's stages (4 for the CIFAR ResNets; `blocks` merges stages to fewer).
Progressive model shrinking trains blocks T..2 back to front, each with an output module standing in
for the blocks after it (one conv per later stage, then the classifier); progressive model growing then
trains blocks 1..T front to back with the earlier blocks frozen. A device that cannot afford the block
being trained trains only the output module. The rounds given to each step here are an even split:
the training half switches steps online by effective movement (ProFL sec. 3.3).
"""
from __future__ import annotations

from typing import Optional

from edgefl.plan import Step
from edgefl.strategies.base import PlanContext, Strategy, group_plan
from edgefl.strategies.slt import round_schedule


def block_ends(ctx: PlanContext, blocks: Optional[int]) -> list[int]:
    L = ctx.num_layers
    ends = sorted({b for b in ctx.full_profile.stages if 0 < b < L - 1}) + [L]
    if blocks is not None and blocks < len(ends):
        # merge stages evenly into `blocks` blocks, keeping the last one ending at L
        ends = [ends[round((i + 1) * len(ends) / blocks) - 1] for i in range(blocks)]
    return ends


class ProFL(Strategy):
    name = "profl"

    def __init__(self, blocks: Optional[int] = None):
        self.blocks = blocks

    def plan(self, ctx: PlanContext):
        L = ctx.num_layers
        ends = block_ends(ctx, self.blocks)
        starts = [0] + ends[:-1]
        T = len(ends)

        def train_block(t):
            s, e = starts[t], ends[t]
            return ctx.config(frozen_prefix=s, trained_end=e, aux_head="conv") if e < L else ctx.config(frozen_prefix=s)

        def output_only(t):
            e = ends[t]
            return ctx.config(frozen_prefix=e, trained_end=e, aux_head="conv") if e < L else ctx.config(frozen_prefix=L - 1)

        order = [("shrink", t) for t in range(T - 1, 0, -1)] + [("grow", t) for t in range(T)]
        ranges = round_schedule(ctx.rounds, [i + 1 for i in range(len(order))], len(order))
        groups = {}
        for g in ctx.fleet.groups:
            steps = []
            for (stage, t), rounds in zip(order, ranges, strict=True):
                if rounds[0] > rounds[1]:
                    continue
                for config, what in ((train_block(t), "block"), (output_only(t), "output module only")):
                    if ctx.fits(config, g):
                        steps.append(Step(rounds=rounds, config=config, predicted=ctx.cost(config, g.runtime),
                                          label=f"{stage} block {t + 1}/{T}: {what}"))
                        break
            groups[g.name] = group_plan(ctx, g, steps, [output_only(t) for t in range(T)])
        notes = [f"blocks end at layers {ends}; {len(order)} steps (shrinking {T - 1}, growing {T})"]
        return self.new_plan(ctx, groups, notes)
