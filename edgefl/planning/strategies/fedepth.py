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
The copies are part of their block configs (`TrainConfig.copies`), so the planned cost holds the copies'
weights, gradients, optimizer state, activations and FLOPs (edgefl.cost.model); a surplus device whose blocks
do not all fit with copies trains them alone, unflagged.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from edgefl.cost.model import Cost
from edgefl.planning.plan import GroupPlan, Step, violations
from edgefl.planning.strategies.base import PlanContext, Strategy, first_fit, group_plan


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
        copies = step.config.copies
        return {"mutual": copies, "mutual_noise": self.noise} if copies > 1 else {}

    def block(self, ctx: PlanContext, start: int, end: int, copies: int = 1):
        if end == ctx.num_layers:
            return ctx.config(frozen_prefix=start, copies=copies)
        return ctx.config(frozen_prefix=start, trained_end=end, aux_head="linear", copies=copies)

    def blocks(self, ctx: PlanContext, g, ends: list[int], copies: int) -> tuple[list, list[int]]:
        """(block configs in order, layer starts skipped): largest block first from each start."""
        sequence, skipped, p = [], [], 0
        while p < ctx.num_layers:
            options = [self.block(ctx, p, e, copies) for e in reversed(ends) if e > p]
            done = [ctx.cost(c, g) for c in sequence]
            # the block must fit on its own and, with the blocks before it, the round's FLOP and upload budgets
            i = first_fit(options, lambda c: not violations(sequence_cost(done + [ctx.cost(c, g)]), g, c))
            if i is None:
                skipped.append(p)
                p = next(e for e in ends if e > p)
            else:
                sequence.append(options[i])
                p = options[i].end
        return sequence, skipped

    def plan(self, ctx: PlanContext):
        L = ctx.num_layers
        ends = sorted({b for b in ctx.full_profile.cut_points if b < L - 1} | {L})
        starts = [0] + ends[:-1]
        full = ctx.config()
        groups = {}
        for g in ctx.fleet.groups:
            sequence, skipped = self.blocks(ctx, g, ends, 1)
            surplus = g.memory_budget_bytes >= 2 * ctx.cost(full, g).peak_memory_bytes
            if surplus and self.copies > 1:
                mutual, mutual_skipped = self.blocks(ctx, g, ends, self.copies)
                surplus = len(mutual_skipped) <= len(skipped)
                if surplus:
                    sequence, skipped = mutual, mutual_skipped
            steps = []
            if sequence:
                predicted = sequence_cost([ctx.cost(c, g) for c in sequence])
                label = f"{len(sequence)} blocks" + (f", skips layers from {skipped}" if skipped else "")
                steps = [Step(rounds=(1, ctx.rounds), config=sequence[0], predicted=predicted,
                              sequence=tuple(sequence), label=label)]
            flags = ("mutual-distillation",) if surplus else ()
            cheapest = [self.block(ctx, s, e) for s, e in zip(starts, ends, strict=True)]
            groups[g.name] = group_plan(ctx, g, steps, cheapest, flags=flags)
        return self.new_plan(ctx, groups)
