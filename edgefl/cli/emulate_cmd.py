"""`edgefl emulate`: plan a fleet, then train it end to end on this machine (CPU or CUDA)."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from edgefl.errors import ConfigError
from edgefl.outdir import check_output, make_output

RUN_FILES = ("config.json", "plan.json", "history.json")   # what marks a folder as a run --force may replace


def _is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_FILES)


def _version() -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("edgefl")
    except PackageNotFoundError:   # a source tree on sys.path, not installed: the version is unknown
        return None


def _round_line(record, rounds: int) -> str:
    """One line per round for logs and pipes: when it ended, the evaluation, who trained, how long it took."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} round {record.round}/{rounds}:"
    if record.accuracy is not None:
        line += f" accuracy {record.accuracy:.4f},"
    if record.loss is not None:
        line += f" loss {record.loss:.4f},"
    line += f" trained {sum(record.participating.values())}/{len(record.sampled)} devices"
    left_out = [f"{len(getattr(record, what))} {what}" for what in ("skipped", "failed", "rejected")
                if getattr(record, what)]
    if record.missing:
        left_out.append(f"{len(record.missing)} missing")
    if left_out:
        line += f" ({', '.join(left_out)})"
    return line + f", {record.wall_s:.1f} s"


@contextmanager
def _round_display(console, rounds: int):
    """A live bar on a terminal; elsewhere (a pipe, a log file, CI) a line per round as it ends, since a bar
    is drawn only when it finishes and a long run would print nothing for minutes."""
    if not console.is_terminal:
        yield lambda record: console.print(_round_line(record, rounds), markup=False, highlight=False,
                                           soft_wrap=True)
        return
    with Progress(TextColumn("round {task.completed}/{task.total}"), BarColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[acc]}"), console=console, transient=False) as bar:
        task = bar.add_task("emulate", total=rounds, acc="")
        yield lambda record: bar.update(task, advance=1, acc=f"accuracy {record.accuracy:.3f}"
                                        if record.accuracy is not None else "")


def _pretrained_ref(root: Path, depths: Optional[list[int]], train, strategy):
    """The transformer of the pretrained set to start from: the first of --layers, else the deepest; CAFF
    chooses among --layers (default: every depth in the set)."""
    from edgefl.zoo import ModelRef
    from edgefl.zoo.pretrained import available

    found = available(root)
    if missing := sorted(set(depths or ()) - set(found)):
        raise ConfigError(f"--pretrained {root}: no model with {missing} layers (it has {sorted(found)}); "
                          f"add them with 'edgefl pretrain --layers {','.join(map(str, missing))} -o {root}'")
    depths = depths or sorted(found, reverse=True)
    config = found[depths[0]]
    if list(getattr(train, "vocab", None) or []) != config["vocab"]:
        raise ConfigError(f"--pretrained {root}: the models were pretrained on another vocabulary than the data set's; "
                          "pretrain them on this data set's text")
    ref = ModelRef.from_json(config["model"])
    if train.x.ndim != 2 or train.x.shape[1] > ref.args["context"]:
        raise ConfigError(f"--pretrained {root}: the models read at most {ref.args['context']} tokens, the data's "
                          f"windows are {train.x.shape[1:]}; pretrain with --context {train.x.shape[-1]}")
    if strategy.name == "caff":
        strategy.depths = depths
    return ref


@contextmanager
def _engine(engine: str, address: Optional[str], ref, device: str):
    """The transport the devices run behind: in this process, or in the actors of a Ray cluster."""
    if engine == "local":
        from edgefl.transport.memory import InMemoryTransport
        yield InMemoryTransport
        return
    from edgefl.cli.console import stdout
    from edgefl.engines.ray import ray_engine
    with ray_engine(address, ref, device) as ray:
        stdout.print(ray.describe(), markup=False, highlight=False)
        yield ray


