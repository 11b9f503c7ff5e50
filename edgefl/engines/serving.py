"""A served run, end to end: what `edgefl serve` does between parsing its options and printing.

The state folder is the run folder: plan.json, config.json, history.json (as an emulated run writes them,
so `edgefl report` and `edgefl calibrate` read it), the last checkpoint and the journal of the round in
progress (edgefl.server.runstate). Started again with the same state folder, a served run resumes after the
last completed round. It refuses to start what could only fail quietly: a fleet file that is not the plan's
(`fleet_of`), a login that is not the coordinator's (`MqttTransport` checks it with a round trip), no device of
the fleet online.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from edgefl.engines.run_options import RunOptions
from edgefl.errors import ConfigError, TransportError
from edgefl.outdir import write_atomic
from edgefl.units import listing


class RoundWatcher(Protocol):
    """What shows a served run as it goes (the CLI's live view): entered around the rounds, told each one."""
    def __enter__(self) -> "RoundWatcher": ...
    def __exit__(self, *exc) -> None: ...
    def round_done(self, record) -> None: ...


@dataclass(kw_only=True)
class Serving(RunOptions):
    """What to serve: a plan file, the broker and the coordinator's login, the state (run) folder, the round
    loop's settings (rounds default to the plan's, clients per round to every device), the fleet file the plan
    was made from (default: device names from the plan's group counts) and a test split to evaluate on."""
    plan: Path
    broker: str
    credentials: Optional[Path] = None
    ca_file: Optional[Path] = None
    state: Path = Path("runs/serve")
    rounds: Optional[int] = None
    round_timeout: float = 600.0
    min_reports: int = 1
    devices: Optional[Path] = None
    clients_per_round: Optional[int] = None
    wait_online: float = 60.0
    dataset: Optional[str] = None
    clip_norm: Optional[float] = None
    grace: float = 30.0        # edgefl.transport.endpoint.GRACE_S: a device gone offline is still waited for

    def config_json(self, plan, total: int) -> dict:
        import edgefl

        return {"plan": str(self.plan), "broker": self.broker, "method": plan.method, "model": plan.model.to_json(),
                "rounds": total, "seed": self.seed, "lr": self.lr, "round_timeout_s": self.round_timeout,
                "min_reports": self.min_reports, "dataset": self.dataset, "clip_norm": self.clip_norm,
                "edgefl_version": edgefl.version()}


def serve(spec: Serving, say: Callable[[str], None],
          watch: Callable[[object, dict[str, str], int], RoundWatcher]) -> None:
    """Run the plan on the devices at the broker until its last round. `say`: where progress lines go;
    `watch(transport, group of each device, rounds)`: what shows the rounds as they go."""
    from edgefl.data import load_split
    from edgefl.engines.deployed import ArtifactShipper, DeployedServerModel, check_deployable, fleet_of
    from edgefl.engines.local import torch_trainer
    from edgefl.fleet import load_fleet
    from edgefl.planning.plan import Plan
    from edgefl.planning.strategies import get_strategy
    from edgefl.server.coordinator import Coordinator, LoopSettings
    from edgefl.server.runstate import RunState
    from edgefl.transport.mqtt import MqttTransport
    from edgefl.zoo.from_options import check_reads

    plan = Plan.read(spec.plan)
    check_deployable(plan)
    fleet = fleet_of(plan, load_fleet(spec.devices) if spec.devices else None,
                     f"--devices {spec.devices} and --plan {spec.plan}")
    test = None
    if spec.dataset is not None:
        test = load_split(spec.dataset, "test", spec.data_root, spec.test_limit, spec.seed)
        check_reads(plan.model.name, test)
    if spec.rounds is not None and spec.rounds > plan.rounds:
        has = f"{plan.rounds} round{'s' * (plan.rounds != 1)}"
        raise ConfigError(f"--rounds {spec.rounds}: the plan {spec.plan} has {has}, so no device would train in rounds "
                          f"{plan.rounds + 1}-{spec.rounds}; plan again with 'edgefl plan ... --rounds {spec.rounds}', "
                          "or leave --rounds out")
    total = spec.rounds or plan.rounds
    state = RunState(spec.state)
    saved = state.load()   # a damaged or inconsistent state fails now, naming its file, before anything connects
    # a run started in this folder before: answers queued for the round it goes on with are its devices' and
    # are held until that round is instructed again (a fresh folder holds none: they would be another run's)
    resuming = (saved[0] + 1 if saved is not None else 1) if (spec.state / "config.json").exists() else 0
    plan.write(spec.state / "plan.json")
    write_atomic(spec.state / "config.json", (json.dumps(spec.config_json(plan, total), indent=2) + "\n").encode())
    runtime_of = {d: g.runtime for g in fleet.groups for d in g.device_ids}
    group_of = {d: g.name for g in fleet.groups for d in g.device_ids}
    backend_for = _backends(sorted(set(runtime_of.values())))
    transport = MqttTransport(spec.broker, spec.credentials, ca_file=spec.ca_file, grace_s=spec.grace,
                              resuming=resuming)
    try:
        transport.share_by_group(group_of)    # a group's set (and its weights) goes out once on the group's topics
        everyone = sorted(runtime_of)
        done = saved[3] if saved is not None else []     # the history records, checked against the checkpoint
        gone = offline_in(done[-1]) if done else {}
        if done:
            say(f"resuming {spec.state} at round {len(done) + 1} of {total}: rounds 1-{len(done)} are checkpointed "
                "there")
        # a resumed run does not wait for the devices its last round found offline (an agent that died): they
        # join the round after they come back, as any device does
        awaited = [d for d in everyone if d not in gone] or everyone
        say(f"waiting up to {spec.wait_online:.0f} s for {len(awaited)} devices at {spec.broker} ...")
        online = transport.wait_online(awaited, spec.wait_online)
        say(online_line(online, everyone, spec.broker, spec.wait_online, gone))
        strategy = get_strategy(plan.method)
        server = DeployedServerModel(plan.model, test, torch_trainer(plan.model), spec.seed, clip_norm=spec.clip_norm,
                                     evaluated=lambda: strategy.evaluated_config(plan),
                                     shipper=ArtifactShipper(spec.state / "artifacts", backend_for),
                                     ship=transport.ship_artifact, runtime_of=runtime_of,
                                     budget_of={d: g.memory_budget_bytes for g in fleet.groups for d in g.device_ids})
        settings = LoopSettings(rounds=total, clients_per_round=spec.clients_per_round or len(everyone),
                                seed=spec.seed, eval_every=spec.eval_every, lr=spec.lr, lr_final=spec.lr / 10,
                                round_timeout_s=spec.round_timeout, min_reports=spec.min_reports)
        examples = {d: g.examples or 0 for g in fleet.groups for d in g.device_ids}
        view = watch(transport, group_of, total)
        coordinator = Coordinator(fleet, plan, strategy, server, transport, settings,
                                  examples=examples.__getitem__, on_round=view.round_done,
                                  state=state, online=lambda: transport.online().keys(),
                                  declared=lambda d: transport.online().get(d, {}).get("memory_bytes"))
        with view:
            coordinator.run()
    finally:
        transport.close()
    server.save(spec.state / "weights.pt")


def _backends(runtimes: list[str]) -> Callable[[str], object]:
    """The export backend of each runtime, loaded now: a missing one fails before round 1."""
    from edgefl.export.backends import get_backend

    backends = {runtime: get_backend(runtime) for runtime in runtimes}

    def backend_for(runtime: str):
        if runtime not in backends:
            backends[runtime] = get_backend(runtime)
        return backends[runtime]

    return backend_for


def offline_in(record: dict) -> dict[str, str]:
    """The devices a round (a history record) found offline, each with where that was recorded."""
    found = {**record.get("skipped", {}), **record.get("failed", {})}
    return {d: f"offline in round {record['round']}" for d, why in sorted(found.items()) if why.startswith("offline")}


def online_line(online: dict, expected: list[str], broker: str, waited: float,
                gone: Optional[dict[str, str]] = None) -> str:
    """'3 of 4 devices online (not waited for: d (offline in round 6); not yet: ...)', counting only the fleet's
    devices (`gone`: those not waited for, and why); others connected are named. TransportError when none of
    them is online."""
    gone = gone or {}
    here = [d for d in expected if d in online]
    if not here:
        raise TransportError(f"none of the {len(expected)} devices of the plan came online at {broker} within "
                             f"{waited:.0f} s (ids {listing(expected, 3)}); start them with their logins "
                             "('edgefl fleet up', or 'edgefl-device --id ID ...'), or raise --wait-online")
    line = f"{len(here)} of {len(expected)} devices online"
    left = [f"{d} ({gone[d]})" for d in expected if d not in online and d in gone]
    waiting = [d for d in expected if d not in online and d not in gone]
    notes = [f"not waited for: {listing(left, 3)}"] if left else []
    notes += [f"not yet: {listing(waiting)}"] if waiting else []
    if notes:
        line += f" ({'; '.join(notes)})"
    if strangers := sorted(set(online) - set(expected)):
        line += f"; also connected but not in this fleet: {listing(strangers)}"
    return line
