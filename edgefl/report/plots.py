"""The report's figures, one function each, returning a matplotlib Figure (saved by `edgefl.report.page`).

Figures are built without pyplot (no global state) and are wide and short: the page shows each at the
full width of the window. Round axes carry whole-number ticks only; sizes and FLOPs are plotted in the
largest unit their maximum reaches (edgefl.units), so an axis never reads 1e8. An accuracy axis spans at least
ACCURACY_SPAN: a run that barely moves is drawn flat, not stretched over the plot's height.
"""
from __future__ import annotations

import textwrap

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from edgefl.report.runs import STATUSES, Run, cumulative, measured_peaks, participation
from edgefl.units import format_bytes, format_flops

WIDTH_IN, HEIGHT_IN, DPI = 12.0, 4.4, 110
ACCURACY_SPAN = 0.1
_SCALE = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "FLOP": 1, "kFLOP": 1e3,
          "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15}
_STATUS_COLOUR = {"trained": "tab:green", "skipped": "tab:gray", "failed": "tab:red", "rejected": "tab:orange",
                  "missing": "tab:purple"}


def _axes(title: str = ""):
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def _finish(fig, ax, xlabel: str, ylabel: str, rounds_on_x: bool = False) -> Figure:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if rounds_on_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:   # beside the axes, where it hides no bar or line
        fig.legend(fontsize=9, loc="outside right upper")
    return fig


def _accuracy_axis(ax) -> None:
    """At least ACCURACY_SPAN of accuracy around what is drawn, within [0, 1]."""
    lo, hi = ax.get_ylim()
    if hi - lo < ACCURACY_SPAN:
        lo = min(max(0.0, (lo + hi - ACCURACY_SPAN) / 2), 1.0 - ACCURACY_SPAN)
        ax.set_ylim(lo, lo + ACCURACY_SPAN)


def _unit(largest: float, fmt) -> tuple[str, float]:
    """The unit format_bytes/format_flops would print `largest` in, and its size."""
    unit = fmt(largest).split()[-1]
    return unit, _SCALE[unit]


def accuracy_vs_round(runs: list[Run]) -> Figure:
    fig, ax = _axes()
    for run in runs:
        if points := run.evaluated("accuracy"):
            ax.plot(*zip(*points), marker=".", label=run.name)
    _accuracy_axis(ax)
    return _finish(fig, ax, "round", "test accuracy", rounds_on_x=True)


def loss_vs_round(runs: list[Run]) -> Figure:
    fig, ax = _axes()
    for i, run in enumerate(runs):
        colour = f"C{i}"
        if points := run.evaluated("loss"):
            ax.plot(*zip(*points), marker=".", color=colour, label=f"{run.name}: test loss")
        if points := run.evaluated("train_loss"):
            ax.plot(*zip(*points), linestyle="--", color=colour, label=f"{run.name}: training loss (devices)")
    return _finish(fig, ax, "round", "cross-entropy loss", rounds_on_x=True)


def accuracy_vs_cumulative(runs: list[Run], key: str) -> Figure:
    """Accuracy against cumulative upload bytes (`key` 'upload_bytes') or device FLOPs ('flops')."""
    fig, ax = _axes()
    totals = {run.name: cumulative(r.get(key) for r in run.rounds) for run in runs}
    largest = max((t[-1] for t in totals.values() if t), default=0) or 1
    unit, scale = _unit(largest, format_flops if key == "flops" else format_bytes)
    for run in runs:
        points = [(x / scale, r["accuracy"]) for x, r in zip(totals[run.name], run.rounds, strict=True)
                  if r.get("accuracy") is not None]
        if points:
            ax.plot(*zip(*points), marker=".", label=run.name)
    _accuracy_axis(ax)
    what = "device compute" if key == "flops" else "upload"
    return _finish(fig, ax, f"cumulative {what} ({unit})", "test accuracy")


def participation_per_round(run: Run) -> Figure:
    """Stacked bars: per round, what became of each sampled device, inside an outline of how many were sampled."""
    fig, ax = _axes(run.name)
    rounds = [r["round"] for r in run.rounds]
    counts = [participation(r) for r in run.rounds]
    bottom = [0] * len(rounds)
    for status in STATUSES:
        heights = [c[status] for c in counts]
        if status == "trained" or any(heights):
            ax.bar(rounds, heights, bottom=bottom, color=_STATUS_COLOUR[status], label=status, width=0.8)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.bar(rounds, [len(r["sampled"]) for r in run.rounds], fill=False, edgecolor="black", linewidth=1.2,
           width=0.8, label="sampled")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(fig, ax, "round", "devices", rounds_on_x=True)


def group_accuracy(run: Run) -> Figure:
    fig, ax = _axes(run.name)
    for name in sorted(run.plan.groups):
        points = [(r["round"], r["group_accuracy"][name]) for r in run.rounds
                  if name in (r.get("group_accuracy") or {})]
        if points:
            label = f"{name} (excluded)" if run.plan.groups[name].excluded else name
            ax.plot(*zip(*points), marker=".", label=label,
                    linestyle=":" if run.plan.groups[name].excluded else "-")
    _accuracy_axis(ax)
    return _finish(fig, ax, "round", "accuracy on the group's data", rounds_on_x=True)


def memory_per_group(run: Run) -> Figure:
    """Per group: memory budget, predicted peak (max over the plan's steps) and, for a served run, the peak
    RSS its devices measured; an excluded group has no predicted bar and carries its reason under its name, below
    the axis, where no bar or bar label can be."""
    plan = run.plan
    names = sorted(plan.groups)
    budget = [plan.groups[n].memory_budget_bytes for n in names]
    peak = [max((s.predicted.peak_memory_bytes for s in plan.groups[n].steps), default=0) for n in names]
    measured = measured_peaks(run)
    bars = [("budget", budget), ("predicted peak (max over steps)", peak)]
    if measured:
        bars.append(("measured peak RSS (max over reports)", [max(measured.get(n, [0])) for n in names]))
    unit, scale = _unit(max(v for _, values in bars for v in values) or 1, format_bytes)
    fig, ax = _axes(run.name)
    width = 0.8 / len(bars)
    for i, (label, values) in enumerate(bars):
        drawn = ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(names))],
                       [v / scale for v in values], width=width, label=label)
        ax.bar_label(drawn, [format_bytes(v) if v else "" for v in values], fontsize=8)   # small bars stay legible
    chars = max(16, int(110 / max(len(names), 1)))   # wrap each reason to its group's share of the width
    ax.set_xticks(list(range(len(names))), [f"{n}\n" + textwrap.fill(f"excluded: {plan.groups[n].reason}", chars)
                                            if plan.groups[n].excluded else n for n in names])
    for tick, n in zip(ax.get_xticklabels(), names, strict=True):
        if plan.groups[n].excluded:
            tick.set(fontsize=8, color="tab:red")
    return _finish(fig, ax, "device group", unit)
