"""`edgefl data export`: one client's share of a data set as the x.npy / y.npy pair `edgefl-device train`
reads. The share is the one the emulation gives the client: the same loader, partitioner and seed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import ConfigError

data_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Data sets: export a client's share.")


@data_app.command("export")
def export_share(
    dataset: str = typer.Option(..., "--dataset", help="fashion-mnist, mnist, cifar10, cifar100, shakespeare"),
    partition: str = typer.Option("iid", "--partition", help="iid | dirichlet:ALPHA | shards:LABELS | natural"),
    client: int = typer.Option(..., "--client", min=0, help="the client's index (0-based)"),
    output: Path = typer.Option(..., "-o", "--output", help="folder to write x.npy, y.npy and share.json into"),
    clients: int = typer.Option(10, "--clients", min=1, help="how many clients share the data (not for natural)"),
    split: str = typer.Option("train", "--split", help="train | test"),
    seed: int = typer.Option(0, "--seed", help="the seed 'edgefl emulate --seed' splits with"),
    data_root: Optional[Path] = typer.Option(None, "--data-root", metavar="DIR", help="where local copies of data sets "
                                             "live (default: $EDGEFL_DATA, else ~/.local/share/edgefl)"),
):
    """Write one client's examples (x.npy, y.npy) and where they came from (share.json)."""
    from edgefl.cli.console import stdout
    from edgefl.data import load_dataset, parse_partition
    from edgefl.data.shares import save_share

    spec = parse_partition(partition)
    data = load_dataset(dataset, root=data_root, split=split)
    shares = spec.split(data.y, clients, seed, groups=getattr(data, "groups", None))
    if client >= len(shares):
        raise ConfigError(f"--client {client}: the {partition} partition of {dataset} has {len(shares)} clients "
                          f"(0..{len(shares) - 1})")
    idx = shares[client]
    save_share(output, data.x[idx], data.y[idx])
    meta = {"dataset": dataset, "split": split, "partition": str(spec), "clients": len(shares), "client": client,
            "seed": seed, "examples": int(len(idx)), "classes": data.classes}
    if data.group_names is not None and spec.kind == "natural":
        meta["name"] = data.group_names[client]
    (output / "share.json").write_text(json.dumps(meta, indent=2) + "\n")
    stdout.print(f"client {client} of {len(shares)}: {len(idx)} {dataset} {split} examples written to {output}")
