"""`edgefl fleet up`: a whole fleet of real device agents on this machine, for demos and tests.

One `edgefl-device run` process per device of the fleet file, each with its own share of a data set
(split exactly as `edgefl emulate` splits it: the same partition of the same seeded subset, shares in
sorted device order, so a served run and its emulation train the same examples), its group's runtime and
memory budget, its own artifact cache and log. With `--enforce-memory` each device's training process
is capped at its group's memory budget (a cgroup where this machine permits one, else RLIMIT_AS).
Runs until Ctrl-C / SIGTERM, then stops every device; when every agent has exited by itself (a wrong
login, an unreachable broker) it says which, what the first said last and where the logs are (exit 2).

Logins: `--credentials-dir` is the deployment folder `edgefl broker config -o DIR` wrote, or its
`credentials/` folder (whichever holds `<device>.json`); with mqtts:// and no `--ca-file`, that
deployment's `tls/ca.crt` is the CA. Every agent gets its own login file and the CA.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import ConfigError, EdgeflError
from edgefl.units import listing

STOP_GRACE_S = 30.0    # after SIGTERM, for every agent together: a clean goodbye (presence, DISCONNECT)

fleet_app = typer.Typer(no_args_is_help=True, help="run a fleet of device agents on this machine")


def export_shares(fleet, dataset: str, partition: str, seed: int, folder: Path, train_limit: Optional[int] = None,
                  data_root: Optional[Path] = None) -> dict[str, Path]:
    """Each device's share of the training split as DIR/<device>/{x,y}.npy, split as emulation splits it
    (edgefl.data.shares: cut to its group's `examples:`)."""
    import numpy as np

    from edgefl.data import load_dataset, subset
    from edgefl.data.shares import device_shares

    train = subset(load_dataset(dataset, root=data_root, split="train"), train_limit, seed)
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
                                               help="the folder of 'edgefl broker config -o DIR', or its credentials/ "
                                                    "(<id>.json per device)"),
    ca_file: Optional[Path] = typer.Option(None, "--ca-file", help="the broker's CA certificate (mqtts; default: "
                                                                   "tls/ca.crt of the --credentials-dir deployment)"),
    enforce_memory: bool = typer.Option(False, "--enforce-memory",
                                        help="cap each training process at its group's memory budget"),
):
    """Start one device agent per device of the fleet; stop them all on Ctrl-C."""
    from rich.markup import escape

    from edgefl.cli.console import stdout
    from edgefl.fleet import load_fleet
    from edgefl.protocol.broker_address import check_ca_file, parse_broker_url

    fleet = load_fleet(devices)
    ids = [d for g in fleet.groups for d in g.device_ids]
    address = parse_broker_url(broker)
    if credentials is not None:
        credentials, found_ca = logins_folder(credentials, ids)
        if ca_file is None and address.tls and found_ca is not None:
            ca_file = found_ca
            stdout.print(f"CA certificate: {ca_file} (from the deployment folder)")
    check_ca_file(ca_file, address)
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
    exited: dict[str, int] = {}
    while not stop.wait(1.0):
        if dead := {d: p.returncode for d, p in procs.items() if p.poll() is not None}:
            for d, rc in sorted(dead.items()):
                stdout.print(f"[yellow]{d} exited ({rc}): {escape(last_line(workdir / 'logs' / f'{d}.log'))}; "
                             f"log {escape(str(workdir / 'logs' / f'{d}.log'))}[/]")
                del procs[d]
            exited.update(dead)
            if not procs:
                break
    for p in procs.values():
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for d, p in procs.items():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:    # stuck saying goodbye (a slow broker): its trainer dies with it
            p.kill()
            p.wait()
            stdout.print(f"[yellow]{d} did not stop within {STOP_GRACE_S:.0f} s: killed (its will marks it "
                         f"offline); log {escape(str(workdir / 'logs' / f'{d}.log'))}[/]")
    if not stop.is_set():       # nobody asked them to stop: every agent died on its own
        first = min(exited)
        raise EdgeflError(f"every device agent exited: {listing([f'{d} ({rc})' for d, rc in sorted(exited.items())])}; "
                          f"logs in {workdir / 'logs'} ({first}.log ends: {last_line(workdir / 'logs' / f'{first}.log')})")
    stdout.print("fleet stopped")


def logins_folder(folder: Path, devices: list[str]) -> tuple[Path, Optional[Path]]:
    """(the folder holding <device>.json for every device, the deployment's CA certificate if it has one):
    `folder` is the deployment folder of 'edgefl broker config -o' or its credentials/ subfolder."""
    for candidate, deployment in ((folder / "credentials", folder), (folder, folder.parent)):
        held = [d for d in devices if (candidate / f"{d}.json").is_file()]
        if held:
            if missing := [d for d in devices if d not in held]:
                raise ConfigError(f"--credentials-dir {folder}: no login for {listing(missing)} in {candidate} "
                                  f"(it has {len(held)} of the fleet's {len(devices)}); run 'edgefl broker config "
                                  f"--devices' with this fleet file (or the fleet it is a subset of) to add them")
            ca = deployment / "tls" / "ca.crt"
            return candidate, ca if ca.is_file() else None
    raise ConfigError(f"--credentials-dir {folder}: neither it nor {folder / 'credentials'} holds device logins "
                      f"(looked for {devices[0]}.json); give the folder of 'edgefl broker config -o DIR' or its "
                      "credentials/ folder")


def last_line(log: Path) -> str:
    """What an agent said last (its one-line error, when it died of one)."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][-300:] if lines else "its log is empty"
