"""Emulation: the coordinator's round loop with an in-memory transport and in-process torch devices.

It lives with the CLI because it wires the device room (the torch Trainer) into the core, which never
imports it.

Not a second system: the same Coordinator, Strategy and aggregation run as in deployment; only the
Transport and the devices differ. Each virtual device holds its share of the training data and is held
to its group's budgets: the coordinator refuses configs over budget, and with `settings.measure_memory`
the device measures what autograd really keeps in its first batch and fails the round, as an
out-of-memory kill would, when the predicted peak with the measured activations in place of the
predicted ones exceeds its memory (its group's budget unless `device_memory` says otherwise).
"""
from __future__ import annotations

import copy
from typing import Callable, Mapping, Optional, Union

import numpy as np
import torch

from edgefl.aggregate import RunningAggregate
from edgefl.coordinator import Coordinator, Delivery, LoopSettings, RoundRecord
from edgefl.data import Dataset
from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice, TorchTrainer
from edgefl.fleet import Fleet
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.plan import Plan
from edgefl.runstate import RunState
from edgefl.strategies.base import Strategy
from edgefl.submodel import (IndexSets, aggregate, device_model, embed, ensure_aux, entries, extract, index_sets,
                             nested_index)
from edgefl.toa import toa
from edgefl.trainconfig import TrainConfig
from edgefl.transport import Transport
from edgefl.transport.memory import InMemoryTransport
from edgefl.validate import check_tensors, clip_update, expected_of
from edgefl.zoo import ModelRef, build

# devices' examples the server runs through the global model for static BN statistics (HeteroFL): a seeded
# sample of the fleet's data; on HeteroFL/ResNet-20/Fashion-MNIST 512 and 2,048 gave accuracies within 0.1 point
STATIC_BN_EXAMPLES = 2048


