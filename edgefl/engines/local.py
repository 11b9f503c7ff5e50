"""The local engine: the coordinator's round loop with an in-memory transport and in-process torch devices.

Not a second system: the same Coordinator, Strategy and aggregation run as in deployment; only the
Transport and the devices differ. Each virtual device holds its share of the training data and is held
to its group's budgets: the coordinator refuses configs over budget, and with `settings.measure_memory`
the device measures what autograd really keeps in its first batch and fails the round, as an
out-of-memory kill would, when the predicted peak with the measured activations in place of the
predicted ones exceeds its memory (its group's budget unless `device_memory` says otherwise).
"""
from __future__ import annotations

import copy
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from edgefl.data import Dataset
from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice, TorchTrainer
from edgefl.fleet import Fleet
from edgefl.planning.plan import Plan
from edgefl.planning.strategies.base import Strategy
from edgefl.server.coordinator import Coordinator, LoopSettings
from edgefl.server.global_model import TorchServerModel
from edgefl.server.history import RoundRecord
from edgefl.server.runstate import RunState
from edgefl.server.submodel import IndexSets, device_model, nested_index
from edgefl.trainconfig import TrainConfig
from edgefl.transport import Transport
from edgefl.transport.memory import InMemoryTransport
from edgefl.zoo import ModelRef

# devices' examples the server runs through the global model for static BN statistics (HeteroFL): a seeded
# sample of the fleet's data; on HeteroFL/ResNet-20/Fashion-MNIST 512 and 2,048 gave accuracies within 0.1 point
STATIC_BN_EXAMPLES = 2048


def static_bn_rows(shares: list[np.ndarray], seed: int) -> np.ndarray:
    """The training rows the server runs through the global model for static BN statistics: a seeded sample
    of the fleet's data (`shares` in sorted device order)."""
    rows = np.concatenate(shares)
    return np.sort(np.random.default_rng(seed).choice(rows, min(STATIC_BN_EXAMPLES, len(rows)), replace=False))


def group_samples(fleet: Fleet, share_of: Mapping[str, np.ndarray], train: Dataset, limit: int,
                  seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Up to `limit` examples per group, drawn (seeded) from the union of its devices' shares."""
    out = {}
    for g in fleet.groups:
        idx = np.concatenate([share_of[d] for d in g.device_ids])
        if len(idx) > limit:
            idx = np.sort(np.random.default_rng(seed).choice(idx, limit, replace=False))
        if len(idx):
            out[g.name] = (train.x[idx], train.y[idx])
    return out


def torch_trainer(ref: ModelRef, device: str = "cpu", **kwargs) -> TorchTrainer:
    """The torch Trainer wired to the zoo: device models at any widths, and FjORD's nested submodels.
    Each distinct (config, widths) is built once and copied after: the trainer loads every tensor of the
    model from the wire (strict), so a copy serves as well as a fresh build and skips the random
    initialisation, which cost more than a small client's training step."""
    built: dict = {}

    def build_device(config: TrainConfig, widths=None):
        key = (config, tuple(widths or config.widths))
        if key not in built:
            built[key] = device_model(ref, config, IndexSets(key[1], {}))
        return copy.deepcopy(built[key])

    def narrow(config: TrainConfig, p: float):
        inner = config.with_(head_width=p)
        return build_device(inner), nested_index(ref, config, inner)

    return TorchTrainer(build_device, device=device, narrow=narrow, **kwargs)


def emulate(fleet: Fleet, plan: Plan, strategy: Strategy, ref: ModelRef, train: Dataset, test: Optional[Dataset],
            shares: list[np.ndarray], settings: LoopSettings, device: str = "cpu",
            on_round: Optional[Callable[[RoundRecord], None]] = None, *, toa: Optional[float] = None,
            device_memory: Optional[Mapping[str, int]] = None, group_eval_examples: int = 256,
            state: Optional[RunState] = None, clip_norm: Optional[float] = None,
            initial_state: Optional[Mapping[str, torch.Tensor]] = None,
            transport: Callable[[Callable[[str], EmulatedDevice]], Transport] = InMemoryTransport,
            ) -> tuple[list[RoundRecord], TorchServerModel]:
    """Run `settings.rounds` rounds. `shares[i]` are the training-example indices of the i-th device in
    sorted device order. `toa`: FedOLF TOA scale for frozen-prefix downloads. `device_memory`: the memory
    a device really has where it differs from its group's budget (what `settings.measure_memory` checks
    against). `group_eval_examples`: per group, local examples the per-group accuracy is measured on.
    `state`: checkpoint every round there and resume from it. `clip_norm`: bound each update's L2 norm.
    `initial_state`: the global weights to start from (a pretrained model), else a seeded fresh one.
    `transport(make_device)`: where the devices run (default: in this process; edgefl.engines.ray: Ray actors)."""
    devices = sorted(d for g in fleet.groups for d in g.device_ids)
    if len(shares) != len(devices):
        raise ValueError(f"{len(shares)} data shares for {len(devices)} devices")
    share_of = dict(zip(devices, shares, strict=True))
    budget = {d: g.memory_budget_bytes for g in fleet.groups for d in g.device_ids} | dict(device_memory or {})

    trainer = torch_trainer(ref, device)

    def make_device(device_id: str) -> EmulatedDevice:
        return EmulatedDevice(device_id, trainer, train.x, train.y, memory_bytes=budget[device_id],
                              rows=share_of[device_id])

    groups = group_samples(fleet, share_of, train, group_eval_examples, settings.seed)
    static_bn = None
    if strategy.static_bn:
        static_bn = (train.x[static_bn_rows([share_of[d] for d in devices], settings.seed)], plan.batch_size)
    server = TorchServerModel(ref, test, trainer, settings.seed, groups=groups, toa=toa, clip_norm=clip_norm,
                              initial=initial_state, evaluated=lambda: strategy.evaluated_config(plan),
                              static_bn=static_bn)
    coordinator = Coordinator(fleet, plan, strategy, server, transport(make_device), settings,
                              examples=lambda d: len(share_of[d]), on_round=on_round, state=state)
    return coordinator.run(), server
