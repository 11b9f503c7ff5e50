"""`edgefl fleet up`: a whole fleet of real device agents on this machine, for demos and tests
(edgefl.engines.agents starts and supervises them; this module parses and prints)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import stdout

fleet_app = typer.Typer(no_args_is_help=True, help="run a fleet of device agents on this machine")

Workdir = Annotated[Path, typer.Option("--workdir", help="data shares, caches and logs")]
CredentialsDir = Annotated[Optional[Path], typer.Option("--credentials-dir", help="the folder of 'edgefl broker "
                                                        "config -o DIR', or its credentials/ (<id>.json per device)")]
CaFile = Annotated[Optional[Path], typer.Option("--ca-file", help="the broker's CA certificate (mqtts; default: "
                                                "tls/ca.crt of the --credentials-dir deployment)")]
EnforceMemory = Annotated[bool, typer.Option("--enforce-memory", help="cap each training process at its group's "
                                             "memory budget")]


@fleet_app.command("up")
def up(devices: Annotated[Path, typer.Option("--devices", help="fleet file")], broker: o.Broker, dataset: o.Dataset,
       partition: Annotated[str, typer.Option("--data-partition", "--partition", help=o.PARTITIONS)] = "iid",
       seed: Annotated[int, typer.Option("--seed", help="the seed 'edgefl emulate --seed' would use")] = 0,
       train_limit: o.TrainLimit = None, data_root: o.DataRoot = None, workdir: Workdir = Path("runs/fleet"),
       credentials: CredentialsDir = None, ca_file: CaFile = None, enforce_memory: EnforceMemory = False,
       cache_budget: Annotated[Optional[str], typer.Option(
           "--cache-budget", metavar="SIZE", help="what each device's artifact cache may keep beyond the current "
           "round's set, e.g. 64MiB (the agent's default: 128MiB)")] = None,
       agent: Annotated[Optional[str], typer.Option(
           "--agent", metavar="python|native", help="every group's device agent, overriding the fleet file's "
           "'agent:' (default: each group's own, by default native for executorch and python for ort and "
           "torch; the native agent, C++ with no Python, 'edgefl-device build-native', trains ExecuTorch only)")] = None):
    """Start one device agent per device of the fleet; stop them all on Ctrl-C.

    Each group's devices run the agent its plan counted (`agent:`; by default native for ExecuTorch groups,
    python for ort and torch ones). --agent overrides it, and a line names each group whose plan counted the
    other agent's memory. The native agent trains ExecuTorch sets only."""
    from edgefl.engines.agents import Agents, claim, start, supervise

    with claim(workdir):
        procs = start(Agents(devices=devices, broker=broker, dataset=dataset, partition=partition, seed=seed,
                             train_limit=train_limit, data_root=data_root, workdir=workdir, credentials=credentials,
                             ca_file=ca_file, enforce_memory=enforce_memory, cache_budget=cache_budget, agent=agent),
                      say=lambda line: stdout.print(line, markup=False))
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        supervise(procs, workdir / "logs", stop, warn=lambda line: stdout.print(line, style="yellow", markup=False))
    stdout.print("fleet stopped")
