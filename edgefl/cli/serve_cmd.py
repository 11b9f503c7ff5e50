"""`edgefl serve`: run a plan on real devices over MQTT (the emulation's round loop, another transport).

The state folder is the run folder: plan.json, config.json, history.json (as `edgefl emulate` writes them,
so `edgefl report` and `edgefl calibrate` read it), the last checkpoint and the journal of the round in
progress. Started again with the same --state, serve resumes after the last completed round. While it runs,
`status.json` there holds the round in progress per device (`edgefl status` prints it) and the output shows
it live (`edgefl.cli.live`).

It refuses to start what could only fail quietly: a fleet file that is not the plan's (`fleet_of`), a login
that is not the coordinator's (`MqttTransport` checks it with a round trip), no device of the fleet online.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import TransportError


def serve(
    plan_path: Path = typer.Option(..., "--plan", help="plan.json written by 'edgefl plan -o'"),
    broker: str = typer.Option(..., "--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT"),
    credentials: Optional[Path] = typer.Option(None, "--credentials", help="the coordinator's login file "
                                               "(credentials/coordinator.json from 'edgefl broker config')"),
    ca_file: Optional[Path] = typer.Option(None, "--ca-file", help="the broker's CA certificate (mqtts)"),
    state: Path = typer.Option(Path("runs/serve"), "--state", help="run folder: checkpoints, history, plan"),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="default: the plan's rounds"),
    round_timeout: float = typer.Option(600.0, "--round-timeout", min=1.0, help="seconds a round waits for reports"),
    min_reports: int = typer.Option(1, "--min-reports", min=1, help="a round with fewer accepted reports is not aggregated"),
    devices: Optional[Path] = typer.Option(None, "--devices", help="the fleet file the plan was made from "
                                           "(default: device names generated from the plan's group counts)"),
    clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", min=1, help="default: every device"),
    wait_online: float = typer.Option(60.0, "--wait-online", min=0.0,
                                      help="seconds to wait for every device before round 1"),
    seed: int = typer.Option(0, "--seed"),
    lr: float = typer.Option(0.05, "--lr", min=0.0),
    eval_every: int = typer.Option(1, "--eval-every", min=1),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="evaluate on this data set's test split"),
    test_limit: Optional[int] = typer.Option(None, "--test-limit", min=1),
    data_root: Optional[Path] = typer.Option(None, "--data-root"),
    clip_norm: Optional[float] = typer.Option(None, "--clip-norm", min=0.0,
                                              help="bound each device update's L2 norm (robustness to bad uploads)"),
):
    """Serve a plan to devices over MQTT: ship artifacts, collect measured reports, aggregate."""
    from edgefl.cli.console import stdout
    from edgefl.cli.live import LiveView
    from edgefl.data import subset
    from edgefl.engines.deployed import ArtifactShipper, DeployedServerModel, check_deployable, fleet_of
    from edgefl.engines.local import torch_trainer
    from edgefl.export.backends import get_backend
    from edgefl.fleet import load_fleet
    from edgefl.planning.plan import Plan
    from edgefl.planning.strategies import get_strategy
    from edgefl.server.coordinator import Coordinator, LoopSettings
    from edgefl.server.runstate import RunState
    from edgefl.transport.mqtt import MqttTransport

    plan = Plan.read(plan_path)
    check_deployable(plan)
    fleet = fleet_of(plan, load_fleet(devices) if devices else None, f"--devices {devices} and --plan {plan_path}")
    test = None
    if dataset is not None:
        from edgefl.data import load_dataset
        test = subset(load_dataset(dataset, root=data_root, split="test"), test_limit, seed + 1)
    state.mkdir(parents=True, exist_ok=True)
    plan.write(state / "plan.json")
    total = rounds or plan.rounds
    (state / "config.json").write_text(json.dumps({
        "plan": str(plan_path), "broker": broker, "method": plan.method, "model": plan.model.to_json(),
        "rounds": total, "seed": seed, "lr": lr, "round_timeout_s": round_timeout, "min_reports": min_reports,
        "dataset": dataset, "clip_norm": clip_norm}, indent=2) + "\n")

    runtime_of = {d: g.runtime for g in fleet.groups for d in g.device_ids}
    backends: dict = {}

    def backend_for(runtime: str):
        if runtime not in backends:
            backends[runtime] = get_backend(runtime)
        return backends[runtime]

    for runtime in sorted(set(runtime_of.values())):
        backend_for(runtime)     # a missing export backend fails now, not in round 1
    transport = MqttTransport(broker, credentials, ca_file=ca_file)
    group_of = {d: g.name for g in fleet.groups for d in g.device_ids}
    try:
        transport.share_by_group(group_of)    # a group's set (and its weights) goes out once on the group's topics
        everyone = sorted(runtime_of)
        stdout.print(f"waiting up to {wait_online:.0f} s for {len(everyone)} devices at {broker} ...")
        _report_online(transport.wait_online(everyone, wait_online), everyone, broker, wait_online, stdout)
        strategy = get_strategy(plan.method)
        server = DeployedServerModel(plan.model, test, torch_trainer(plan.model), seed, clip_norm=clip_norm,
                                     evaluated=lambda: strategy.evaluated_config(plan),
                                     shipper=ArtifactShipper(state / "artifacts", backend_for),
                                     ship=transport.ship_artifact, runtime_of=runtime_of)
        settings = LoopSettings(rounds=total, clients_per_round=clients_per_round or len(everyone), seed=seed,
                                eval_every=eval_every, lr=lr, lr_final=lr / 10, round_timeout_s=round_timeout,
                                min_reports=min_reports)
        examples = {d: g.examples or 0 for g in fleet.groups for d in g.device_ids}
        live = LiveView(transport.activity, stdout, state, rounds=total, broker=broker,
                        groups=group_of,
                        online=lambda: transport.online().keys())
        coordinator = Coordinator(fleet, plan, strategy, server, transport, settings,
                                  examples=examples.__getitem__, on_round=live.round_done,
                                  state=RunState(state), online=lambda: transport.online().keys())
        with live:
            coordinator.run()
    finally:
        transport.close()
    _save_weights(server, state / "weights.pt")
    stdout.print(f"run written to {state}")


def _report_online(online: dict, expected: list[str], broker: str, waited: float, console) -> None:
    """'3 of 4 devices online (not yet: ...)', counting only the fleet's devices; others connected are named."""
    from edgefl.units import listing

    here = [d for d in expected if d in online]
    line = f"{len(here)} of {len(expected)} devices online"
    if missing := [d for d in expected if d not in online]:
        line += f" (not yet: {listing(missing)})"
    if strangers := sorted(set(online) - set(expected)):
        line += f"; also connected but not in this fleet: {listing(strangers)}"
    console.print(line, highlight=False)
    if not here:
        raise TransportError(f"none of the {len(expected)} devices of the plan came online at {broker} within "
                             f"{waited:.0f} s (ids {listing(expected, 3)}); start them with their logins "
                             "('edgefl fleet up', or 'edgefl-device --id ID ...'), or raise --wait-online")


def _save_weights(server, path: Path) -> None:
    import torch

    torch.save({k: v for k, v in server.state.items()}, path)
