"""FedOLF: ordered layer freezing. Device k freezes the smallest number l_k of leading layers whose
remaining training cost fits its budget (FedOLF sec. 3.4, eq. 4); the rest train at full width."""
from edgefl.planning.strategies.base import PerGroupStrategy, PlanContext


class FedOLF(PerGroupStrategy):
    name = "fedolf"

    def candidates(self, ctx: PlanContext):
        # l_k = 0 (train everything) is the most demanding; at least the last layer trains
        return [ctx.config(frozen_prefix=k) for k in range(ctx.num_layers)]
