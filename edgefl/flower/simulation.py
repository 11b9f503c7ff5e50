"""`edgefl flower`: an emulation's fleet run in Flower's own simulation runtime.

What `edgefl emulate` does, with Flower in the middle: `EmulatedRun.start` checks the options, loads the
data, plans the fleet and writes config.json and plan.json; then `flwr.simulation.run_simulation` runs a
ServerApp whose strategy is `EdgeflStrategy` and a ClientApp of edgefl devices (edgefl.flower.client) on one
Flower supernode per device, in the actors of Flower's Ray backend. history.json is rewritten after every
round and weights.pt written at the end, so `edgefl report` reads the folder as it reads an emulated run.
Same seed, same results as `edgefl emulate`: the same round loop samples, plans, slices and aggregates, and
each node trains with the emulated device's code, rows, seed and torch thread count.
"""
from __future__ import annotations

import json
import logging
from typing import Callable

from edgefl.errors import ConfigError
from edgefl.server.history import write_history

CLIENT_CPUS = 1          # Ray CPUs each simulated client reserves: the pool holds one actor per CPU
TIMEOUT_S = 3600.0       # a round's replies must arrive within this


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
    """A ServerApp running `run`'s rounds with EdgeflStrategy; `done(strategy)` when they are over."""
    from flwr.app import ArrayRecord
    from flwr.serverapp import ServerApp

    from edgefl.flower.strategy import EdgeflStrategy

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        strategy = EdgeflStrategy(run, on_round)
        try:
            strategy.start(grid, initial_arrays=ArrayRecord(), num_rounds=run.spec.rounds, timeout=TIMEOUT_S)
        finally:
            strategy.close()
        done(strategy)

    return app


def simulate(run, on_round: Callable = lambda record: None, verbose: bool = False,
             client_cpus: float = CLIENT_CPUS) -> list:
    """Run every round in Flower's simulation; history.json after each, weights.pt at the end."""
    from flwr.simulation import run_simulation

    from edgefl.flower.client import NodeData, client_app

    records: list = []
    finished: list = []
    spec = run.spec

    def done_round(record) -> None:
        records.append(record)
        write_history(records, spec.output / "history.json")
        on_round(record)

    devices = sum(len(g.device_ids) for g in run.fleet.groups)
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(server_app(run, done_round, finished.append), client_app(NodeData.of(spec)),
                   num_supernodes=devices,
                   backend_config={"client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0},
                                   "init_args": {"logging_level": "WARNING", "log_to_driver": verbose}})
    if not finished or finished[0].server is None:
        raise RuntimeError(f"the Flower simulation ended after {len(records)} of {spec.rounds} rounds")
    finished[0].server.save(spec.output / "weights.pt")
    return records


def flower(spec, on_round: Callable = lambda record: None, verbose: bool = False) -> tuple[object, list]:
    """(the planned run, its round records): plan, then simulate."""
    run = start(spec)
    return run, simulate(run, on_round, verbose)

