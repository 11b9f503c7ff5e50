"""`edgefl` entry point: subcommands, and the one place user errors become one line + exit 2."""
from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from edgefl.cli.console import stdout
from edgefl.errors import ConfigError, EdgeflError, InfeasiblePlanError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Federated learning that fits every device's memory budget.")


class Format(str, Enum):
    table = "table"
    json = "json"


class OptimizerName(str, Enum):
    sgd = "sgd"
    adamw = "adamw"


@app.command()
def plan(
    devices: Path = typer.Option(..., "--devices", help="fleet.yaml describing the device groups"),
    model: str = typer.Option(..., "--model", help="zoo model: resnet20, resnet32, resnet44, resnet56, densenet40, "
                                                   "vgg11bn, cnn, transformer, vit"),
    method: str = typer.Option(..., "--method", help="slt, caff, fedolf, fedepth, profl, fedavg, exclusive, small, fd, "
                                                     "fedrolex, heterofl, fjord, depthfl, lora, fedhm"),
    rounds: int = typer.Option(100, "--rounds", min=1),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    optimizer: OptimizerName = typer.Option(OptimizerName.sgd, "--optimizer"),
    local_epochs: int = typer.Option(1, "--local-epochs", min=1),
    layers: Optional[str] = typer.Option(None, "--layers", help="transformer depth; for caff the candidate depths, "
                                                                "e.g. 3,6,9,12"),
    classes: Optional[int] = typer.Option(None, "--classes", min=2),
    vocab: Optional[int] = typer.Option(None, "--vocab", min=2),
    context: Optional[int] = typer.Option(None, "--context", min=2),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help="C,H,W of one sample, e.g. 1,28,28"),
    blocks: Optional[int] = typer.Option(None, "--blocks", min=1, help="profl: number of blocks (default: stages)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="runtime constants from 'edgefl calibrate'"),
    fmt: Format = typer.Option(Format.table, "--format"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write plan.json here"),
):
    """Plan per device group and round: frozen prefix, trained layers, head width, predicted cost."""
    from edgefl.cli.console import plan_tables
    from edgefl.cli.options import model_ref, parse_int_list
    from edgefl.cost.constants import load_calibration
    from edgefl.fleet import load_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy

    fleet = load_fleet(devices)
    depths = parse_int_list(layers, "--layers")
    ref = model_ref(model, depths, classes, vocab, context, input_shape)
    strategy = get_strategy(method)
    if method == "caff" and depths:
        strategy.depths = depths
    if method == "profl":
        strategy.blocks = blocks
    elif blocks is not None:
        raise ConfigError("--blocks: only --method profl takes it")
    if depths and len(depths) > 1 and method != "caff":
        raise ConfigError(f"--layers: a list of depths is for --method caff; give one depth for {method}")
    for g in fleet.groups:
        if g.flops_budget is not None and g.examples is None:
            raise ConfigError(f"{devices}: fleet.groups.{g.name}.flops_budget needs examples (local dataset size) "
                              "to turn FLOPs per sample into FLOPs per round; add e.g. 'examples: 500'")
    ctx = PlanContext(fleet, ref, rounds=rounds, batch_size=batch_size, optimizer=optimizer.value,
                      local_epochs=local_epochs, constants=load_calibration(calibration))
    result = verify(strategy.plan(ctx), fleet)
    if calibration is not None:      # what the calibration changed, and why, in the plan's own notes
        from dataclasses import replace

        from edgefl.cost.calibrate import calibration_notes, plan_changes
        without = strategy.plan(replace(ctx, constants=load_calibration(None), _costs={}))
        result.notes.extend(calibration_notes(calibration, ctx.constants, ref.name) + plan_changes(without, result))
    if output is not None:
        result.write(output)
    if fmt is Format.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        plan_tables(result, stdout)
        if output is not None:
            stdout.print(f"plan written to {output}")
    if all(g.excluded for g in result.groups.values()):
        need = ", ".join(f"{n} needs {g.min_memory_bytes} bytes" for n, g in result.groups.items())
        raise InfeasiblePlanError(f"no device group can take part with {method} on {ref.label()}: {need}")


@app.command()
def profile(
    model: str = typer.Option(..., "--model"),
    frozen_prefix: int = typer.Option(0, "--frozen-prefix", min=0),
    head_width: float = typer.Option(1.0, "--head-width", min=0.0, max=1.0),
    head_start: Optional[int] = typer.Option(None, "--head-start", min=0,
                                             help="first scaled layer (default: right after the first trained layer)"),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    optimizer: OptimizerName = typer.Option(OptimizerName.sgd, "--optimizer"),
    runtime: str = typer.Option("torch", "--runtime"),
    layers: Optional[int] = typer.Option(None, "--layers", min=1),
    classes: Optional[int] = typer.Option(None, "--classes", min=2),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help="C,H,W of one sample, e.g. 1,28,28"),
    measure: bool = typer.Option(False, "--measure", help="also measure on this machine (torch runtime)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration"),
    fmt: Format = typer.Option(Format.table, "--format"),
):
    """Predicted (and with --measure, measured) training cost of one configuration."""
    from edgefl.cli.console import cost_table
    from edgefl.cli.options import model_ref
    from edgefl.cost.constants import load_calibration
    from edgefl.cost.model import cost as predict
    from edgefl.cost.profile_store import ProfileStore
    from edgefl.trainconfig import TrainConfig

    ref = model_ref(model, [layers] if layers else None, classes, input_shape=input_shape)
    constants = load_calibration(calibration)
    if runtime not in constants:
        raise ConfigError(f"--runtime: unknown runtime {runtime!r}; choose one of {', '.join(constants)}")
    store = ProfileStore()
    L = store.full(ref).num_layers
    if frozen_prefix >= L:
        raise ConfigError(f"--frozen-prefix: {ref.label()} has {L} layers; freeze at most {L - 1}")
    if head_width < 1 and head_start is None:
        head_start = min(frozen_prefix + 1, L - 1)
    try:
        config = TrainConfig(num_layers=L, frozen_prefix=frozen_prefix, head_start=head_start, head_width=head_width,
                             batch_size=batch_size, optimizer=optimizer.value)
    except ValueError as exc:
        raise ConfigError(f"profile options: {exc}") from None
    prof = store.profile(ref, None if head_width == 1 else config.widths)
    predicted = predict(prof, config, runtime, constants=constants[runtime])
    measured = None
    if measure:
        if runtime != "torch":
            raise ConfigError("--measure: only the torch runtime is measured in-process; use --runtime torch")
        from edgefl.cost.measure import measure_activation_bytes, measure_peak
        measured = dict(measure_peak(ref, config, runtime))
        measured["activation_bytes"] = measure_activation_bytes(ref, config)
    if fmt is Format.json:
        out = {"model": ref.to_json(), "config": config.to_json(), "runtime": runtime,
               "predicted": predicted.to_json(), "layers": [l.__dict__ for l in prof.layers]}
        if measured is not None:
            out["measured"] = measured
        print(json.dumps(out, indent=2, default=list))
    else:
        cost_table(predicted, measured, stdout, f"{ref.label()}, frozen {frozen_prefix}, head width {head_width:g}, "
                                                f"batch {batch_size}, {runtime}")


