"""Planning strategies by method name. Importing this does not import torch."""
from __future__ import annotations

from edgefl.errors import ConfigError
from edgefl.strategies.base import PlanContext, Strategy, first_fit
from edgefl.strategies.caff import CAFF
from edgefl.strategies.depthfl import DepthFL
from edgefl.strategies.fedavg import ExclusiveFedAvg, FedAvg
from edgefl.strategies.fedepth import FeDepth
from edgefl.strategies.fedhm import FedHM
from edgefl.strategies.fedolf import FedOLF
from edgefl.strategies.lora import HeterogeneousLoRA
from edgefl.strategies.profl import ProFL
from edgefl.strategies.slt import SLT
from edgefl.strategies.small import SmallModel
from edgefl.strategies.width import FederatedDropout, FedRolex, FjORD, HeteroFL

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (
    SLT, CAFF, FedOLF, FeDepth, ProFL, FedAvg, ExclusiveFedAvg, SmallModel, FederatedDropout, FedRolex,
    HeteroFL, FjORD, DepthFL, HeterogeneousLoRA, FedHM)}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]()


__all__ = ["STRATEGIES", "PlanContext", "Strategy", "first_fit", "get_strategy"]
