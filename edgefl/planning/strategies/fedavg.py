"""FedAvg on the full model. A device that cannot train it end to end is excluded (ExclusiveFL):
the baseline every memory-adaptive method is measured against."""
from edgefl.planning.strategies.base import PerGroupStrategy, PlanContext


class FedAvg(PerGroupStrategy):
    name = "fedavg"

    def candidates(self, ctx: PlanContext):
        return [ctx.config()]


class ExclusiveFedAvg(FedAvg):
    name = "exclusive"
