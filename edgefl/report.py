"""`edgefl report`: a static HTML page with PNG plots comparing runs (emulated or served).

Plots: accuracy vs round, vs cumulative upload and vs cumulative device FLOPs (SLT Fig. 4 style),
devices taking part per group and round (who the method leaves out), and each group's predicted peak
memory against its budget (from the run's plan) and, for a served run, the peak RSS its devices measured,
with the median prediction error in the summary table.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from edgefl.errors import ConfigError, require
from edgefl.plan import Plan


def _load(run: Path) -> dict:
    try:
        history = json.loads((run / "history.json").read_text())
    except OSError:
        raise ConfigError(f"{run}: no history.json; give a folder written by 'edgefl emulate -o' or 'edgefl serve'") from None
    except ValueError as exc:
        raise ConfigError(f"{run}/history.json: not JSON ({exc})") from None
    plan = Plan.read(run / "plan.json")
    return {"name": run.name, "rounds": history["rounds"], "plan": plan}


def _cumulative(values):
    total, out = 0.0, []
    for v in values:
        total += v or 0
        out.append(total)
    return out


def _finish(plt, fig, ax, path, xlabel, ylabel, title=None):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def _accuracy_plot(plt, runs, x_of, xlabel, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        pts = [(x, r["accuracy"]) for x, r in zip(x_of(run), run["rounds"], strict=True) if r["accuracy"] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=run["name"])
    _finish(plt, fig, ax, path, xlabel, "test accuracy")


def _participation_plot(plt, run, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = sorted(run["plan"].groups)
    rounds = [r["round"] for r in run["rounds"]]
    for g in groups:
        ax.plot(rounds, [r["participating_devices"].get(g, 0) for r in run["rounds"]], marker=".", label=g)
    _finish(plt, fig, ax, path, "round", "devices that trained", run["name"])


def _memory_plot(plt, run, path):
    plan = run["plan"]
    names = sorted(plan.groups)
    budget = [plan.groups[n].memory_budget_bytes / 2**20 for n in names]
    peak = [max((s.predicted.peak_memory_bytes for s in plan.groups[n].steps), default=0) / 2**20 for n in names]
    measured = _measured_peaks(run)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(names))
    width = 0.27 if measured else 0.4
    ax.bar([x - width / 2 * (2 if measured else 1) for x in xs], budget, width=width, label="budget")
    ax.bar([x if measured else x + 0.2 for x in xs], peak, width=width, label="predicted peak (max over steps)")
    if measured:
        ax.bar([x + width for x in xs], [max(measured.get(n, [0])) / 2**20 for n in names], width=width,
               label="measured peak RSS (max over reports)")
    ax.set_xticks(list(xs), names, rotation=20)
    _finish(plt, fig, ax, path, "device group", "MiB", run["name"])


def _measured_peaks(run) -> dict[str, list[int]]:
    """Per group, the peak RSS devices reported (served runs; emulated runs have none)."""
    out: dict[str, list[int]] = {}
    for r in run["rounds"]:
        for device, peak in (r.get("measured_peak_bytes") or {}).items():
            out.setdefault(r["sampled"][device], []).append(peak)
    return out


def prediction_error(run) -> float | None:
    """Median |predicted - measured| / measured peak over a served run's reports."""
    errs = sorted(abs(r["predicted_peak_bytes"][d] - m) / m for r in run["rounds"]
                  for d, m in (r.get("measured_peak_bytes") or {}).items() if m)
    return errs[len(errs) // 2] if errs else None


def _percent(x) -> str:
    return "not measured (emulated)" if x is None else f"{x:.1%}"


def write_report(runs: list[Path], out: Path) -> Path:
    require("matplotlib", "report")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [_load(Path(r)) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    figures = [
        ("accuracy_vs_round.png", "Accuracy per round",
         lambda p: _accuracy_plot(plt, loaded, lambda r: [x["round"] for x in r["rounds"]], "round", p)),
        ("accuracy_vs_upload.png", "Accuracy vs cumulative upload",
         lambda p: _accuracy_plot(plt, loaded, lambda r: [b / 1e6 for b in _cumulative(x["upload_bytes"] for x in r["rounds"])],
                                  "cumulative upload (MB)", p)),
        ("accuracy_vs_flops.png", "Accuracy vs cumulative device FLOPs",
         lambda p: _accuracy_plot(plt, loaded, lambda r: [f / 1e12 for f in _cumulative(x["flops"] for x in r["rounds"])],
                                  "cumulative device TFLOP", p)),
    ]
    for i, run in enumerate(loaded):
        figures.append((f"participation_{i}.png", f"Participation per group: {run['name']}",
                        lambda p, run=run: _participation_plot(plt, run, p)))
        figures.append((f"memory_{i}.png", f"Peak memory vs budget: {run['name']}",
                        lambda p, run=run: _memory_plot(plt, run, p)))
    sections = []
    for name, title, draw in figures:
        draw(out / name)
        sections.append(f'<h2>{html.escape(title)}</h2>\n<img src="{name}" alt="{html.escape(title)}">')
    rows = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r['plan'].method)}</td>"
        f"<td>{html.escape(r['plan'].model.label())}</td><td>{len(r['rounds'])}</td>"
        f"<td>{next((x['accuracy'] for x in reversed(r['rounds']) if x['accuracy'] is not None), float('nan')):.4f}</td>"
        f"<td>{_percent(prediction_error(r))}</td></tr>"
        for r in loaded)
    page = out / "index.html"
    page.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>edgefl report</title></head><body>\n"
        "<h1>edgefl report</h1>\n<table border='1' cellpadding='4'><tr><th>run</th><th>method</th><th>model</th>"
        f"<th>rounds</th><th>final accuracy</th><th>peak memory prediction error (median)</th></tr>{rows}</table>\n" + "\n".join(sections) + "\n</body></html>\n")
    return page
