"""`edgefl plan`, `edgefl profile` and `edgefl calibrate`: the planner (edgefl.planning), one configuration's
cost (edgefl.cost.breakdown), and the cost model fitted to what served devices measured."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import stdout
from edgefl.errors import ConfigError, InfeasiblePlanError


def plan(devices: o.Devices, model: o.Model, method: o.Method,
         rounds: o.Rounds = 100, batch_size: o.BatchSize = 32,
         optimizer: o.Optimizer = o.OptimizerName.sgd, local_epochs: o.LocalEpochs = 1,
         layers: o.Layers = None,
         classes: o.Classes = None, vocab: Annotated[Optional[int], typer.Option("--vocab", min=2, help="the transformer's "
                                                                       "vocabulary (default 80)")] = None,
         context: Annotated[Optional[int], typer.Option("--context", min=2, help="the transformer's window length "
                                                        "(default 256)")] = None, input_shape: o.InputShape = None,
         blocks: Annotated[Optional[int], typer.Option("--blocks", min=1, help="profl: number of blocks "
                                                       "(default: stages)")] = None,
         calibration: o.Calibration = None, fmt: o.OutputFormat = o.Format.table,
         output: Annotated[Optional[Path], typer.Option("-o", "--output", help="write plan.json here")] = None):
    """Plan per device group and round: frozen prefix, trained layers, head width, predicted cost."""
    from edgefl.cli.console import plan_tables
    from edgefl.fleet import load_fleet
    from edgefl.planning.planner import plan_fleet, strategy_for
    from edgefl.zoo.from_options import model_ref

    fleet = load_fleet(devices)
    depths = o.parse_int_list(layers, "--layers")
    ref = model_ref(model, depths, classes, vocab, context, o.parse_shape(input_shape))
    result = plan_fleet(strategy_for(method, depths, blocks), fleet, ref, rounds=rounds, batch_size=batch_size,
                        optimizer=optimizer.value, local_epochs=local_epochs, calibration=calibration,
                        where=str(devices))
    if output is not None:
        result.write(output)
    if fmt is o.Format.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        plan_tables(result, stdout)
        if output is not None:
            stdout.print(f"plan written to {output}")
    if all(g.excluded for g in result.groups.values()):
        need = ", ".join(f"{n} needs {g.min_memory_bytes} bytes" for n, g in result.groups.items())
        raise InfeasiblePlanError(f"no device group can take part with {method} on {ref.label()}: {need}")


def profile(model: o.Model, frozen_prefix: Annotated[int, typer.Option("--frozen-prefix", min=0, help="leading "
                                                                       "layers that run forward only")] = 0,
            head_width: Annotated[float, typer.Option("--head-width", min=0.0, max=1.0, help="width scale of the "
                                                      "layers from --head-start (SLT's s)")] = 1.0,
            head_start: Annotated[Optional[int], typer.Option("--head-start", min=0, help="first scaled layer "
                                                              "(default: right after the first trained layer)")] = None,
            batch_size: o.BatchSize = 32, optimizer: o.Optimizer = o.OptimizerName.sgd,
            runtime: Annotated[str, typer.Option("--runtime", help="the device runtime priced: ort | executorch | "
                                                 "torch")] = "torch",
            layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="the transformer's depth")] = None,
            classes: o.Classes = None,
            input_shape: o.InputShape = None,
            measure: Annotated[bool, typer.Option("--measure", help="also measure on this machine (torch "
                                                  "runtime)")] = False,
            calibration: o.Calibration = None, fmt: o.OutputFormat = o.Format.table):
    """Predicted (and with --measure, measured) training cost of one configuration."""
    from edgefl.cli.console import cost_table
    from edgefl.cost.breakdown import breakdown
    from edgefl.zoo.from_options import model_ref

    ref = model_ref(model, [layers] if layers else None, classes, input_shape=o.parse_shape(input_shape))
    result = breakdown(ref, frozen_prefix=frozen_prefix, head_width=head_width, head_start=head_start,
                       batch_size=batch_size, optimizer=optimizer.value, runtime=runtime, calibration=calibration,
                       measure=measure)
    if fmt is o.Format.json:
        print(json.dumps(result.to_json(), indent=2, default=list))
    else:
        cost_table(result.predicted, result.measured, stdout, f"{ref.label()}, frozen {frozen_prefix}, head width "
                                                              f"{head_width:g}, batch {batch_size}, {runtime}")


def calibrate(runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="one or more run folders written by "
                                                         "'edgefl serve --state'")],
              output: Annotated[Path, typer.Option("-o", "--output", help="calibration file for 'edgefl plan "
                                                   "--calibration'")] = Path("calibration.json")):
    """Fit each runtime's fixed memory term as an upper bound on the peak RSS devices measured (reports that do
    not match their plan are refused, with the reason); the planner reads the file."""
    from edgefl.cost.calibrate import calibration_json, fit_overheads
    from edgefl.planning.calibration import samples_from_run
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
