"""`edgefl serve`: run a plan on real devices over MQTT (edgefl.engines.serving does the work; this module
parses, and shows the rounds live with edgefl.cli.live)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import stdout

Credentials = Annotated[Optional[Path], typer.Option("--credentials", help="the coordinator's login file "
                                                     "(credentials/coordinator.json from 'edgefl broker config')")]
CaFile = Annotated[Optional[Path], typer.Option("--ca-file", help="the broker's CA certificate (mqtts)")]
State = Annotated[Path, typer.Option("--state", help="run folder: checkpoints, history, plan")]
Rounds = Annotated[Optional[int], typer.Option("--rounds", min=1, help="default: the plan's rounds")]
RoundTimeout = Annotated[float, typer.Option("--round-timeout", min=1.0, help="seconds a round waits for reports")]
MinReports = Annotated[int, typer.Option("--min-reports", min=1, help="a round with fewer accepted reports is not "
                                         "aggregated")]
FleetFile = Annotated[Optional[Path], typer.Option("--devices", help="the fleet file the plan was made from "
                                                   "(default: device names generated from the plan's group counts)")]
PerRound = Annotated[Optional[int], typer.Option("--clients-per-round", min=1, help="default: every device")]
WaitOnline = Annotated[float, typer.Option("--wait-online", min=0.0, help="seconds to wait for every device before "
                                           "round 1")]
TestSet = Annotated[Optional[str], typer.Option("--dataset", metavar="DATASET", help="evaluate the global model on this "
                                                "data set's test split after each round; without it nothing is "
                                                "evaluated (devices hold the training data)")]
Grace = Annotated[float, typer.Option("--grace", min=0.0, help="seconds a round still waits for a device whose "
                                      "connection dropped or whose upload was refused (a broker restart drops all)")]
ClipNorm = Annotated[Optional[float], typer.Option("--clip-norm", min=0.0, help="bound each device update's L2 norm "
                                                  "(robustness to bad uploads)")]


def serve(plan_path: o.PlanFile, broker: o.Broker, credentials: Credentials = None, ca_file: CaFile = None,
          state: State = Path("runs/serve"), rounds: Rounds = None, round_timeout: RoundTimeout = 600.0,
          min_reports: MinReports = 1, devices: FleetFile = None, clients_per_round: PerRound = None,
          wait_online: WaitOnline = 60.0, seed: o.Seed = 0, lr: o.Lr = 0.05, eval_every: o.EvalEvery = 1,
          dataset: TestSet = None, test_limit: o.TestLimit = None, data_root: o.DataRoot = None,
          clip_norm: ClipNorm = None, grace: Grace = 30.0):
    """Serve a plan to devices over MQTT: ship artifacts, collect measured reports, aggregate."""
    from edgefl.cli.live import LiveView
    from edgefl.engines.serving import Serving
    from edgefl.engines.serving import serve as run

    def watch(transport, groups: dict[str, str], total: int) -> LiveView:
        return LiveView(transport.activity, stdout, state, rounds=total, broker=broker, groups=groups,
                        online=lambda: transport.online().keys())

    signal.signal(signal.SIGTERM, _interrupt)      # a service manager stops it as Ctrl-C does
    try:
        run(Serving(plan=plan_path, broker=broker, credentials=credentials, ca_file=ca_file, state=state,
                    rounds=rounds, round_timeout=round_timeout, min_reports=min_reports, devices=devices,
                    clients_per_round=clients_per_round, wait_online=wait_online, seed=seed, lr=lr,
                    eval_every=eval_every, dataset=dataset, test_limit=test_limit, data_root=data_root,
                    clip_norm=clip_norm, grace=grace),
            say=lambda line: stdout.print(line, highlight=False), watch=watch)
    except KeyboardInterrupt:
        from edgefl.server.runstate import RunState

        done = RunState(state).completed()
        print(f"edgefl: interrupted in round {done + 1}; rounds 1-{done} are checkpointed in {state}: run the same "
              f"command to resume at round {done + 1}" if done else
              f"edgefl: interrupted in round 1; nothing to resume from in {state} yet", file=sys.stderr, flush=True)
        raise typer.Exit(130) from None
    stdout.print(f"run written to {state}")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
