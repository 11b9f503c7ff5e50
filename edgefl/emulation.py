"""Emulation: the coordinator's round loop with an in-memory transport and in-process torch devices.

Not a second system: the same Coordinator, Strategy and aggregation run as in deployment; only the
Transport and the devices differ. Each virtual device holds its share of the training data and is held
to its group's budgets: the coordinator refuses configs over budget, and with `measure_memory` the
device measures what autograd really keeps and fails the round, as an out-of-memory kill would, when the
predicted peak with the measured activations exceeds its memory budget.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from edgefl.coordinator import Coordinator, LoopSettings, RoundRecord
from edgefl.data import Dataset
from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice, TorchTrainer
from edgefl.fleet import Fleet
from edgefl.messages import DeviceReport
from edgefl.plan import Plan
from edgefl.strategies.base import Strategy
from edgefl.submodel import aggregate, device_model, embed, ensure_aux, extract, index_sets
from edgefl.trainconfig import TrainConfig
from edgefl.transport.memory import InMemoryTransport
from edgefl.zoo import ModelRef, build


class TorchServerModel:
    """The global model's state and what the round loop asks of it."""

    def __init__(self, ref: ModelRef, test: Optional[Dataset], trainer: TorchTrainer, seed: int):
        torch.manual_seed(seed)
        self.ref, self.test, self.trainer = ref, test, trainer
        self.state = {k: v.detach().clone() for k, v in build(ref).state_dict().items()}

    def weights_for(self, config: TrainConfig, round: int, device_seed: int):
        indices = index_sets(self.ref, config, round, device_seed)
        self.state = ensure_aux(self.state, self.ref, [config])
        return extract(self.state, self.ref, config, indices), indices

    def contribution(self, report: DeviceReport, config: TrainConfig, indices):
        placed, mask = embed(self.state, report.tensors, self.ref, config, indices)
        return report.examples, placed, mask

    def aggregate(self, contributions: list, mode: str) -> None:
        self.state = aggregate(self.state, contributions, mode)

    def global_model(self) -> torch.nn.Module:
        model = build(self.ref)
        model.load_state_dict({k: v for k, v in self.state.items() if not k.startswith("aux.")}, strict=True)
        return model

    def evaluate(self) -> dict:
        if self.test is None:
            return {}
        model = self.global_model().to(self.trainer.device)
        full = TrainConfig(num_layers=len(model.layers))
        return self.trainer.evaluate(model, full, self.test.x, self.test.y)


def emulate(fleet: Fleet, plan: Plan, strategy: Strategy, ref: ModelRef, train: Dataset, test: Optional[Dataset],
            shares: list[np.ndarray], settings: LoopSettings, device: str = "cpu",
            on_round: Optional[Callable[[RoundRecord], None]] = None) -> tuple[list[RoundRecord], TorchServerModel]:
    """Run `settings.rounds` rounds. `shares[i]` are the training-example indices of the i-th device in
    sorted device order."""
    devices = sorted(d for g in fleet.groups for d in g.device_ids)
    if len(shares) != len(devices):
        raise ValueError(f"{len(shares)} data shares for {len(devices)} devices")
    share_of = dict(zip(devices, shares, strict=True))
    trainer = TorchTrainer(lambda config: device_model(ref, config, index_sets(ref, config)), device=device)

    def make_device(device_id: str) -> EmulatedDevice:
        idx = share_of[device_id]
        return EmulatedDevice(device_id, trainer, train.x[idx], train.y[idx])

    server = TorchServerModel(ref, test, trainer, settings.seed)
    coordinator = Coordinator(fleet, plan, strategy, server, InMemoryTransport(make_device), settings,
                              examples=lambda d: len(share_of[d]), on_round=on_round)
    return coordinator.run(), server
