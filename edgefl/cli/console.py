"""What the `edgefl` commands print, in one place: the console they print on, plan and cost tables, and how a
run reads to an operator (a finished round's line; the round in progress, header and one line per device,
from the status file's JSON), the same in `edgefl serve`'s live view and in `edgefl status`. Pure
formatting: no I/O but the console, times passed in."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Mapping, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from edgefl.transport.activity import DeviceState
from edgefl.units import format_bytes, format_flops, listing

if TYPE_CHECKING:     # the commands that print them import these; `edgefl --help` need not
    from edgefl.cost.model import Cost
    from edgefl.planning.plan import Plan

# piped output is not wrapped at rich's 80-column default: tables stay one row per step
stdout = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)

STATUS_FILE = "status.json"
STATUS_SCHEMA = "edgefl.status/1"
# who needs a look first
ORDER = tuple(str(s) for s in (DeviceState.OFFLINE, DeviceState.SENT, DeviceState.DOWNLOADING, DeviceState.TRAINING,
                               DeviceState.FAILED, DeviceState.REPORTED))


def round_line(r) -> str:
    """One finished round (a RoundRecord) in one line."""
    reports = sum(r.participating.values())
    acc = f"accuracy {r.accuracy:.4f}" if r.accuracy is not None else "no evaluation"
    line = (f"round {r.round}: {reports}/{len(r.sampled)} reports, {acc}, up {format_bytes(r.upload_bytes)}, "
            f"down {format_bytes(r.download_bytes)}, {r.wall_s:.1f} s")
    for what in ("skipped", "failed", "rejected"):
        if entries := getattr(r, what):
            line += f"; {what}: " + listing([f"{d} ({why})" for d, why in sorted(entries.items())], 3)
    if r.missing:
        line += f"; no report from {listing(r.missing)}"
    if not r.aggregated:
        line += "; below quorum: not aggregated"
    return line


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def header(status: Mapping, now: float) -> str:
    """'round 2 of 5: 1/4 reported, deadline in 412 s; 4/4 devices online'."""
    devices = status.get("devices", {})
    done = sum(d["state"] == DeviceState.REPORTED for d in devices.values())
    line = f"round {status.get('round') or '-'} of {status.get('rounds', '?')}"
    if devices:
        line += f": {done}/{len(devices)} reported"
    if (deadline := status.get("deadline")) is not None:
        line += f", deadline in {max(0, deadline - now):.0f} s ({clock(deadline)})"
    expected = status.get("expected")
    if expected is not None:
        line += f"; {len(status.get('online', []))}/{expected} devices online"
    return line


def device_line(device: str, d: Mapping, group: Optional[str], now: float) -> str:
    line = f"{device:<16} {group or '':<10} {d['state']:<12} {now - d['since']:>5.0f} s"
    if d.get("bytes"):
        line += f"  {format_bytes(d['bytes'])} fetched"
    if d.get("detail"):
        line += f"  {d['detail']}"
    return line


def device_lines(status: Mapping, now: float, shown: int = 40) -> list[str]:
    """The round's devices, those that need a look first; a long fleet ends with a count of the rest."""
    devices = status.get("devices", {})
    groups = status.get("groups", {})
    order = sorted(devices, key=lambda d: (ORDER.index(devices[d]["state"]) if devices[d]["state"] in ORDER
                                           else 0, d))
    lines = [device_line(d, devices[d], groups.get(d), now) for d in order[:shown]]
    if len(order) > shown:
        rest: dict[str, int] = {}
        for d in order[shown:]:
            rest[devices[d]["state"]] = rest.get(devices[d]["state"], 0) + 1
        lines.append(f"... and {len(order) - shown} more: " + ", ".join(f"{n} {s}" for s, n in rest.items()))
    return lines


def _layers(config) -> str:
    r = config.trained_layers
    text = f"{r.start}-{r.stop - 1}" if len(r) > 1 else (str(r.start) if len(r) else "-")
    return text + (f" + {config.aux_head} head@{config.end}" if config.aux_head else "")


