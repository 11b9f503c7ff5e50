"""FeDepth: memory-adaptive depth-wise learning.

Each device splits the network into consecutive blocks it can train one after another within a round,
each block with a skip connection to the classifier (an auxiliary linear head at the block's end; the
last block uses the model's own head). A block start whose smallest block does not fit is skipped and
stays frozen (partial training). Devices with at least twice the full model's cost are marked for
m-FeDepth mutual distillation.

Training half: the step's `sequence` goes down as one instruction (the union of the blocks' weights); the
device trains the blocks one after another, each on all its local data from the blocks before it as
trained, and uploads every block with its skip classifier. Devices flagged 'mutual-distillation' train
`copies` copies of each block with mutual KL distillation (device_runtime objectives.MutualLearning).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from edgefl.cost import Cost
from edgefl.plan import GroupPlan, Step, violations
from edgefl.strategies.base import PlanContext, Strategy, first_fit, group_plan


def sequence_cost(costs: list[Cost]) -> Cost:
    """Blocks trained one after another: memory is the largest block's, work and upload add up."""
    peak = max(costs, key=lambda c: c.peak_memory_bytes)
    return replace(peak, flops_per_sample=sum(c.flops_per_sample for c in costs),
                   upload_bytes=sum(c.upload_bytes for c in costs),
                   download_bytes=max(c.download_bytes for c in costs),
                   trained_params=sum(c.trained_params for c in costs))


class FeDepth(Strategy):
    name = "fedepth"

    def __init__(self, copies: int = 2, noise: float = 0.01):
        self.copies, self.noise = copies, noise      # m-FeDepth: models per flagged device, peers' init noise

    def trainer_options(self, round: int, step: Step, group: Optional[GroupPlan] = None) -> dict:
        if group is not None and "mutual-distillation" in group.flags and self.copies > 1:
            return {"mutual": self.copies, "mutual_noise": self.noise}
        return {}

    def block(self, ctx: PlanContext, start: int, end: int):
        if end == ctx.num_layers:
            return ctx.config(frozen_prefix=start)
        return ctx.config(frozen_prefix=start, trained_end=end, aux_head="linear")

    def plan(self, ctx: PlanContext):
        L = ctx.num_layers
        ends = sorted({b for b in ctx.full_profile.cut_points if b < L - 1} | {L})
        starts = [0] + ends[:-1]
        full = ctx.config()
        groups = {}
        for g in ctx.fleet.groups:
            sequence, skipped, p = [], [], 0
            while p < L:
                options = [self.block(ctx, p, e) for e in reversed(ends) if e > p]   # largest block first
                done = [ctx.cost(c, g.runtime) for c in sequence]
                # the block must fit on its own and, with the blocks before it, the round's FLOP and upload budgets
                i = first_fit(options, lambda c: not violations(sequence_cost(done + [ctx.cost(c, g.runtime)]), g, c))
                chosen = None if i is None else options[i]
                if chosen is None:
                    skipped.append(p)
                    p = next(e for e in ends if e > p)
                else:
                    sequence.append(chosen)
                    p = chosen.end
            steps = []
            if sequence:
                predicted = sequence_cost([ctx.cost(c, g.runtime) for c in sequence])
                label = f"{len(sequence)} blocks" + (f", skips layers from {skipped}" if skipped else "")
                steps = [Step(rounds=(1, ctx.rounds), config=sequence[0], predicted=predicted,
                              sequence=tuple(sequence), label=label)]
            flags = ("mutual-distillation",) if g.memory_budget_bytes >= 2 * ctx.cost(full, g.runtime).peak_memory_bytes else ()
            cheapest = [self.block(ctx, s, e) for s, e in zip(starts, ends, strict=True)]
            groups[g.name] = group_plan(ctx, g, steps, cheapest, flags=flags)
        return self.new_plan(ctx, groups)
