"""`edgefl export`: a plan's distinct TrainConfigs as artifact sets (one folder per config and backend).

Writes DIR/<config hash>-<backend>/ (suffix artifact + prefix/), DIR/index.json (which group trains
which set in which rounds) and prints the artifact table. Weights: a state dict saved by `edgefl
emulate` (weights.pt) or an .npz of global tensors; without --weights, the plan's model freshly
initialised (seeded).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import stdout

# the objectives these methods add to cross-entropy run in the torch emulation; artifacts train plain CE
OBJECTIVE_METHODS = {"depthfl": "self-distillation between exits", "fjord": "ordered dropout"}


def export(plan_path: o.PlanFile,
           backend: Annotated[str, typer.Option("--backend", help="ort | executorch | torch")],
           output: Annotated[Path, typer.Option("-o", "--output", help="folder for the artifact sets")],
           weights: Annotated[Optional[Path], typer.Option("--weights", help="global weights (.pt or .npz); "
                                                           "default: fresh")] = None,
           weights_version: Annotated[int, typer.Option("--weights-version", min=0, help="the round "
                                                                   "the weights are from, written in the manifest")] = 0,
           seed: Annotated[int, typer.Option("--seed", help="initialisation seed when --weights is omitted")] = 0,
           fmt: o.OutputFormat = o.Format.table):
    """Export each distinct config of a plan as a self-contained artifact set and print the artifact table."""
    from rich.progress import BarColumn, Progress, TextColumn

    from edgefl.export.backends import get_backend
    from edgefl.export.plan_export import export_plan
    from edgefl.planning.plan import Plan
    from edgefl.zoo.weights import load_weights

    plan = Plan.read(plan_path)
    runtime = get_backend(backend)
    state = load_weights(weights, plan.model, seed)
    with Progress(TextColumn("exporting {task.fields[label]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=stdout, transient=True, disable=fmt is o.Format.json) as bar:
        task = bar.add_task("export", total=None, label="")
        index = export_plan(plan, state, runtime, output, weights_version=weights_version,
                            on_progress=lambda done, total, label: bar.update(task, completed=done, total=total,
                                                                               label=label))
    if fmt is o.Format.json:
        print(json.dumps(index, indent=2))
        return
    artifact_table(index, stdout)
    for skipped in index["skipped"]:
        stdout.print(f"[yellow]skipped[/] config {skipped['config_hash']} ({', '.join(skipped['groups'])}): "
                     f"{skipped['reason']}")
    if plan.method in OBJECTIVE_METHODS:
        stdout.print(f"[yellow]note[/]: {plan.method}'s {OBJECTIVE_METHODS[plan.method]} runs in the torch emulation; "
                     "these artifacts train each config with plain cross-entropy")
    stdout.print(f"{len(index['sets'])} artifact sets written to {output} (index.json)")


def artifact_table(index: dict, console) -> None:
    from rich.table import Table

    from edgefl.units import format_bytes

    table = Table(title=f"{index['backend']} artifacts for {index['method']} on {index['model']['name']}",
                  title_justify="left")
    for col in ("config", "groups", "frozen", "trained", "head width", "files", "bytes", "upload",
                "predicted peak"):
        table.add_column(col, justify="left" if col in ("config", "groups", "trained") else "right")
    for s in index["sets"]:
        c = s["config"]
        trained = c["trained_layers"]
        layers = (f"{trained[0]}-{trained[-1]}" if trained else "-") + (f" + {c['aux_head']} head" if c["aux_head"] else "")
        if c.get("rank"):
            layers += f", {c.get('rank_mode', 'lora')} rank {c['rank']}"
        table.add_row(s["folder"], ", ".join(s["groups"]), str(c["frozen_prefix"]), layers,
                      f"{c['head_width']:g}", str(s["files"]), format_bytes(s["artifact_bytes"]),
                      format_bytes(s["upload_bytes"]), format_bytes(s["predicted_peak_bytes"]))
    console.print(table)
