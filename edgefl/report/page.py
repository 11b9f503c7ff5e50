"""`edgefl report`: a static HTML page with PNG plots comparing runs (emulated or served).

The page opens with a summary table, a table of contents and the plots that compare runs: accuracy and loss per
round, accuracy against cumulative upload and against cumulative device FLOPs (SLT Fig. 4 style). A section per
run follows: its settings (read from the run folder), its groups (excluded ones with the planner's reason, and the
rounds a group sits out), what became of the devices sampled each round, accuracy on each group's data, each
group's predicted peak memory against its budget and, for a served run, the peak RSS its devices measured, and a
per-device table of predicted vs measured memory, energy and bytes moved. Reading the runs is `report_runs`, the
figures `report_plots`, the markup `report_html`; this module puts them in order and writes the folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from edgefl.errors import require
from edgefl.outdir import check_output, make_output
from edgefl.report import html as h
from edgefl.report.runs import Run, device_rows, group_rows, load_run, participation, prediction_error, settings
from edgefl.units import format_bytes

__all__ = ["write_report", "prediction_error"]


def _is_report(folder: Path) -> bool:
    """What --force may replace: a folder of only an earlier report's page and images."""
    return all(p.is_file() and p.suffix in (".html", ".png") for p in folder.iterdir())


def _number(x, fmt: str, absent: str) -> str:
    return absent if x is None else format(x, fmt)


def _summary(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        trained = [participation(r)["trained"] for r in run.rounds]
        rows.append([run.name, run.kind, run.plan.method, run.plan.model.describe(), len(run.rounds),
                     _number(run.final("accuracy"), ".4f", "not evaluated"),
                     _number(run.final("loss"), ".4f", "not evaluated"),
                     f"{sum(trained) / len(trained):.1f}" if trained else "-",
                     format_bytes(sum(r.get("upload_bytes") or 0 for r in run.rounds)),
                     format_bytes(sum(r.get("download_bytes") or 0 for r in run.rounds)),
                     _number(prediction_error(run), ".1%", "not measured (emulated)" if not run.served
                             else "no peaks reported")])
    return h.table(["run", "kind", "method", "model", "rounds", "final accuracy", "final test loss",
                    "devices trained per round (mean)", "upload (total)", "download (total)",
                    "peak memory prediction error (median)"], rows)


def _names(folders: list[Path]) -> list[str]:
    """Folder names, or whole paths where two runs share a name."""
    names = [f.name for f in folders]
    return [f.name if names.count(f.name) == 1 else str(f) for f in folders]


def write_report(runs: list[Path], out: Path, force: bool = False) -> Path:
    require("matplotlib", "report")
    from edgefl.report import plots as plots

    folders = [Path(r) for r in runs]
    loaded = [load_run(f) for f in folders]
    for run, name in zip(loaded, _names(folders), strict=True):
        run.name = name
    check_output(out, force, "report", _is_report)
    make_output(out, force)

    def draw(name: str, title: str, caption: str, make: Callable) -> str:
        make().savefig(out / name, format="png", dpi=plots.DPI)
        return h.figure(name, title, caption)

    blocks = [h.heading("Comparison", anchor="comparison"),
              draw("accuracy_vs_round.png", "Accuracy per round",
                   "Test accuracy of the global model after each evaluated round, one line per run.",
                   lambda: plots.accuracy_vs_round(loaded)),
              draw("loss_vs_round.png", "Loss per round",
                   "Test loss of the global model (solid) and the mean training loss devices reported after "
                   "their local training (dashed), per round.", lambda: plots.loss_vs_round(loaded)),
              draw("accuracy_vs_upload.png", "Accuracy vs cumulative upload",
                   "Test accuracy against the bytes devices have uploaded so far: the communication a method "
                   "spends for an accuracy.", lambda: plots.accuracy_vs_cumulative(loaded, "upload_bytes")),
              draw("accuracy_vs_flops.png", "Accuracy vs cumulative device FLOPs",
                   "Test accuracy against the training FLOPs devices have been given so far (the plan's FLOPs "
                   "per sample x examples x local epochs).", lambda: plots.accuracy_vs_cumulative(loaded, "flops"))]
    for i, run in enumerate(loaded):
        blocks += _run_section(i, run, draw, plots)
    page = out / "index.html"
    page.write_text(h.page("edgefl report", [h.heading("edgefl report", 1), _summary(loaded), h.contents(blocks),
                                             *blocks]))
    return page


def _run_section(i: int, run: Run, draw: Callable, plots) -> list[str]:
    blocks = [h.heading(f"Run {run.name} ({run.kind})", anchor=f"run-{i}"),
              h.heading("Settings", 3, anchor=f"run-{i}-settings"),
              h.table(["setting", "value"], settings(run)), h.heading("Device groups", 3, anchor=f"run-{i}-groups"),
              h.records_table(group_rows(run)),
              draw(f"participation_{i}.png", f"Participation per round: {run.name}",
                   "What became of the devices sampled in each round: trained (report accepted), skipped (not "
                   "sent: offline, or no configuration fits its group), failed (e.g. out of memory), rejected "
                   "(report refused), missing (no report by the deadline); the black outline is how many were "
                   "sampled.", lambda: plots.participation_per_round(run))]
    if any(r.get("group_accuracy") for r in run.rounds):
        blocks.append(draw(f"group_accuracy_{i}.png", f"Accuracy per group: {run.name}",
                           "Accuracy of the global model on a sample of each group's local training data, per "
                           "evaluated round: how well the shared model serves each group's data; dotted: groups "
                           "the plan excludes from training.", lambda: plots.group_accuracy(run)))
    else:
        why = ("not measured: a served run's server holds none of its devices' data, so it evaluates the global "
               "model on the --dataset test split only" if run.served else "none recorded in this run's history")
        blocks.append(h.note(f"Accuracy per group: {why}."))
    measured = " and the largest peak RSS its devices measured" if run.served else ""
    blocks.append(draw(f"memory_{i}.png", f"Peak memory vs budget: {run.name}",
                       f"Per device group: its memory budget, the predicted training peak (largest over the "
                       f"plan's steps){measured}. An excluded group has no predicted bar and shows the "
                       "planner's reason.", lambda: plots.memory_per_group(run)))
    if run.served:
        blocks += [h.heading("Devices", 3, anchor=f"run-{i}-devices"),
                   h.note("Per device, over the rounds it was sampled in: peak memory predicted by the plan vs "
                          "the peak RSS it measured, energy with the meter it came from, payload bytes moved. "
                          "Energy is measured over the training process's run, from its start to its exit in each "
                          "round: what the device draws while the agent waits, downloads and uploads is not counted."),
                   h.records_table(device_rows(run))]
    return blocks
