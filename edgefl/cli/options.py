"""The options several commands share, declared once, and turning command-line strings into typed values with
one-line errors naming the option."""
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

Devices = Annotated[Path, typer.Option("--devices", help="fleet.yaml describing the device groups")]
Model = Annotated[str, typer.Option("--model", help=f"zoo model: {MODELS}")]
Method = Annotated[str, typer.Option("--method", help=METHODS)]
Dataset = Annotated[str, typer.Option("--dataset", help=DATASETS)]
Partition = Annotated[str, typer.Option("--partition", help=PARTITIONS)]
Seed = Annotated[int, typer.Option("--seed")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1)]
LocalEpochs = Annotated[int, typer.Option("--local-epochs", min=1)]
Lr = Annotated[float, typer.Option("--lr", min=0.0)]
EvalEvery = Annotated[int, typer.Option("--eval-every", min=1)]
Optimizer = Annotated[OptimizerName, typer.Option("--optimizer")]
OutputFormat = Annotated[Format, typer.Option("--format")]
Classes = Annotated[Optional[int], typer.Option("--classes", min=2)]
InputShape = Annotated[Optional[str], typer.Option("--input-shape", help="C,H,W of one sample, e.g. 1,28,28")]
DataRoot = Annotated[Optional[Path], typer.Option("--data-root")]
TrainLimit = Annotated[Optional[int], typer.Option("--train-limit", min=1,
                                                    help="use a seeded subset of the training set")]
TestLimit = Annotated[Optional[int], typer.Option("--test-limit", min=1)]
Calibration = Annotated[Optional[Path], typer.Option("--calibration",
                                                     help="runtime constants from 'edgefl calibrate'")]
TorchDevice = Annotated[str, typer.Option("--device", help="cpu | cuda")]
PlanFile = Annotated[Path, typer.Option("--plan", help="plan.json written by 'edgefl plan -o'")]
Broker = Annotated[str, typer.Option("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT")]
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
