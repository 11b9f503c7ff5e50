"""Rich tables for plans and cost breakdowns."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from edgefl.cost import Cost
from edgefl.plan import Plan
from edgefl.units import format_bytes, format_flops


def _layers(config) -> str:
    r = config.trained_layers
    text = f"{r.start}-{r.stop - 1}" if len(r) > 1 else (str(r.start) if len(r) else "-")
    return text + (f" + {config.aux_head} head@{config.end}" if config.aux_head else "")


def plan_tables(plan: Plan, console: Console) -> None:
    console.print(f"[bold]{plan.method}[/] on [bold]{plan.model.label()}[/]: {plan.rounds} rounds, batch "
                  f"{plan.batch_size}, {plan.optimizer}")
    for name, g in plan.groups.items():
        budget = format_bytes(g.memory_budget_bytes)
        extra = "".join([f", upload {format_bytes(g.upload_budget_bytes)}" if g.upload_budget_bytes else "",
                         f", {format_flops(g.flops_budget)}/round" if g.flops_budget else ""])
        title = f"{name}: {g.count} devices, {g.runtime}, budget {budget}{extra}"
        if g.flags:
            title += f" [{', '.join(g.flags)}]"
        if g.excluded:
            console.print(f"[red]{title}: EXCLUDED[/] - {g.reason}")
            continue
        table = Table(title=title, title_justify="left")
        for col in ("rounds", "step", "frozen prefix", "trained layers", "head width", "peak memory",
                    "upload", "FLOPs/sample", "fits"):
            table.add_column(col, justify="right" if col not in ("step", "trained layers") else "left")
        for s in g.steps:
            c, p = s.config, s.predicted
            width = f"{c.head_width:g} from {c.head_start}" if c.head_width < 1 else "1"
            table.add_row(f"{s.rounds[0]}-{s.rounds[1]}", s.label, str(c.frozen_prefix), _layers(c), width,
                          format_bytes(p.peak_memory_bytes), format_bytes(p.upload_bytes),
                          format_flops(p.flops_per_sample), "yes" if p.peak_memory_bytes <= g.memory_budget_bytes else "NO")
        console.print(table)
        console.print(f"  smallest budget that lets {name} take part: {format_bytes(g.min_memory_bytes)}")
    for note in plan.notes:
        console.print(f"[dim]note: {note}[/]")


def cost_table(cost: Cost, measured: dict | None, console: Console, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("part")
    table.add_column("predicted", justify="right")
    if measured:
        table.add_column("measured", justify="right")
    rows = [("runtime baseline", cost.runtime_baseline_bytes, measured and measured.get("baseline_rss_bytes")),
            ("weights, frozen", cost.weights_frozen_bytes, None),
            ("weights, trained", cost.weights_trained_bytes, None),
            ("gradients", cost.gradient_bytes, None),
            ("optimizer state", cost.optimizer_bytes, None),
            ("activations kept", cost.activation_bytes, measured and measured.get("activation_bytes")),
            ("workspace", cost.workspace_bytes, None),
            ("training bytes", cost.training_bytes, measured and measured.get("peak_rss_growth_bytes")),
            ("peak memory", cost.peak_memory_bytes, measured and measured.get("peak_rss_bytes"))]
    for name, pred, meas in rows:
        cells = [name, format_bytes(pred)] + ([format_bytes(meas) if meas is not None else ""] if measured else [])
        table.add_row(*cells)
    console.print(table)
    console.print(f"FLOPs per sample {format_flops(cost.flops_per_sample)}, upload {format_bytes(cost.upload_bytes)}, "
                  f"download {format_bytes(cost.download_bytes)}, trained parameters {cost.trained_params:,}")
