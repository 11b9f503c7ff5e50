"""A two-group fleet for emulation tests whose small group's budget comes from the cost model, so the
fleet keeps its shape when the model's constants move."""
from edgefl.fleet import parse_fleet
from edgefl.planning.strategies import PlanContext
from edgefl.zoo import ModelRef

CNN = ModelRef.of("cnn")
FLEET = """
fleet:
  groups:
    small: {{count: 6, memory_budget: {small}, runtime: ort}}
    big: {{count: 4, memory_budget: 1GiB, runtime: torch}}
"""


def small_budget() -> int:
    """Where FedOLF trains the CNN's last two layers and no more: FeDepth then needs two blocks, FjORD a
    narrower width and TOA has a frozen layer to shrink."""
    ctx = PlanContext(parse_fleet(FLEET.format(small="1GiB")), CNN, batch_size=32)
    two, three = (ctx.cost(ctx.config(frozen_prefix=k), "ort").peak_memory_bytes for k in (2, 1))
    return two + min(2**20, (three - two) // 2)
