"""Planning strategies by method name. Importing this does not import torch."""
from __future__ import annotations

from edgefl.errors import ConfigError
from edgefl.planning.strategies.base import PlanContext, Strategy, first_fit
from edgefl.planning.strategies.caff import CAFF
from edgefl.planning.strategies.depthfl import DepthFL
from edgefl.planning.strategies.fedavg import ExclusiveFedAvg, FedAvg
from edgefl.planning.strategies.fedepth import FeDepth
from edgefl.planning.strategies.fedhm import FedHM
from edgefl.planning.strategies.fedolf import FedOLF
from edgefl.planning.strategies.lora import HeterogeneousLoRA
from edgefl.planning.strategies.profl import ProFL
from edgefl.planning.strategies.slt import SLT
from edgefl.planning.strategies.small import SmallModel
from edgefl.planning.strategies.width import FederatedDropout, FedRolex, FjORD, HeteroFL

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (
    SLT, CAFF, FedOLF, FeDepth, ProFL, FedAvg, ExclusiveFedAvg, SmallModel, FederatedDropout, FedRolex,
    HeteroFL, FjORD, DepthFL, HeterogeneousLoRA, FedHM)}


def method_names() -> list[str]:
    return list(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]()


__all__ = ["STRATEGIES", "PlanContext", "Strategy", "first_fit", "get_strategy", "method_names"]