from edgefl.cli.emulate_cmd import emulate  # noqa: E402  (torch is imported inside the command)

app.command()(emulate)

from edgefl.cli.serve_cmd import serve  # noqa: E402  (torch, the export backends and paho are imported inside)

app.command()(serve)
from edgefl.cli.status_cmd import status, version  # noqa: E402

app.command()(status)
app.callback(invoke_without_command=True, no_args_is_help=True)(version)

from edgefl.cli.fleet_cmd import fleet_app  # noqa: E402

app.add_typer(fleet_app, name="fleet")

from edgefl.cli.pretrain_cmd import pretrain  # noqa: E402  (torch is imported inside the command)

app.command()(pretrain)

from edgefl.cli.broker_cmd import broker_app  # noqa: E402

app.add_typer(broker_app, name="broker")

from edgefl.cli.device_cmd import device_app  # noqa: E402  (the bundle's build runs inside the command)

app.add_typer(device_app, name="device")

from edgefl.cli.data_cmd import data_app  # noqa: E402
from edgefl.cli.export_cmd import export  # noqa: E402  (torch and the backends are imported inside)

app.command()(export)
app.add_typer(data_app, name="data")


@app.command()
def calibrate(
    runs: list[Path] = typer.Argument(..., help="run folders written by 'edgefl serve --state'"),
    output: Path = typer.Option(Path("calibration.json"), "-o", "--output",
                                help="calibration file for 'edgefl plan --calibration'"),
):
    """Fit each runtime's fixed memory term as an upper bound on the peak RSS devices measured (reports that do
    not match their plan are refused, with the reason); the planner reads the file."""
    import json

    from edgefl.cost.calibrate import calibration_json, fit_overheads, samples_from_run
    from edgefl.units import format_bytes

    samples, refused = [], []
    for run in runs:
        got, out = samples_from_run(run)
        samples += got
        refused += out
    for r in refused:
        stdout.print(f"refused: {r.device} round {r.round}: {r.reason}")
    if not samples:
        raise ConfigError(f"{', '.join(map(str, runs))}: every report was refused (above); calibrate from a run served "
                          "to this edgefl version's agents, with the plan's batch and examples")
    fits = fit_overheads(samples, runs=", ".join(map(str, runs)))
    output.write_text(json.dumps(calibration_json(fits, refused), indent=2) + "\n")
    for f in fits.values():
        stdout.print(f"{f.runtime}: {f.samples} measured peaks; fixed term {'+' if f.shift_bytes >= 0 else '-'}"
                     f"{format_bytes(abs(f.shift_bytes))}; measured/predicted {f.ratio_before[0]:.2f}-"
                     f"{f.ratio_before[1]:.2f} -> {f.ratio_after[0]:.2f}-{f.ratio_after[1]:.2f}")
    stdout.print(f"calibration written to {output}; plan with: edgefl plan ... --calibration {output}")


@app.command()
def report(
    runs: list[Path] = typer.Argument(..., help="run folders written by 'edgefl emulate -o' or 'edgefl serve --state'"),
    output: Path = typer.Option(Path("report"), "-o", "--output",
                                help="folder for index.html and the PNGs (refused if it holds files)"),
    force: bool = typer.Option(False, "--force", help="replace an earlier report at -o: none of its files remain"),
):
    """A static HTML page with plots and tables comparing runs."""
    from edgefl.report.page import write_report

    stdout.print(f"report written to {write_report(runs, output, force=force)}")


def run() -> None:
    """Console-script entry: user errors print one line on stderr and exit 2; bugs keep their traceback."""
    try:
        app(standalone_mode=True)
    except EdgeflError as exc:
        print(f"edgefl: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