def emulate(
    devices: Path = typer.Option(..., "--devices"),
    model: str = typer.Option(..., "--model"),
    dataset: str = typer.Option(..., "--dataset", help="fashion-mnist, mnist, cifar10, cifar100, shakespeare"),
    method: str = typer.Option(..., "--method"),
    rounds: int = typer.Option(..., "--rounds", min=1),
    output: Path = typer.Option(..., "-o", "--output", help="run folder, e.g. runs/NAME (refused if it holds files)"),
    force: bool = typer.Option(False, "--force", help="replace the run folder at -o if it holds an earlier run"),
    clients_per_round: int = typer.Option(10, "--clients-per-round", min=1),
    partition: str = typer.Option("iid", "--partition", help="iid | dirichlet:ALPHA | shards:LABELS | natural"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    seed: int = typer.Option(0, "--seed"),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    local_epochs: int = typer.Option(1, "--local-epochs", min=1),
    lr: float = typer.Option(0.05, "--lr", min=0.0),
    eval_every: int = typer.Option(1, "--eval-every", min=1),
    train_limit: Optional[int] = typer.Option(None, "--train-limit", min=1, help="use a seeded subset of the training set"),
    test_limit: Optional[int] = typer.Option(None, "--test-limit", min=1),
    data_root: Optional[Path] = typer.Option(None, "--data-root"),
    layers: Optional[str] = typer.Option(None, "--layers"),
    classes: Optional[int] = typer.Option(None, "--classes", min=2),
    input_shape: Optional[str] = typer.Option(None, "--input-shape"),
    toa_scale: Optional[float] = typer.Option(None, "--toa", min=0.0, max=1.0,
                                              help="FedOLF TOA: send frozen layers (but the last) as this share of "
                                                   "their filters, sampled by norm"),
    measure_memory: bool = typer.Option(False, "--measure-memory",
                                        help="devices measure the activations autograd keeps and fail a round "
                                             "whose peak would exceed their memory"),
    pretrained: Optional[Path] = typer.Option(None, "--pretrained",
                                              help="folder written by 'edgefl pretrain': the transformer starts from "
                                                   "those weights (caff picks among its depths)"),
    engine: str = typer.Option("local", "--engine", help="where the devices train: local (this process) | ray "
                                                         "(actors of a Ray cluster; pip install 'edgefl[ray]')"),
    address: Optional[str] = typer.Option(None, "--address", help="--engine ray: the cluster's head, HOST:PORT "
                                                                  "(default: start Ray on this machine)"),
):
    """Train the whole fleet in one process (or a Ray cluster's actors), each virtual device held to its budget."""
    from edgefl.cli.console import stdout
    from edgefl.cli.options import model_ref, parse_int_list
    from edgefl.data import load_dataset, parse_partition, subset
    from edgefl.data.shares import device_shares
    from edgefl.device_runtime.trainers.torch_trainer import resolve_device
    from edgefl.engines.local import emulate as run_emulation
    from edgefl.fleet import load_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.server.coordinator import LoopSettings
    from edgefl.server.history import write_history

    resolve_device(device)  # fail before any work when CUDA is asked for and absent
    if engine not in ("local", "ray"):
        raise ConfigError(f"--engine: expected local or ray, got {engine!r}")
    if address is not None and engine != "ray":
        raise ConfigError("--address: it names a Ray cluster; add --engine ray")
    if engine == "ray":   # missing Ray or no cluster at --address fail here, not after the data loads
        from edgefl.engines.ray import check_address
        from edgefl.transport.ray_transport import import_ray
        import_ray()
        if address is not None:
            check_address(address)
    check_output(output, force, "run", _is_run)   # and before minutes of work on a folder it may not write
    if pretrained is not None and model != "transformer":
        raise ConfigError(f"--pretrained: the pretrained set holds transformers; use --model transformer, not {model}")
    fleet = load_fleet(devices)
    parse_partition(partition)   # a bad partition fails before the data loads
    options = {}
    if pretrained is not None:
        from edgefl.zoo.pretrained import fine_tuning_data_options
        options = fine_tuning_data_options(pretrained, dataset)
    train = subset(load_dataset(dataset, root=data_root, split="train", **options), train_limit, seed)
    test = subset(load_dataset(dataset, root=data_root, split="test", **options), test_limit, seed + 1)
    if input_shape is None and model != "transformer" and train.x.ndim == 4:
        input_shape = ",".join(str(d) for d in train.x.shape[1:])
    if classes is None and model != "transformer":
        classes = train.classes
    strategy = get_strategy(method)
    if pretrained is not None:
        ref = _pretrained_ref(pretrained, parse_int_list(layers, "--layers"), train, strategy)
    elif model == "transformer" and train.x.ndim == 2:   # token windows: the data's vocabulary and length
        ref = model_ref(model, parse_int_list(layers, "--layers"), vocab=train.classes, context=train.x.shape[1])
    else:
        ref = model_ref(model, parse_int_list(layers, "--layers"), classes, input_shape=input_shape)
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=rounds, batch_size=batch_size,
                                            local_epochs=local_epochs)), fleet)
    ref = plan.model  # CAFF may choose another depth
    share_of = device_shares(fleet, train, partition, seed, source=dataset)
    shares = [share_of[d] for d in sorted(share_of)]

    initial = None
    if pretrained is not None:
        from edgefl.zoo.pretrained import load_pretrained
        initial = load_pretrained(pretrained, ref)
    make_output(output, force)
    (output / "config.json").write_text(json.dumps({
        "devices": str(devices), "model": ref.to_json(), "dataset": dataset, "method": method, "rounds": rounds,
        "clients_per_round": clients_per_round, "partition": partition, "device": device, "seed": seed,
        "batch_size": batch_size, "local_epochs": local_epochs, "lr": lr, "toa": toa_scale,
        "measure_memory": measure_memory, "pretrained": str(pretrained) if pretrained else None,
        "train_examples": len(train.y), **({"engine": "ray", "ray_address": address} if engine == "ray" else {}),
        "test_examples": len(test.y), "edgefl_version": _version()}, indent=2) + "\n")
    plan.write(output / "plan.json")
    for g in plan.groups.values():
        if g.excluded:
            stdout.print(f"[yellow]group {g.name} excluded[/]: {g.reason}")
    if toa_scale is not None and toa_scale <= 0:
        raise ConfigError(f"--toa {toa_scale}: the share of filters sent must be in (0, 1]")
    settings = LoopSettings(rounds=rounds, clients_per_round=clients_per_round, seed=seed, eval_every=eval_every,
                            lr=lr, lr_final=lr / 10, measure_memory=measure_memory)
    records = []
    with _engine(engine, address, ref, device) as transport, _round_display(stdout, rounds) as show:

        def on_round(record):
            records.append(record)
            write_history(records, output / "history.json")
            show(record)

        _, server = run_emulation(fleet, plan, strategy, ref, train, test, shares, settings, device, on_round,
                                  toa=toa_scale, initial_state=initial, transport=transport)
    import torch
    torch.save(server.state, output / "weights.pt")
    last = next((r.accuracy for r in reversed(records) if r.accuracy is not None), None)
    stdout.print(f"{method} on {ref.label()}: {rounds} rounds" + (f", final accuracy {last:.4f}" if last is not None else "")
                 + f"; run written to {output}")
