"""SLT: Successive Layer Training (NeurIPS 2023).

Step n trains S_n = {K_F = n-1, K_T = n, s_n}: layers 1..n-1 frozen, layer n at full width, the head
(layers n+1..K) at width s_n. s_n = max s with memory(S_n) <= budget and s_n <= s_j for j > n (eq. 2);
N is the first step where s = 1 fits; a pre-training step trains the whole model at width s (K_F = K_T = 0).
Heterogeneous fleets: the tightest group sets s_n, every other group keeps K_T and s_n but freezes as
few layers as its own budget allows (eq. 7). Rounds follow the share of parameters trained (eq. 5/6).
Layer indices here are 0-based: frozen_prefix = K_F, head_start = K_T.

Where edgefl departs from the paper (sec. 3, "heterogeneous constraints"):
- A budget is memory, upload bytes per round and FLOPs per round alike: eq. 2 and eq. 7 read
  memory(S_n) <= m_constraint as "S_n breaks none of the group's budgets". The paper constrains memory only
  (its sec. 5 names per-round communication and FLOP constraints as future work).
- Eq. 7 searches K_F in [0, K_T - 1], which for a group tighter in another budget than the one that set s_n
  (an upload budget below the full-width layer K_T's parameters) can hold no configuration: the group would sit
  out the step. Here the search goes on past the paper: K_F = K_T, freezing the layer the step fills too and
  training the head alone at s_n; and where s_n = 1 (the last step, no head left to keep whole), K_F up to
  K - 1, training only the last layers. A frozen layer is never narrower than full width, so K_F never passes
  K_T while the head is scaled. A group that no configuration of a step fits still sits it out, and the plan
  names those rounds with the budgets its most frozen configuration breaks (`GroupPlan.sits_out`).
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
            planned, idle = [], []
            for n in steps:
                first_round, last_round = ranges[n]
                if first_round > last_round:
                    continue
                candidates = self.freezing(ctx, n, widths[n])
                config = ctx.best(candidates, g)
                if config is None:
                    idle.append((ranges[n], candidates[-1]))
                else:
                    planned.append(Step(rounds=ranges[n], config=config, predicted=ctx.cost(config, g),
                                        label="pre-training" if n == 0 else f"step {n}"))
            # the least demanding SLT configurations: the narrowest pre-training and the last layer alone
            cheapest = [slt_config(ctx, 0, WIDTHS[-1]), slt_config(ctx, K - 1, 1.0, frozen=K - 1)]
            groups[g.name] = group_plan(ctx, g, planned, cheapest, idle=idle)
        skipped = [n for n in steps if ranges[n][0] > ranges[n][1]]
        notes.append(f"N = {last} steps after pre-training; head widths s_n: "
                     + ", ".join(f"{n}:{widths[n]:g}" for n in steps))
        if skipped:
            notes.append(f"steps {skipped} get no rounds at R = {ctx.rounds} (their parameter share rounds to 0)")
        return self.new_plan(ctx, groups, notes)

    def least_frozen(self, ctx: PlanContext, n: int, s: float, group) -> Optional[TrainConfig]:
        """Eq. 7: for K_T = n and s_n, the smallest K_F the group's budgets allow."""
        return ctx.best(self.freezing(ctx, n, s), group)

    def freezing(self, ctx: PlanContext, n: int, s: float) -> list[TrainConfig]:
        """Step n's configurations from the least frozen: eq. 7's K_F = 0 .. K_T - 1, then (module doc) K_F = K_T,
        or up to K - 1 where the step trains at full width. Pre-training freezes nothing."""
        if n == 0:
            return [slt_config(ctx, 0, s)]
        most = ctx.num_layers - 1 if slt_config(ctx, n, s).head_width == 1 else n
        return [slt_config(ctx, n, s, frozen=k) for k in range(0, most + 1)]
