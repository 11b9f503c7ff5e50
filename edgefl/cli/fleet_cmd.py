"""`edgefl fleet up`: a whole fleet of real device agents on this machine, for demos and tests.

One `edgefl-device run` process per device of the fleet file, each with its own share of a data set
(split exactly as `edgefl emulate` splits it: the same partition of the same seeded subset, shares in
sorted device order, so a served run and its emulation train the same examples), its group's runtime and
memory budget, its own artifact cache and log. With `--enforce-memory` each device's training process
is capped at its group's memory budget (a cgroup where this machine permits one, else RLIMIT_AS).
Runs until Ctrl-C / SIGTERM, then stops every device.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

fleet_app = typer.Typer(no_args_is_help=True, help="run a fleet of device agents on this machine")


def export_shares(fleet, dataset: str, partition: str, seed: int, folder: Path, train_limit: Optional[int] = None,
                  data_root: Optional[Path] = None) -> dict[str, Path]:
    """Each device's share of the training split as DIR/<device>/{x,y}.npy, split as emulation splits it
    (edgefl.shares: cut to its group's `examples:`)."""
    import numpy as np

    from edgefl.cli.emulate_cmd import _subset
    from edgefl.data import load_dataset
    from edgefl.shares import device_shares

    train = _subset(load_dataset(dataset, root=data_root, split="train"), train_limit, seed)
    out = {}
    for device, idx in sorted(device_shares(fleet, train, partition, seed, source=dataset).items()):
        d = folder / device
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "x.npy", train.x[idx])
        np.save(d / "y.npy", train.y[idx])
        out[device] = d
    return out


def device_command(device: str, group, broker: str, data: Path, workdir: Path, credentials: Optional[Path],
                   ca_file: Optional[Path], enforce_memory: bool) -> list[str]:
    cmd = [sys.executable, "-m", "edgefl.device_runtime.cli", "run", "--id", device, "--broker", broker,
           "--data", str(data), "--runtime", group.runtime, "--cache", str(workdir / "cache" / device),
           "--memory", str(group.memory_budget_bytes)]
    if group.profile is not None:
        cmd += ["--profile", group.profile.name]
    else:
        cmd += ["--power", "3W"]     # no profile: the energy estimate's stand-in power, reported as estimated
    if credentials is not None:
        cmd += ["--credentials", str(credentials / f"{device}.json")]
    if ca_file is not None:
        cmd += ["--ca-file", str(ca_file)]
    if enforce_memory:
        cmd += ["--enforce-memory"]
    return cmd


@fleet_app.command("up")
def up(
    devices: Path = typer.Option(..., "--devices", help="fleet file"),
    broker: str = typer.Option(..., "--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT"),
    dataset: str = typer.Option(..., "--dataset", help="fashion-mnist, mnist, cifar10, cifar100, shakespeare"),
    partition: str = typer.Option("iid", "--data-partition", "--partition", help="iid | dirichlet:ALPHA | shards:LABELS | natural"),
    seed: int = typer.Option(0, "--seed", help="the seed 'edgefl emulate --seed' would use"),
    train_limit: Optional[int] = typer.Option(None, "--train-limit", min=1),
    data_root: Optional[Path] = typer.Option(None, "--data-root"),
    workdir: Path = typer.Option(Path("runs/fleet"), "--workdir", help="data shares, caches and logs"),
    credentials: Optional[Path] = typer.Option(None, "--credentials-dir",
                                               help="DIR/credentials from 'edgefl broker config' (<id>.json each)"),
    ca_file: Optional[Path] = typer.Option(None, "--ca-file"),
    enforce_memory: bool = typer.Option(False, "--enforce-memory",
                                        help="cap each training process at its group's memory budget"),
):
    """Start one device agent per device of the fleet; stop them all on Ctrl-C."""
    from edgefl.cli.main import stdout
    from edgefl.fleet import load_fleet

    fleet = load_fleet(devices)
    data = export_shares(fleet, dataset, partition, seed, workdir / "data", train_limit, data_root)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    procs = {}
    for g in fleet.groups:
        for device in g.device_ids:
            log = open(workdir / "logs" / f"{device}.log", "w")
            procs[device] = subprocess.Popen(device_command(device, g, broker, data[device], workdir, credentials,
                                                            ca_file, enforce_memory), stdout=log, stderr=subprocess.STDOUT)
    stdout.print(f"{len(procs)} devices started ({', '.join(sorted({g.runtime for g in fleet.groups}))}); "
                 f"logs in {workdir / 'logs'}; Ctrl-C stops them")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if dead := {d: p.returncode for d, p in procs.items() if p.poll() is not None}:
            for d, rc in sorted(dead.items()):
                stdout.print(f"[yellow]{d} exited ({rc}); see {workdir / 'logs' / f'{d}.log'}[/]")
                del procs[d]
            if not procs:
                break
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        p.wait(timeout=30)
    stdout.print("fleet stopped")