class TorchServerModel:
    """The global model's state and what the round loop asks of it.

    An instruction moves the tensors of one or more *parts*, each a TrainConfig with its index sets: the
    blocks of a FeDepth sequence, or a DepthFL config plus one part per exit it holds (the exit head at b
    reads layers [0, b)). Weights travel under global names; a contribution embeds each part and merges
    them, and the loop folds it into the round's running aggregate as it arrives (`accumulator`,
    edgefl.aggregate). With `toa` = s, a single config with two or more frozen layers goes down with the
    frozen layers before the last one shrunk to TOA-sampled filters (FedOLF sec. 3.3); the device builds
    its model at the widths sent with it. `groups`: per fleet group, local examples to measure its accuracy on.
    `initial`: the global weights to start from (a pretrained model), else a seeded fresh model.
    `evaluated`: the config whose model is evaluated (Strategy.evaluated_config), else the whole model; a
    callable is asked at every evaluation (ProFL's judged model moves with its online step).
    `static_bn`: (examples, batch size): the evaluated model's BN statistics are estimated on those examples
    (Strategy.static_bn, HeteroFL's sBN) instead of taken from the aggregate.
    """
    streams = True      # both rules ('trained', 'sampled') are sums: they fold one contribution at a time

    def __init__(self, ref: ModelRef, test: Optional[Dataset], trainer: TorchTrainer, seed: int,
                 groups: Optional[Mapping[str, tuple[np.ndarray, np.ndarray]]] = None, toa: Optional[float] = None,
                 clip_norm: Optional[float] = None, initial: Optional[Mapping[str, torch.Tensor]] = None,
                 evaluated: Union[TrainConfig, Callable[[], Optional[TrainConfig]], None] = None,
                 static_bn: Optional[tuple[np.ndarray, int]] = None):
        torch.manual_seed(seed)
        self.ref, self.test, self.trainer, self.groups, self.toa = ref, test, trainer, dict(groups or {}), toa
        self.clip_norm, self.evaluated, self.static_bn = clip_norm, evaluated, static_bn
        self._estimated: Optional[tuple] = None     # (state, judged, model, config): one sBN estimate per state
        self.state = {k: v.detach().clone() for k, v in (initial or build(ref).state_dict()).items()}

    def snapshot(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state.items()}

    def restore(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.state = {k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}

    @staticmethod
    def parts(instruction: RoundInstruction) -> list[TrainConfig]:
        if instruction.sequence:
            return list(instruction.sequence)
        c = instruction.config
        exits = sorted(b for b in instruction.option("exits") or () if c.frozen_prefix < b < c.end)
        return [c] + [c.with_(trained_end=b, aux_head="linear", exits=()) for b in exits]

    def weights_for(self, instruction: RoundInstruction, device_seed: int) -> Delivery:
        parts = self.parts(instruction)
        self.state = ensure_aux(self.state, self.ref, parts)
        delivery = Delivery(weights={}, handle=[])
        for config in parts:
            indices = index_sets(self.ref, config, instruction.round, device_seed)
            if self.toa is not None and len(parts) == 1 and config.frozen_prefix >= 2:
                shrunk = toa(self.state, self.ref, config, indices, self.toa, seed=device_seed + instruction.round)
                if shrunk.reduced_layers:
                    indices, delivery.saved_bytes = shrunk.indices, shrunk.saved_bytes
                    delivery.options["widths"] = indices.widths
            sliced = extract(self.state, self.ref, config, indices)
            delivery.weights.update({e.key: sliced[e.device_key] for e in entries(self.ref, config)})
            delivery.handle.append((config, indices))
        trained = {e.key for config, _ in delivery.handle for e in entries(self.ref, config)
                   if e.layer >= config.frozen_prefix and not e.frozen}
        # what the device must upload, as sent: the report is checked against it before anything is placed
        delivery.handle = (delivery.handle, expected_of(delivery.weights, sorted(trained)))
        return delivery

    def contribution(self, report: DeviceReport, instruction: RoundInstruction, handle):
        parts, expected = handle
        check_tensors(report.device_id, report.tensors, expected)
        tensors = {k: torch.as_tensor(v) for k, v in report.tensors.items()}
        if self.clip_norm is not None:
            tensors, _ = clip_update(self._sent(parts), tensors, self.clip_norm)
        placed, mask = {}, {}
        for config, indices in parts:
            trained = [e for e in entries(self.ref, config) if e.layer >= config.frozen_prefix and not e.frozen]
            p, m = embed(self.state, {e.device_key: tensors[e.key] for e in trained}, self.ref, config, indices)
            placed.update(p)
            mask.update(m)
        return report.examples, placed, mask

    def _sent(self, parts) -> dict[str, torch.Tensor]:
        """The tensors as the device received them (its slices of the current global tensors)."""
        sent = {}
        for config, indices in parts:
            sliced = extract(self.state, self.ref, config, indices)
            sent.update({e.key: sliced[e.device_key] for e in entries(self.ref, config)})
        return sent

    def accumulator(self, mode: str) -> RunningAggregate:
        return RunningAggregate(self.state, mode)

    def apply(self, running: RunningAggregate) -> None:
        self.state = running.result()

    def aggregate(self, contributions: list, mode: str) -> None:
        """A round's contributions all at once: the same fold, in their order."""
        self.state = aggregate(self.state, contributions, mode)

    def global_model(self, judged: Optional[TrainConfig] = None) -> torch.nn.Module:
        """The model evaluated: `judged` (default: the evaluated config now), or the whole model."""
        config = judged if judged is not None else self._judged()
        if config is not None:
            indices = index_sets(self.ref, config)
            model = device_model(self.ref, config, indices)
            model.load_state_dict(extract(self.state, self.ref, config, indices), strict=True)
            return model
        model = build(self.ref)
        model.load_state_dict({k: v for k, v in self.state.items() if not k.startswith("aux.")}, strict=True)
        return model

    def _judged(self) -> Optional[TrainConfig]:
        """The evaluated config as a model of its own: its layers, and the exit it ends in when it stops
        short of the full depth (a depth-limited model is judged by its classifier there). None: the whole model."""
        config = self.evaluated() if callable(self.evaluated) else self.evaluated
        if config is None:
            return None
        return config.with_(aux_head=config.aux_head if config.end < config.num_layers else None, exits=())

    def _evaluate(self, x, y) -> dict:
        judged = self._judged()
        if self._estimated is not None and self._estimated[0] is self.state and self._estimated[1] == judged:
            model, config = self._estimated[2:]
        else:
            model = self.global_model(judged).to(self.trainer.device)
            config = TrainConfig(num_layers=len(model.layers), aux_head=judged.aux_head if judged is not None else None)
            if self.static_bn is not None:
                self._estimate_bn(model, config, *self.static_bn)
                if judged is None:      # the global state (weights.pt) holds the statistics it is evaluated with
                    buffers = {k: v.detach().cpu() for k, v in model.state_dict().items() if k in self.state}
                    self.state = {k: buffers[k] if "running_" in k else v for k, v in self.state.items()}
                self._estimated = (self.state, judged, model, config)
        return self.trainer.evaluate(model, config, x, y)

    def _estimate_bn(self, model: torch.nn.Module, config: TrainConfig, x: np.ndarray, batch: int) -> None:
        """HeteroFL's static batch normalisation (sec. 3.2): the devices' running statistics, gathered by
        models of different widths, are not averaged into the global model's; its statistics are the
        cumulative mean over batches of the devices' data run through the global model, as the server gets
        them by querying devices after training."""
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None                       # a cumulative mean, not an exponential one
        model.train()
        with torch.no_grad():
            for start in range(0, len(x), batch):
                self.trainer.logits(model, config, torch.as_tensor(x[start:start + batch], device=self.trainer.device))
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum

    def evaluate(self) -> dict:
        return {} if self.test is None else self._evaluate(self.test.x, self.test.y)

    def evaluate_groups(self) -> dict[str, float]:
        """Accuracy of the global (full) model on a seeded sample of each group's local training data: how
        well the shared model serves each group's data distribution, not held-out generalisation."""
        return {g: self._evaluate(x, y)["accuracy"] for g, (x, y) in self.groups.items()}


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
    `transport(make_device)`: where the devices run (default: in this process; edgefl.cli.ray_engine: Ray actors)."""
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
        rows = np.concatenate([share_of[d] for d in devices])
        rows = np.sort(np.random.default_rng(settings.seed).choice(rows, min(STATIC_BN_EXAMPLES, len(rows)),
                                                                   replace=False))
        static_bn = (train.x[rows], plan.batch_size)
    server = TorchServerModel(ref, test, trainer, settings.seed, groups=groups, toa=toa, clip_norm=clip_norm,
                              initial=initial_state, evaluated=lambda: strategy.evaluated_config(plan),
                              static_bn=static_bn)
    coordinator = Coordinator(fleet, plan, strategy, server, transport(make_device), settings,
                              examples=lambda d: len(share_of[d]), on_round=on_round, state=state)
    return coordinator.run(), server
