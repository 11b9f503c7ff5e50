"""Width-scaled submodels, one per device group: the largest s whose full-depth cost fits (SLT sec. 3,
's_e'). The methods differ only in which channels a scaled layer keeps, which the training half uses:
Federated Dropout draws them at random per device and round, FedRolex rolls a window (SLT eq. 3),
HeteroFL and FjORD keep the first floor(s*M) (FjORD also trains every smaller width per mini-batch)."""
from edgefl.strategies.base import WIDTHS, PerGroupStrategy, PlanContext


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


class FjORD(WidthScaled):
    name = "fjord"
