"""edgefl: federated learning that keeps memory-starved devices in.

The names below are what users import (`from edgefl import plan_fleet, load_fleet, ModelRef`); each room's
own `__init__` names its public API the same way. They are loaded on first use, so `import edgefl` costs a
device agent nothing and never imports torch.

Where things are: the shared vocabulary at this level (units, errors, fleet spec, TrainConfig, messages,
manifest, MQTT topics, credentials, output folders); rooms by job below it: `zoo` and `data`, `cost` (the
cost model), `planning` (Plan and one strategy per method), `server` (the round loop and its tensor work),
`transport` and `protocol` (the coordinator's end of the device protocol and what both ends share), `engines`
(where a run's devices live: local, Ray, deployed), `report`, and `cli` (parse, call one room, print).
`edgefl.export`, `edgefl.device_runtime`, `edgefl.broker` and `edgefl.hardware` are the repository's
top-level folders.
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional


def lazy_exports(package: str, where: dict[str, str], own: dict) -> tuple[Callable, Callable]:
    """A package's `__getattr__` and `__dir__` that import each public name's module (`where[name]`, relative
    to `package`) on first use, so a package's public API costs nothing until used. `own`: the package's
    globals(). A public name never repeats a subpackage's name: importing the subpackage would shadow it."""
    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name], package), name)

    def __dir__() -> list[str]:
        return sorted(set(where) | set(own))

    return __getattr__, __dir__


def version() -> Optional[str]:
    """The installed edgefl distribution's version (pyproject.toml's, the one source of it); None when this
    source tree runs without being installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("edgefl")
    except PackageNotFoundError:
        return None


_WHERE = {
    # errors
    "EdgeflError": ".errors", "ConfigError": ".errors", "InfeasiblePlanError": ".errors", "ArtifactError": ".errors",
    "TransportError": ".errors", "ReportRejected": ".errors", "MissingDependencyError": ".errors",
    # the vocabulary
    "Fleet": ".fleet", "Group": ".fleet", "load_fleet": ".fleet", "parse_fleet": ".fleet",
    "TrainConfig": ".trainconfig", "RoundInstruction": ".messages", "DeviceReport": ".messages",
    "ReportStatus": ".messages", "Manifest": ".manifest", "ArtifactSet": ".manifest",
    "parse_bytes": ".units", "format_bytes": ".units",
    # models and data
    "ModelRef": ".zoo", "build": ".zoo", "model_names": ".zoo", "Dataset": ".data", "load_dataset": ".data",
    # the cost model
    "Cost": ".cost", "ModelProfile": ".cost", "ProfileStore": ".cost", "load_calibration": ".cost",
    # planning
    "Plan": ".planning", "verify": ".planning", "get_strategy": ".planning", "strategy_for": ".planning",
    "plan_fleet": ".planning", "method_names": ".planning",
    # the round loop and where devices live
    "Coordinator": ".server", "LoopSettings": ".server", "RoundRecord": ".server", "Emulation": ".engines",
}
__all__ = sorted(_WHERE) + ["lazy_exports", "version"]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
