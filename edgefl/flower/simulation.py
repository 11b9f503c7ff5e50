"""`edgefl flower`: an emulation's fleet run in Flower's own simulation runtime.

What `edgefl emulate` does, with Flower in the middle: `EmulatedRun.start` checks the options, loads the
data, plans the fleet and writes config.json and plan.json; then `flwr.simulation.run_simulation` runs a
ServerApp whose strategy is `EdgeflStrategy` and a ClientApp of edgefl devices (edgefl.flower.client) on one
Flower supernode per device, in the actors of Flower's Ray backend. history.json gets each
round as it ends, weights.pt and flower_messages.json (what each train message and its reply carried) at the end, so `edgefl report` reads the folder as it reads an emulated run.
Same seed, same results as `edgefl emulate`: the same round loop samples, plans, slices and aggregates, and
each node trains with the emulated device's code, rows and seed, at one torch thread (records.NODE_THREADS:
`edgefl emulate` gives the same weights at OMP_NUM_THREADS=1).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from edgefl.errors import ConfigError
from edgefl.flower.records import NODE_THREADS
from edgefl.server.history import HistoryFile, record_to_json

CLIENT_CPUS = NODE_THREADS      # Ray CPUs each simulated client reserves: one actor per CPU, each node's threads
TIMEOUT_S = 3600.0       # a round's replies must arrive within this
MESSAGES_SCHEMA = "edgefl.flower_messages/1"


def start(spec):
    """The planned run (edgefl.engines.emulation.EmulatedRun), its folder written up to the plan."""
    from edgefl.engines.emulation import EmulatedRun

    if spec.engine != "local" or spec.address is not None:
        raise ConfigError("--engine/--address: Flower's simulation runtime places the devices (Ray, on this "
                          "machine); use 'edgefl emulate --engine ray' for a cluster")
    require_flower()
    run = EmulatedRun.start(spec)
    config = spec.output / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "engine": "flower"}, indent=2) + "\n")
    return run


def require_flower() -> None:
    from edgefl.flower.records import import_flwr

    import_flwr()
    from edgefl.engines.ray import import_ray     # Flower's simulation backend

    try:
        import_ray()
    except ConfigError:
        raise ConfigError("edgefl flower: Flower's simulation runtime needs Ray; pip install 'edgefl[ray]'") from None


def server_app(run, on_round: Callable = lambda record: None, done: Callable = lambda strategy: None):
    """A ServerApp running `run`'s rounds with EdgeflStrategy (`run(context)`: made from the app's context
    when it starts); `done(strategy)` when they are over."""
    from flwr.app import ArrayRecord
    from flwr.serverapp import ServerApp

    from edgefl.flower.strategy import EdgeflStrategy

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        planned = run(context) if callable(run) else run
        strategy = EdgeflStrategy(planned, on_round)
        try:
            strategy.start(grid, initial_arrays=ArrayRecord(), num_rounds=planned.spec.rounds, timeout=TIMEOUT_S)
        finally:
            strategy.close()
        done(strategy)

    return app


class RunFolder:
    """What a Flower run writes in its folder, as `edgefl emulate` writes it: history.json after every round
    (`round`), weights.pt and flower_messages.json at the end (`finish`)."""

    def __init__(self, output: Path, on_round: Callable = lambda record: None):
        self.output, self.on_round = output, on_round
        self.records: list = []
        self.strategy = None
        self.history: HistoryFile | None = None

    def round(self, record) -> None:
        self.records.append(record)
        if self.history is None:
            self.history = HistoryFile(self.output / "history.json")
        self.history.append(record_to_json(record))     # a round at a time: a long run does not rewrite it whole
        self.on_round(record)

    def finish(self, strategy) -> None:
        if strategy.server is None:
            raise RuntimeError(f"the Flower run ended after {len(self.records)} rounds")
        self.strategy = strategy
        strategy.server.save(self.output / "weights.pt")
        messages = {"schema": MESSAGES_SCHEMA, "messages": strategy.messages, "replies": strategy.replies}
        (self.output / "flower_messages.json").write_text(json.dumps(messages, indent=1) + "\n")


def simulate(run, on_round: Callable = lambda record: None, verbose: bool = False,
             client_cpus: float = CLIENT_CPUS) -> list:
    """Run every round in Flower's simulation, one supernode per device; the run folder written as it goes."""
    from flwr.simulation import run_simulation

    from edgefl.flower.client import NodeData, client_app

    folder = RunFolder(run.spec.output, on_round)
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(server_app(run, folder.round, folder.finish), client_app(NodeData.of(run.spec)),
                   num_supernodes=sum(len(g.device_ids) for g in run.fleet.groups),
                   backend_config={"client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0},
                                   "init_args": {"logging_level": "WARNING", "log_to_driver": verbose}})
    if folder.strategy is None:     # the ServerApp failed: Flower logged why
        raise RuntimeError(f"the Flower simulation ended after {len(folder.records)} of {run.spec.rounds} rounds")
    return folder.records


def flower(spec, on_round: Callable = lambda record: None, verbose: bool = False) -> tuple[object, list]:
    """(the planned run, its round records): plan, then simulate."""
    run = start(spec)
    return run, simulate(run, on_round, verbose)

