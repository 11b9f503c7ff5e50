"""The global model of a run in torch: the round loop's `ServerModel` (edgefl.server.coordinator).

It holds the global weights and does the loop's tensor work with the only code that slices or places
tensors (edgefl.server.submodel): per instruction, each device's slice of the weights (FedOLF's TOA-shrunk
prefix where asked); per report, its update checked and placed, folded into the round's running aggregate
(edgefl.server.aggregate); evaluation of the judged model, with HeteroFL's static BN where the strategy asks.
Evaluation runs through a trainer (`TorchTrainer.evaluate`/`logits`), so the server and the devices score a
model with the same code.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Protocol, Union, cast

import numpy as np
import torch

from edgefl.data import Dataset
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.outdir import write_atomic
from edgefl.server.aggregate import RunningAggregate
from edgefl.server.coordinator import Delivery
from edgefl.server.submodel import (IndexSets, Mode, aggregate, device_model, embed, ensure_aux, entries, extract,
                                    index_sets)
from edgefl.server.toa import toa
from edgefl.server.validate import check_tensors, clip_update, expected_of
from edgefl.trainconfig import TrainConfig, output_layer, pass_batches
from edgefl.zoo import ModelRef, build


class Evaluator(Protocol):
    """What the global model is scored with: a trainer's evaluation loop (TorchTrainer's)."""
    device: torch.device
    def evaluate(self, model: torch.nn.Module, config: TrainConfig, x: np.ndarray, y: np.ndarray) -> dict: ...
    def logits(self, model: torch.nn.Module, config: TrainConfig, x: torch.Tensor) -> torch.Tensor: ...


class TorchServerModel:
    """The global model's state and what the round loop asks of it.

    An instruction moves the tensors of one or more *parts*, each a TrainConfig with its index sets: the
    blocks of a FeDepth sequence, or a DepthFL config plus one part per exit it holds (the exit head at b
    reads layers [0, b)). Weights travel under global names; a contribution embeds each part and merges
    them, and the loop folds it into the round's running aggregate as it arrives (`accumulator`,
    edgefl.server.aggregate). With `toa` = s, a single config with two or more frozen layers goes down with the
    frozen layers before the last one shrunk to TOA-sampled filters (FedOLF sec. 3.3); the device builds
    its model at the widths sent with it. `groups`: per fleet group, local examples to measure its accuracy on.
    `initial`: the global weights to start from (a pretrained model), else a seeded fresh model.
    `evaluated`: the config whose model is evaluated (Strategy.evaluated_config), else the whole model; a
    callable is asked at every evaluation (ProFL's judged model moves with its online step).
    `static_bn`: (examples, batch size): the evaluated model's BN statistics are estimated on those examples
    (Strategy.static_bn, HeteroFL's sBN) instead of taken from the aggregate.
    """
    streams = True      # both rules ('trained', 'sampled') are sums: they fold one contribution at a time

    def __init__(self, ref: ModelRef, test: Optional[Dataset], trainer: Evaluator, seed: int,
                 groups: Optional[Mapping[str, tuple[np.ndarray, np.ndarray]]] = None, toa: Optional[float] = None,
                 clip_norm: Optional[float] = None, initial: Optional[Mapping[str, torch.Tensor]] = None,
                 evaluated: Union[TrainConfig, Callable[[], Optional[TrainConfig]], None] = None,
                 static_bn: Optional[tuple[np.ndarray, int]] = None):
        torch.manual_seed(seed)
        self.ref, self.test, self.trainer, self.groups, self.toa = ref, test, trainer, dict(groups or {}), toa
        self.clip_norm, self.evaluated, self.static_bn, self.seed = clip_norm, evaluated, static_bn, seed
        self._estimated: Optional[tuple] = None     # (state, judged, model, config): one sBN estimate per state
        self.state = {k: v.detach().clone() for k, v in (initial or build(ref).state_dict()).items()}

    def save(self, path) -> None:
        """The global weights as a torch state dict file (a run folder's weights.pt), written whole."""
        write_atomic(path, lambda tmp: torch.save(self.state, tmp))

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
        delivery = Delivery(weights={})
        handled: list[tuple[TrainConfig, IndexSets]] = []
        for config in parts:
            indices = index_sets(self.ref, config, instruction.round, device_seed)
            if self.toa is not None and len(parts) == 1 and config.frozen_prefix >= 2:
                shrunk = toa(self.state, self.ref, config, indices, self.toa, seed=device_seed + instruction.round)
                if shrunk.reduced_layers:
                    indices, delivery.saved_bytes = shrunk.indices, shrunk.saved_bytes
                    delivery.options["widths"] = indices.widths
            sliced = extract(self.state, self.ref, config, indices)
            delivery.weights.update({e.key: sliced[e.device_key] for e in entries(self.ref, config)})
            handled.append((config, indices))
        trained = {e.key for config, _ in handled for e in entries(self.ref, config)
                   if e.layer >= config.frozen_prefix and not e.frozen}
        if instruction.option("output_layer_only"):     # ProFL's devices that afford no block (sec. 4.1)
            trained = set(output_layer(trained, instruction.config.aux_prefix))
        # what the device must upload, as sent: the report is checked against it before anything is placed
        delivery.handle = (handled, expected_of(delivery.weights, sorted(trained)))
        return delivery

    def contribution(self, report: DeviceReport, instruction: RoundInstruction, handle):
        parts, expected = handle
        check_tensors(report.device_id, report.tensors, expected)
        tensors = {k: torch.as_tensor(v) for k, v in report.tensors.items()}
        if self.clip_norm is not None:
            tensors, _ = clip_update(self._sent(parts), tensors, self.clip_norm)
        placed, mask = {}, {}
        for config, indices in parts:
            trained = [e for e in entries(self.ref, config)
                       if e.layer >= config.frozen_prefix and not e.frozen and e.key in expected]
            p, m = embed(self.state, {e.device_key: tensors[e.key] for e in trained}, self.ref, config, indices,
                         only=expected)
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
        self.state = aggregate(self.state, contributions, cast(Mode, mode))

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
            config = TrainConfig(num_layers=len(cast(torch.nn.ModuleList, model.layers)), aux_head=judged.aux_head if judged is not None else None)
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
            for start in pass_batches(len(x), batch):     # as the devices batch: never one example
                self.trainer.logits(model, config, torch.as_tensor(x[start:start + batch], device=self.trainer.device))
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum

    def evaluate(self) -> dict:
        return {} if self.test is None else self._evaluate(self.test.x, self.test.y)

    def edit(self, change) -> dict:
        """A change of the global state a strategy asks for between rounds (ProFL's output modules,
        edgefl.server.output_modules), made on the devices' data this server holds; what was done."""
        from edgefl.server.output_modules import compose

        x = np.concatenate([x for x, _ in self.groups.values()]) if self.groups else None
        self.state, done = compose(self.state, self.ref, change, x, self.seed)
        return done

    def evaluate_groups(self) -> dict[str, float]:
        """Accuracy of the global (full) model on a seeded sample of each group's local training data: how
        well the shared model serves each group's data distribution, not held-out generalisation."""
        return {g: self._evaluate(x, y)["accuracy"] for g, (x, y) in self.groups.items()}
