"""SLT: Successive Layer Training (NeurIPS 2023).

Step n trains S_n = {K_F = n-1, K_T = n, s_n}: layers 1..n-1 frozen, layer n at full width, the head
(layers n+1..K) at width s_n. s_n = max s with memory(S_n) <= budget and s_n <= s_j for j > n (eq. 2);
N is the first step where s = 1 fits; a pre-training step trains the whole model at width s (K_F = K_T = 0).
Heterogeneous fleets: the tightest group sets s_n, every other group keeps K_T and s_n but freezes as
few layers as its own budget allows (eq. 7). Rounds follow the share of parameters trained (eq. 5/6).
Layer indices here are 0-based: frozen_prefix = K_F, head_start = K_T.
"""
from __future__ import annotations

from typing import Optional

from edgefl.planning.plan import Step
from edgefl.planning.strategies.base import WIDTHS, PlanContext, Strategy, first_fit, group_plan
from edgefl.trainconfig import TrainConfig


def slt_config(ctx: PlanContext, n: int, s: float, frozen: Optional[int] = None) -> TrainConfig:
    """S_n (n >= 1), or the pre-training configuration for n = 0."""
    if n == 0:
        return ctx.config(head_start=0, head_width=s)
    if n >= ctx.num_layers - 1:
        s = 1.0  # the classifier's output is never scaled: no head left to shrink
    return ctx.config(frozen_prefix=n - 1 if frozen is None else frozen, head_start=n, head_width=s)


def trained_share(ctx: PlanContext, n: int, s: float) -> int:
    """Q of SLT eq. 5, read cumulatively: parameters filled so far (layers 1..K_T at full width) plus the
    head's current share. With K_F = 0 this is eq. 5 exactly; cumulatively, eq. 6's steps sum to R."""
    full = ctx.full_profile.layers
    config = slt_config(ctx, n, s)
    scaled = ctx.store.profile(ctx.model, None if config.head_width == 1 else config.widths).layers
    return sum(l.params for l in full[:n]) + sum(l.params for l in scaled[n:])


def round_schedule(rounds: int, shares: list[int], total: int) -> list[tuple[int, int]]:
    """Eq. 6: step i ends at round R * Q_i / Q(0,0,1); the last step ends at R. Ranges are inclusive and
    may be empty (first > last) when a step's share rounds to no round."""
    if not shares:
        return []
    ends = [int(rounds * q / total + 0.5) for q in shares[:-1]] + [rounds]
    ends = [min(max(e, 0), rounds) for e in ends]
    ranges, last = [], 0
    for end in ends:
        end = max(end, last)
        ranges.append((last + 1, end))
        last = end
    return ranges


class SLT(Strategy):
    name = "slt"

    def max_width(self, ctx: PlanContext, n: int, cap: float, group) -> Optional[float]:
        widths = [s for s in WIDTHS if s <= cap]
        i = first_fit(widths, lambda s: ctx.fits(slt_config(ctx, n, s), group))
        return None if i is None else widths[i]

    def pace(self, ctx: PlanContext, n: int, cap: float) -> Optional[float]:
        """s_n: the largest width every group able to run step n can afford (the tightest sets it). Each
        group searches only below the smallest width found so far: one that affords it cannot lower the
        minimum, so it costs a single probe (each probe of a new width profiles the model once)."""
        best = None
        for g in sorted(ctx.fleet.groups, key=lambda g: g.memory_budget_bytes):
            s = self.max_width(ctx, n, cap if best is None else best, g)
            if s is not None:
                best = s
        return best

    def plan(self, ctx: PlanContext):
        K = ctx.num_layers
        # eq. 2 from the back: s_n <= s_j for all j > n; N is the first step that trains at s = 1
        widths: dict[int, Optional[float]] = {}
        cap, last = 1.0, K - 1
        for n in range(K - 1, 0, -1):
            widths[n] = self.pace(ctx, n, cap)
            cap = widths[n] or cap
            if widths[n] == 1.0:
                last = n
        widths = {n: s for n, s in widths.items() if n <= last}
        first = next((n for n in range(1, last + 1) if widths[n] is not None), None)
        widths[0] = self.pace(ctx, 0, widths[first]) if first is not None else None
        steps = [n for n in range(0, last + 1) if widths[n] is not None]
        total = sum(l.params for l in ctx.full_profile.layers)
        shares = [trained_share(ctx, n, widths[n]) for n in steps]
        ranges = dict(zip(steps, round_schedule(ctx.rounds, shares, total), strict=True))

        groups, notes = {}, []
        for g in ctx.fleet.groups:
            planned = []
            for n in steps:
                first_round, last_round = ranges[n]
                if first_round > last_round:
                    continue
                config = self.least_frozen(ctx, n, widths[n], g)
                if config is not None:
                    planned.append(Step(rounds=ranges[n], config=config, predicted=ctx.cost(config, g.runtime),
                                        label="pre-training" if n == 0 else f"step {n}"))
            # the least demanding SLT configurations: the narrowest pre-training and the last layers alone
            cheapest = [slt_config(ctx, 0, WIDTHS[-1]), slt_config(ctx, K - 1, 1.0)]
            groups[g.name] = group_plan(ctx, g, planned, cheapest)
        skipped = [n for n in steps if ranges[n][0] > ranges[n][1]]
        notes.append(f"N = {last} steps after pre-training; head widths s_n: "
                     + ", ".join(f"{n}:{widths[n]:g}" for n in steps))
        if skipped:
            notes.append(f"steps {skipped} get no rounds at R = {ctx.rounds} (their parameter share rounds to 0)")
        return self.new_plan(ctx, groups, notes)

    def least_frozen(self, ctx: PlanContext, n: int, s: float, group) -> Optional[TrainConfig]:
        """Eq. 7: for K_T = n and s_n, the smallest K_F the group's budget allows."""
        if n == 0:
            config = slt_config(ctx, 0, s)
            return config if ctx.fits(config, group) else None
        return ctx.best([slt_config(ctx, n, s, frozen=k) for k in range(0, n)], group)
