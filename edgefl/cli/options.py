"""The options several commands share, declared once, and turning command-line strings into typed values with
one-line errors naming the option; `plain_metavars` names each option's value the way a person reads it."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.errors import ConfigError


class Format(str, Enum):
    table = "table"
    json = "json"


class OptimizerName(str, Enum):
    sgd = "sgd"
    adamw = "adamw"


MODELS = "resnet20, resnet32, resnet44, resnet56, densenet40, vgg11bn, cnn, transformer, vit"
METHODS = "slt, caff, fedolf, fedepth, profl, fedavg, exclusive, small, fd, fedrolex, heterofl, fjord, depthfl, lora, fedhm"
DATASETS = "fashion-mnist, mnist, cifar10, cifar100, shakespeare"
PARTITIONS = "iid | dirichlet:ALPHA | shards:LABELS | natural"

Devices = Annotated[Path, typer.Option("--devices", metavar="FLEET.yaml", help="the fleet file: device groups and "
                                        "their budgets (e.g. examples/fleet.yaml)")]
Model = Annotated[str, typer.Option("--model", metavar="MODEL", help=f"zoo model: {MODELS}")]
Method = Annotated[str, typer.Option("--method", metavar="METHOD", help=METHODS)]
Dataset = Annotated[str, typer.Option("--dataset", metavar="DATASET", help=DATASETS)]
Partition = Annotated[str, typer.Option("--partition", help=f"how the training set is split over the devices: "
                                        f"{PARTITIONS}")]
Seed = Annotated[int, typer.Option("--seed", help="seed of everything random: sampling, data split, initial weights")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="examples per training step on a device")]
LocalEpochs = Annotated[int, typer.Option("--local-epochs", min=1, help="passes over its data a device makes per "
                                          "round")]
Lr = Annotated[float, typer.Option("--lr", min=0.0, help="devices' learning rate in round 1 (cosine decay to a "
                                   "tenth by the last round)")]
EvalEvery = Annotated[int, typer.Option("--eval-every", min=1, help="evaluate the global model every N rounds (and "
                                        "after the last)")]
Optimizer = Annotated[OptimizerName, typer.Option("--optimizer", help="devices' optimizer (torch.optim's rule)")]
OutputFormat = Annotated[Format, typer.Option("--format", help="a table to read, or JSON for scripts")]
Classes = Annotated[Optional[int], typer.Option("--classes", min=2, help="output classes (default: the data "
                                                "set's, else the model's)")]
InputShape = Annotated[Optional[str], typer.Option("--input-shape", help="C,H,W of one sample, e.g. 1,28,28")]
DataRoot = Annotated[Optional[Path], typer.Option("--data-root", metavar="DIR", help="where local copies of data "
                                                  "sets live (default: $EDGEFL_DATA, else ~/.local/share/edgefl)")]
TrainLimit = Annotated[Optional[int], typer.Option("--train-limit", min=1,
                                                    help="use a seeded subset of the training set")]
TestLimit = Annotated[Optional[int], typer.Option("--test-limit", min=1, help="evaluate on a seeded subset of the "
                                                  "test set")]
Calibration = Annotated[Optional[Path], typer.Option("--calibration",
                                                     help="runtime constants from 'edgefl calibrate'")]
TorchDevice = Annotated[str, typer.Option("--device", help="where torch trains and evaluates: cpu | cuda")]
PlanFile = Annotated[Path, typer.Option("--plan", metavar="PLAN.json", help="plan.json written by 'edgefl plan -o'")]
Broker = Annotated[str, typer.Option("--broker", metavar="URL", help="mqtt://HOST:PORT or mqtts://HOST:PORT")]
Rounds = Annotated[int, typer.Option("--rounds", min=1, help="rounds the run trains (the plan spreads its steps "
                                     "over them)")]
ClientsPerRound = Annotated[int, typer.Option("--clients-per-round", min=1, help="devices sampled each round")]
Layers = Annotated[Optional[str], typer.Option("--layers", help="the transformer's depth; for caff its candidate "
                                               "depths, e.g. 3,6,9,12")]
Force = Annotated[bool, typer.Option("--force", help="replace an earlier output at -o: none of its files remain")]


def parse_int_list(text: Optional[str], option: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option}: expected integers separated by commas, e.g. 3,6,9,12 (got {text!r})") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{option}: expected positive integers, e.g. 3,6,9,12 (got {text!r})")
    return values


def parse_shape(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    shape = parse_int_list(text.replace("x", ","), "--input-shape")
    if len(shape) != 3:
        raise ConfigError(f"--input-shape: expected channels,height,width, e.g. 1,28,28 (got {text!r})")
    return tuple(shape)


def _plain(param) -> Optional[str]:
    """What to call `param`'s value in help: its choices, or N, X, PATH, TEXT; None for a flag."""
    from typing import get_args, get_origin

    desc = getattr(param, "type_descriptor", None)
    if getattr(param, "is_flag", False) or desc is None:
        return None
    if desc.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices)
    kind = get_args(desc.annotation)[0] if get_origin(desc.annotation) is list else desc.annotation
    return {int: "N", float: "X", Path: "PATH"}.get(kind, "TEXT")


def plain_metavars(command):
    """Every option and argument of `command` and its subcommands that names no metavar of its own gets a plain
    one (its choices, N, X, PATH or TEXT): Typer otherwise shows Python's type names (<int range>, <list[Path]>)."""
    for param in command.params:
        if param.param_type_name == "argument":
            param.metavar = param.metavar or param.name.upper()
            # Typer prints an argument's type beside its metavar ('RUN <list[Path]>'): its help says what it is
            param.display_type_rich = lambda ctx: None
        elif param.metavar is None and (metavar := _plain(param)) is not None:
            param.metavar = metavar
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub)
    return command
