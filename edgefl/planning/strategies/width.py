"""Width-scaled submodels, one per device group: the largest s whose full-depth cost fits (SLT sec. 3,
's_e'). The methods differ only in which channels a scaled layer keeps, which the training half uses:
Federated Dropout draws them at random per device and round, FedRolex rolls a window (SLT eq. 3),
HeteroFL and FjORD keep the first floor(s*M) (FjORD also trains every smaller width per mini-batch)."""
from __future__ import annotations

from typing import Optional

from edgefl.planning.plan import GroupPlan, Step
from edgefl.planning.strategies.base import WIDTHS, PerGroupStrategy, PlanContext


class WidthScaled(PerGroupStrategy):
    index_mode = "prefix"

    def candidates(self, ctx: PlanContext):
        return [ctx.config(head_start=0, head_width=s, index_mode=self.index_mode) for s in WIDTHS]


class FederatedDropout(WidthScaled):
    name = "fd"
    index_mode = "random"


class FedRolex(WidthScaled):
    name = "fedrolex"
    index_mode = "rolling"


class HeteroFL(WidthScaled):
    name = "heterofl"
    static_bn = True


class FjORD(WidthScaled):
    """Ordered dropout: per mini-batch the device samples p uniformly from the grid widths up to its s_e
    (s_e included) and trains the prefix submodel of width p; it uploads its whole s_e submodel."""
    name = "fjord"

    def __init__(self, grid: tuple[float, ...] = tuple(k / 8 for k in range(1, 9))):
        self.grid = grid   # FjORD's discrete width set (uniform); WIDTHS is finer than any p-grid needs

    def trainer_options(self, round: int, step: Step, group: Optional[GroupPlan] = None) -> dict:
        s = step.config.head_width
        return {"fjord_widths": tuple(sorted({p for p in self.grid if p <= s} | {s}))}