def plan_tables(plan: Plan, console: Console) -> None:
    console.print(f"[bold]{plan.method}[/] on [bold]{plan.model.describe()}[/]: {plan.rounds} "
                  f"round{'s' * (plan.rounds != 1)}, batch {plan.batch_size}, {plan.optimizer}")
    for name, g in plan.groups.items():
        budget = format_bytes(g.memory_budget_bytes)
        extra = "".join([f", upload {format_bytes(g.upload_budget_bytes)}" if g.upload_budget_bytes else "",
                         f", {format_flops(g.flops_budget)}/round" if g.flops_budget else ""])
        title = f"{name}: {g.count} device{'s' * (g.count != 1)}, {g.runtime}, {g.agent} agent, budget {budget}{extra}"
        if g.flags:
            title += f" [{', '.join(g.flags)}]"
        if g.excluded:
            console.print(f"[red]{title}: EXCLUDED[/] - {g.reason}")
            continue
        table = Table(title=title, title_justify="left")
        for col in ("rounds", "step", "frozen prefix", "trained layers", "head width", "peak memory",
                    "upload", "FLOPs/sample", "fits"):
            table.add_column(col, justify="right" if col not in ("step", "trained layers", "fits") else "left")
        for _, row in sorted(_step_rows(g) + _sit_out_rows(g)):
            table.add_row(*row)
        console.print(table)
        for out in g.sits_out:
            console.print(f"  [yellow]{name} sits out {out.describe()}[/]")
        console.print(f"  smallest budget that lets {name} take part: {format_bytes(g.min_memory_bytes)}")
    for note in plan.notes:
        console.print(f"[dim]note: {note}[/]")


def _step_rows(g) -> list[tuple[int, list[str]]]:
    """(first round, table row) per step: its config, predicted cost and whether it fits every budget."""
    from edgefl.planning.plan import violations

    rows = []
    for s in g.steps:
        c, p = s.config, s.predicted
        width = f"{c.head_width:g} from {c.head_start}" if c.head_width < 1 else "1"
        bad = violations(p, g, c)
        rows.append((s.rounds[0], [f"{s.rounds[0]}-{s.rounds[1]}", s.label, str(c.frozen_prefix), _layers(c), width,
                                   format_bytes(p.peak_memory_bytes), format_bytes(p.upload_bytes),
                                   format_flops(p.flops_per_sample), "NO: " + "; ".join(bad) if bad else "yes"]))
    return rows


def _sit_out_rows(g) -> list[tuple[int, list[str]]]:
    """(first round, table row) per sit-out: nothing trains, and the budgets that keep the group out."""
    return [(o.rounds[0], [f"{o.rounds[0]}-{o.rounds[1]}", "sits out", "-", "-", "-", "-", "-", "-", f"no: {o.reason}"])
            for o in g.sits_out]


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


def emulated_round_line(record, rounds: int) -> str:
    """One line per emulated round for logs and pipes: when it ended, the evaluation, who trained, how long."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} round {record.round}/{rounds}:"
    if record.accuracy is not None:
        line += f" accuracy {record.accuracy:.4f},"
    if record.loss is not None:
        line += f" loss {record.loss:.4f},"
    line += f" trained {sum(record.participating.values())}/{len(record.sampled)} devices"
    left_out = [f"{len(getattr(record, what))} {what}" for what in ("skipped", "failed", "rejected")
                if getattr(record, what)]
    if record.missing:
        left_out.append(f"{len(record.missing)} missing")
    if left_out:
        line += f" ({', '.join(left_out)})"
    return line + f", {record.wall_s:.1f} s"


@contextmanager
def round_display(console: Console, rounds: int):
    """A live bar on a terminal; elsewhere (a pipe, a log file, CI) a line per round as it ends, since a bar
    is drawn only when it finishes and a long run would print nothing for minutes."""
    if not console.is_terminal:
        yield lambda record: console.print(emulated_round_line(record, rounds), markup=False, highlight=False,
                                           soft_wrap=True)
        return
    with Progress(TextColumn("round {task.completed}/{task.total}"), BarColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[acc]}"), console=console, transient=False) as bar:
        task = bar.add_task("emulate", total=rounds, acc="")
        yield lambda record: bar.update(task, advance=1, acc=f"accuracy {record.accuracy:.3f}"
                                        if record.accuracy is not None else "")
