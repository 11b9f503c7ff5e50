"""`edgefl export`: a plan's distinct TrainConfigs as artifact sets (one folder per config and backend).

Writes DIR/<config hash>-<backend>/ (suffix artifact + prefix/), DIR/index.json (which group trains
which set in which rounds) and prints the artifact table. Weights: a state dict saved by `edgefl
emulate` (weights.pt) or an .npz of global tensors; without --weights, the plan's model freshly
initialised (seeded).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import ConfigError

# the objectives these methods add to cross-entropy run in the torch emulation; artifacts train plain CE
OBJECTIVE_METHODS = {"depthfl": "self-distillation between exits", "fjord": "ordered dropout"}


def load_weights(path: Optional[Path], ref, seed: int) -> dict:
    """Global tensors by name: from `path` (.pt state dict or .npz), or a seeded fresh model."""
    import numpy as np
    import torch

    from edgefl.zoo import build

    torch.manual_seed(seed)
    expected = build(ref).state_dict()
    if path is None:
        return expected
    try:
        if path.suffix == ".npz":
            with np.load(path) as data:
                state = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"--weights {path}: cannot read it ({str(exc).splitlines()[0]}); give a weights.pt "
                          "written by 'edgefl emulate' or an .npz of global tensors") from None
    if not isinstance(state, dict):
        raise ConfigError(f"--weights {path}: not a state dict")
    for key, t in expected.items():
        if key not in state:
            raise ConfigError(f"--weights {path}: no tensor {key!r}; these weights are not for {ref.label()}")
        if tuple(state[key].shape) != tuple(t.shape):
            raise ConfigError(f"--weights {path}: {key} has shape {tuple(state[key].shape)}, {ref.label()} needs "
                              f"{tuple(t.shape)}")
    return state


def export(
    plan_path: Path = typer.Option(..., "--plan", help="plan.json written by 'edgefl plan -o'"),
    backend: str = typer.Option(..., "--backend", help="ort | executorch | torch"),
    output: Path = typer.Option(..., "-o", "--output", help="folder for the artifact sets"),
    weights: Optional[Path] = typer.Option(None, "--weights", help="global weights (.pt or .npz); default: fresh"),
    weights_version: int = typer.Option(0, "--weights-version", min=0),
    seed: int = typer.Option(0, "--seed", help="initialisation seed when --weights is omitted"),
    fmt: str = typer.Option("table", "--format", help="table | json"),
):
    """Export each distinct config of a plan as a self-contained artifact set and print the artifact table."""
    from rich.progress import BarColumn, Progress, TextColumn

    from edgefl.cli.console import stdout
    from edgefl.export.backends import get_backend
    from edgefl.export.plan_export import export_plan
    from edgefl.planning.plan import Plan

    if fmt not in ("table", "json"):
        raise ConfigError(f"--format: expected table or json, got {fmt!r}")
    plan = Plan.read(plan_path)
    runtime = get_backend(backend)
    state = load_weights(weights, plan.model, seed)
    with Progress(TextColumn("exporting {task.fields[label]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=stdout, transient=True, disable=fmt == "json") as bar:
        task = bar.add_task("export", total=None, label="")

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)

        index = export_plan(plan, state, runtime, output, weights_version=weights_version, on_progress=progress)
    if fmt == "json":
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
