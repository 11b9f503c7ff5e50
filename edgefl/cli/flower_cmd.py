"""`edgefl flower`: the fleet as a Flower simulation (edgefl.flower does the work; this module parses and prints)."""
from __future__ import annotations

from typing import Annotated

import typer

from edgefl.cli import options as o
from edgefl.cli.console import round_display, stdout
from edgefl.cli.emulate_cmd import MeasureMemory, Pretrained, RunFolder, Toa

Verbose = Annotated[bool, typer.Option("--verbose", help="show Flower's and Ray's own log lines")]


def flower(devices: o.Devices, model: o.Model, dataset: o.Dataset, method: o.Method,
           rounds: o.Rounds, output: RunFolder, force: o.Force = False, clients_per_round: o.ClientsPerRound = 10,
           partition: o.Partition = "iid", device: o.TorchDevice = "cpu", seed: o.Seed = 0,
           batch_size: o.BatchSize = 32, local_epochs: o.LocalEpochs = 1, lr: o.Lr = 0.05,
           eval_every: o.EvalEvery = 1, train_limit: o.TrainLimit = None, test_limit: o.TestLimit = None,
           data_root: o.DataRoot = None, layers: o.Layers = None, classes: o.Classes = None,
           input_shape: o.InputShape = None, toa: Toa = None, measure_memory: MeasureMemory = False,
           pretrained: Pretrained = None, verbose: Verbose = False):
    """Run the fleet in Flower's simulation runtime: edgefl plans and aggregates as a Flower strategy, one
    Flower node per device trains its slice, held to its group's budget (pip install 'edgefl[flower,ray]')."""
    from edgefl.engines.emulation import Emulation, final_accuracy
    from edgefl.flower.simulation import simulate, start

    run = start(Emulation(
        devices=devices, model=model, dataset=dataset, method=method, rounds=rounds, output=output, force=force,
        clients_per_round=clients_per_round, partition=partition, device=device, seed=seed, batch_size=batch_size,
        local_epochs=local_epochs, lr=lr, eval_every=eval_every, train_limit=train_limit, test_limit=test_limit,
        data_root=data_root, layers=o.parse_int_list(layers, "--layers"), classes=classes,
        input_shape=o.parse_shape(input_shape), toa=toa, measure_memory=measure_memory, pretrained=pretrained))
    for g in run.plan.groups.values():
        if g.excluded:
            stdout.print(f"[yellow]group {g.name} excluded[/]: {g.reason}")
    nodes = sum(len(g.device_ids) for g in run.fleet.groups)
    stdout.print(f"Flower simulation: {nodes} supernodes, one per device")
    with round_display(stdout, rounds) as show:
        records = simulate(run, show, verbose)
    last = final_accuracy(records)
    stdout.print(f"{method} on {run.plan.model.describe()} in Flower: {rounds} round{'s' * (rounds != 1)}"
                 + (f", final accuracy {last:.4f}" if last is not None else "") + f"; run written to {output}")

