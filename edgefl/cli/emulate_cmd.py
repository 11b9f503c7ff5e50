"""`edgefl emulate`: plan a fleet, then train it end to end on this machine (CPU or CUDA) or a Ray cluster
(edgefl.engines.emulation does the work; this module parses and prints)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import round_display, stdout

Toa = Annotated[Optional[float], typer.Option("--toa", min=0.0, max=1.0, help="FedOLF TOA: send frozen layers (but "
                                              "the last) as this share of their filters, sampled by norm")]
MeasureMemory = Annotated[bool, typer.Option("--measure-memory", help="devices measure the activations autograd "
                                             "keeps and fail a round whose peak would exceed their memory")]
Pretrained = Annotated[Optional[Path], typer.Option("--pretrained", help="folder written by 'edgefl pretrain': the "
                                                    "transformer starts from those weights (caff picks among its depths)")]
Engine = Annotated[str, typer.Option("--engine", help="where the devices train: local (this process) | ray (actors "
                                     "of a Ray cluster; pip install 'edgefl[ray]')")]
Address = Annotated[Optional[str], typer.Option("--address", help="--engine ray: the cluster's head, HOST:PORT "
                                                "(default: start Ray on this machine)")]
Resume = Annotated[bool, typer.Option("--resume", help="continue the stopped run in -o from its last checkpoint "
                                      "(give the options it was started with); it ends as the uninterrupted run")]
RunFolder = Annotated[Path, typer.Option("-o", "--output", help="run folder, e.g. runs/NAME (refused if it holds files)")]


def emulate(devices: o.Devices, model: o.Model, dataset: o.Dataset, method: o.Method,
            rounds: o.Rounds, output: RunFolder, force: o.Force = False, clients_per_round: o.ClientsPerRound = 10,
            partition: o.Partition = "iid", device: o.TorchDevice = "cpu", seed: o.Seed = 0,
            batch_size: o.BatchSize = 32, local_epochs: o.LocalEpochs = 1, lr: o.Lr = 0.05,
            eval_every: o.EvalEvery = 1, train_limit: o.TrainLimit = None, test_limit: o.TestLimit = None,
            data_root: o.DataRoot = None, layers: o.Layers = None,
            classes: o.Classes = None, input_shape: o.InputShape = None, toa: Toa = None,
            measure_memory: MeasureMemory = False, pretrained: Pretrained = None, engine: Engine = "local",
            address: Address = None, resume: Resume = False):
    """Train the whole fleet in one process (or a Ray cluster's actors), each virtual device held to its budget."""
    from edgefl.engines.emulation import EmulatedRun, Emulation, final_accuracy

    run = EmulatedRun.start(Emulation(
        devices=devices, model=model, dataset=dataset, method=method, rounds=rounds, output=output, force=force,
        clients_per_round=clients_per_round, partition=partition, device=device, seed=seed, batch_size=batch_size,
        local_epochs=local_epochs, lr=lr, eval_every=eval_every, train_limit=train_limit, test_limit=test_limit,
        data_root=data_root, layers=o.parse_int_list(layers, "--layers"), classes=classes,
        input_shape=o.parse_shape(input_shape), toa=toa, measure_memory=measure_memory, pretrained=pretrained,
        engine=engine, address=address, resume=resume))
    for g in run.plan.groups.values() if not resume else ():
        if g.excluded:
            stdout.print(f"[yellow]group {g.name} excluded[/]: {g.reason}")
        for out in g.sits_out:
            stdout.print(f"[yellow]group {g.name} sits out[/] {out.describe()}")
    with round_display(stdout, rounds) as show:
        records = run.train(show, lambda line: stdout.print(line, markup=False, highlight=False))
    last = final_accuracy(records)
    stdout.print(f"{method} on {run.plan.model.describe()}: {rounds} round{'s' * (rounds != 1)}"
                 + (f", final accuracy {last:.4f}" if last is not None else "") + f"; run written to {output}")
