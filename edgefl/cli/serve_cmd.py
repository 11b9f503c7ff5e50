"""`edgefl serve`: run a plan on real devices over MQTT (the emulation's round loop, another transport).

The state folder is the run folder: plan.json, config.json, history.json (as `edgefl emulate` writes them,
so `edgefl report` and `edgefl calibrate` read it), the last checkpoint and the journal of the round in
progress. Started again with the same --state, serve resumes after the last completed round.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import ConfigError


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
    from edgefl.cli.deployment import ArtifactShipper, DeployedServerModel, check_deployable, fleet_of
    from edgefl.cli.emulate_cmd import _subset
    from edgefl.cli.emulation import torch_trainer
    from edgefl.cli.main import stdout
    from edgefl.coordinator import Coordinator, LoopSettings
    from edgefl.export.backends import get_backend
    from edgefl.fleet import load_fleet
    from edgefl.plan import Plan
    from edgefl.runstate import RunState
    from edgefl.strategies import get_strategy
    from edgefl.transport.mqtt import MqttTransport

    plan = Plan.read(plan_path)
    check_deployable(plan)
    fleet = fleet_of(plan, load_fleet(devices) if devices else None)
    test = None
    if dataset is not None:
        from edgefl.data import load_dataset
        test = _subset(load_dataset(dataset, root=data_root, split="test"), test_limit, seed + 1)
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
    try:
        everyone = sorted(runtime_of)
        stdout.print(f"waiting up to {wait_online:.0f} s for {len(everyone)} devices at {broker} ...")
        online = transport.wait_online(everyone, wait_online)
        stdout.print(f"{len(online)} of {len(everyone)} devices online")
        strategy = get_strategy(plan.method)
        server = DeployedServerModel(plan.model, test, torch_trainer(plan.model), seed, clip_norm=clip_norm,
                                     evaluated=strategy.evaluated_config(plan),
                                     shipper=ArtifactShipper(state / "artifacts", backend_for),
                                     ship=transport.ship_artifact, runtime_of=runtime_of)
        settings = LoopSettings(rounds=total, clients_per_round=clients_per_round or len(everyone), seed=seed,
                                eval_every=eval_every, lr=lr, lr_final=lr / 10, round_timeout_s=round_timeout,
                                min_reports=min_reports)
        examples = {d: g.examples or 0 for g in fleet.groups for d in g.device_ids}
        coordinator = Coordinator(fleet, plan, strategy, server, transport, settings,
                                  examples=examples.__getitem__, on_round=lambda r: stdout.print(_round_line(r)),
                                  state=RunState(state), online=lambda: transport.online().keys())
        with _live(transport, coordinator, stdout):
            coordinator.run()
    finally:
        transport.close()
    _save_weights(server, state / "weights.pt")
    stdout.print(f"run written to {state}")


def _round_line(r) -> str:
    from edgefl.units import format_bytes

    reports = sum(r.participating.values())
    acc = f"accuracy {r.accuracy:.4f}" if r.accuracy is not None else "no evaluation"
    line = (f"round {r.round}: {reports}/{len(r.sampled)} reports, {acc}, up {format_bytes(r.upload_bytes)}, "
            f"down {format_bytes(r.download_bytes)}, {r.wall_s:.1f} s")
    for what in ("skipped", "failed", "rejected"):
        if getattr(r, what):
            line += f"; {what}: " + ", ".join(f"{d} ({why})" for d, why in sorted(getattr(r, what).items())[:3])
    if r.missing:
        line += f"; no report from {', '.join(r.missing[:5])}"
    if not r.aggregated:
        line += "; below quorum: not aggregated"
    return line


class _live:
    """A status line while a round waits: round, devices online, reports in."""

    def __init__(self, transport, coordinator, console):
        self.transport, self.coordinator, self.console = transport, coordinator, console
        self.stop = threading.Event()

    def __enter__(self):
        from rich.status import Status

        self.status = Status("starting", console=self.console)
        self.status.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop.wait(0.5):
            r = len(self.coordinator.history) + 1
            self.status.update(f"round {r}: {len(self.transport.online())} online, "
                               f"{self.transport.reports_in(r)} reports in")

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.status.stop()


def _save_weights(server, path: Path) -> None:
    import torch

    torch.save({k: v for k, v in server.state.items()}, path)
