"""A Flower App's run config (`[tool.flwr.app.config]`, `flwr run -c`) as an edgefl emulation.

The keys are `edgefl emulate`'s options, dashed as Flower writes them: devices, model, dataset, method,
num-server-rounds, clients-per-round, partition, seed, batch-size, local-epochs, lr, train-limit, test-limit,
measure-memory, output. A relative `devices` is read from the app's folder, a relative `output` from the
working folder. A limit of 0 means none.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

KEYS = {"devices", "model", "dataset", "method", "num-server-rounds", "clients-per-round", "partition", "seed",
        "batch-size", "local-epochs", "lr", "train-limit", "test-limit", "measure-memory", "output"}


def emulation(config, root: Optional[Path] = None):
    """The Emulation (edgefl.engines.emulation) a run config describes; a relative `devices` is read from `root`
    (None: the working folder)."""
    from edgefl.engines.emulation import Emulation
    from edgefl.errors import ConfigError

    unknown = sorted(set(config) - KEYS)
    if unknown:
        raise ConfigError(f"[tool.flwr.app.config]: unknown key {unknown[0]!r}; edgefl reads {sorted(KEYS)}")
    limit = lambda key: int(config[key]) or None if key in config else None
    devices = Path(config["devices"])
    if root is not None and not devices.is_absolute():
        devices = root / devices
    return Emulation(devices=devices, model=str(config["model"]), dataset=str(config["dataset"]),
                     method=str(config["method"]), rounds=int(config.get("num-server-rounds", 3)),
                     output=Path(config.get("output", "runs/flower")), force=True,
                     clients_per_round=int(config.get("clients-per-round", 10)),
                     partition=str(config.get("partition", "iid")), seed=int(config.get("seed", 0)),
                     batch_size=int(config.get("batch-size", 32)), local_epochs=int(config.get("local-epochs", 1)),
                     lr=float(config.get("lr", 0.05)), train_limit=limit("train-limit"),
                     test_limit=limit("test-limit"), measure_memory=bool(config.get("measure-memory", False)))
