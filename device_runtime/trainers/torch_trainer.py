"""The torch Trainer: one local training loop shared by every method (CPU or CUDA).

Frozen layers run in eval mode under no_grad and keep no activations; trained layers and the head train.
SGD with momentum and weight decay (or AdamW); the learning rate comes with each round's instruction
(the coordinator anneals it over rounds). What a method changes is the per-batch loss: an *objective*
(edgefl.device_runtime.trainers.objectives) chosen by the instruction's options: DepthFL's exits with
self-distillation, FjORD's ordered dropout, m-FeDepth's mutual learning; cross-entropy otherwise. Memory
measurement wraps the objective (edgefl.device_runtime.trainers.memory), never the loop. An instruction
with a sequence (FeDepth) runs the loop once per block, each block starting from the blocks before it as
trained. The model itself is built by functions handed in by whoever wires the device, so this module
needs only torch.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Optional

import numpy as np
import torch
from torch.nn import functional as F

from edgefl.device_runtime.trainers.memory import OutOfMemory, measured
from edgefl.device_runtime.trainers.objectives import Objective, objective_for
from edgefl.errors import ConfigError
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.trainconfig import TrainConfig, pass_batches


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch here; use --device cpu "
                          "or install a CUDA build of torch 2.13.0")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"--device: expected cpu or cuda, got {name!r}")
    return torch.device(name)


def from_wire(weights: Mapping[str, torch.Tensor], config: TrainConfig, heads: Mapping[str, str]) -> dict:
    """The device model's state out of wire tensors (global names): layers [0, end), and each head under
    its device prefix (`heads`: device prefix -> global prefix). Anything else is another block's."""
    out = {}
    for key, t in weights.items():
        if key.startswith("layers.") and int(key.split(".")[1]) < config.end:
            out[key] = t
        for local, wire in heads.items():
            if key.startswith(wire):
                out[local + key[len(wire):]] = t
    return out


def targets(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One target per logits row. A token model predicts the next token at every position, so a window x
    with one label y (the token after it, as next-character data sets give it) trains on x[1:] followed
    by y; any other model on y."""
    if not x.is_floating_point() and x.dim() == 2 and y.numel() == x.shape[0]:
        return torch.cat([x[:, 1:], y.reshape(-1, 1)], dim=1).reshape(-1)
    return y.reshape(-1)


def to_wire(name: str, heads: Mapping[str, str]) -> str:
    local = next((p for p in heads if name.startswith(p)), None)
    return name if local is None else heads[local] + name[len(local):]


class TorchTrainer:
    """build(config, widths) -> the device model (layers [0, end) at `widths`, config.widths when None, the
    auxiliary head as `aux`); narrow(config, p) -> (the same model at width p, per tensor the index of its
    entries in the config's tensors), for FjORD's ordered dropout."""

    def __init__(self, build: Callable[[TrainConfig, Optional[tuple]], torch.nn.Module], device: str = "cpu",
                 momentum: float = 0.9, weight_decay: float = 1e-5, narrow: Optional[Callable] = None):
        self.build, self.narrow = build, narrow
        self.device = resolve_device(device)
        self.momentum, self.weight_decay = momentum, weight_decay

    def load(self, config: TrainConfig, weights: Mapping[str, torch.Tensor], widths=None,
             objective: Optional[Objective] = None):
        """The device model for `config` with the objective's extra heads, loaded from wire tensors."""
        objective = objective or Objective({}, self, 0)
        model = self.build(config, tuple(widths) if widths else None)
        objective.attach(model, config)
        model.load_state_dict(from_wire(weights, config, objective.heads(config)), strict=True)
        return model.to(self.device)

    def logits(self, model, config: TrainConfig, x):
        with torch.no_grad():
            state = model(x, 0, config.frozen_prefix)
        state = model(state, config.frozen_prefix, config.end)
        out = model.aux(state) if config.aux_head is not None else state
        return out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out

    def trained_names(self, model, config: TrainConfig, heads: Iterable[str] = ("aux.",)) -> list[str]:
        """The tensors the device trains: layers [frozen_prefix, end) and every head (device prefixes), but
        those the model keeps frozen inside them (`frozen_tensors`: LoRA's base weights)."""
        trained = {f"layers.{i}." for i in config.trained_layers}
        frozen = getattr(model, "frozen_tensors", frozenset())
        return [n for n in model.state_dict()
                if n not in frozen and any(n.startswith(p) for p in (*heads, *trained))]

    def train(self, model, config: TrainConfig, x: np.ndarray, y: np.ndarray, lr: float, seed: int,
              objective: Optional[Objective] = None):
        objective = objective or Objective({}, self, seed)
        torch.manual_seed(seed)
        model.train()
        for i in range(config.frozen_prefix):
            model.layers[i].eval()
        trained = set(objective.trains(self.trained_names(model, config, objective.heads(config))))
        params = []
        for name, p in model.named_parameters():
            p.requires_grad_(name in trained)
            if name in trained:
                params.append(p)
        params += objective.prepare(model, config)
        opt = (torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)
               if config.optimizer == "sgd" else torch.optim.AdamW(params, lr=lr))
        rng = np.random.default_rng(seed)
        losses = []
        for _ in range(config.local_epochs):
            order = rng.permutation(len(x))
            for start in pass_batches(len(x), config.batch_size):
                idx = order[start:start + config.batch_size]
                xb = torch.as_tensor(x[idx], device=self.device)
                yb = targets(xb, torch.as_tensor(y[idx], device=self.device))
                loss = objective.loss(model, config, xb, yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        return losses

    def run(self, instruction: RoundInstruction, weights: dict, x: np.ndarray, y: np.ndarray,
            measure: Optional[Callable[[int], None]] = None) -> tuple[dict, list[float], dict]:
        """Train every config of the instruction in turn; returns (trained tensors by global name, losses,
        metrics). `measure(bytes)` is called with the activations kept by each block's first batch."""
        state, tensors, losses, metrics = dict(weights), {}, [], {}
        for j, config in enumerate(instruction.configs):
            objective = objective_for(dict(instruction.options), self, instruction.seed + j)
            if measure is not None:
                objective = measured(objective, measure)
            model = self.load(config, state, instruction.option("widths"), objective)
            heads = objective.heads(config)
            losses += self.train(model, config, x, y, instruction.lr, instruction.seed + j, objective)
            trained = model.state_dict()
            for name in objective.trains(self.trained_names(model, config, heads)):
                key = to_wire(name, heads)
                tensors[key] = state[key] = trained[name].detach().to("cpu")
            metrics.update(objective.metrics())
        return tensors, losses, metrics

    @torch.no_grad()
    def evaluate(self, model, config: TrainConfig, x: np.ndarray, y: np.ndarray, batch: int = 512) -> dict:
        """Loss and accuracy of `model` on (x, y), on this trainer's device: a model built elsewhere (a
        pretrained one, say) is moved there first."""
        model.to(self.device).eval()
        total, correct, loss = 0, 0, 0.0
        for start in range(0, len(x), batch):
            xb = torch.as_tensor(x[start:start + batch], device=self.device)
            yb = targets(xb, torch.as_tensor(y[start:start + batch], device=self.device))
            out = self.logits(model, config, xb)
            loss += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(-1) == yb).sum())
            total += yb.numel()
        return {"loss": loss / max(total, 1), "accuracy": correct / max(total, 1)}


class EmulatedDevice:
    """A device of the emulation: its local data, a trainer and (optionally) the memory it really has;
    answers instructions with reports. Asked to check memory, it measures what autograd keeps in its
    first batch and fails the round, as an out-of-memory kill would, when the predicted peak with the
    measured activations in place of the predicted ones exceeds its memory.

    With `rows`, `x` and `y` are the whole training set, shared by every device of the emulation, and the
    device's data is those rows, gathered only while it trains: a fleet then holds the data once instead
    of once more in copies."""

    def __init__(self, device_id: str, trainer: TorchTrainer, x: np.ndarray, y: np.ndarray,
                 memory_bytes: Optional[int] = None, rows: Optional[np.ndarray] = None):
        self.device_id, self.trainer, self.x, self.y, self.rows = device_id, trainer, x, y, rows
        self.memory_bytes = memory_bytes

    @property
    def examples(self) -> int:
        return len(self.x) if self.rows is None else len(self.rows)

    def handle(self, instruction: RoundInstruction, weights: dict) -> DeviceReport:
        t0 = time.perf_counter()
        check, kept = instruction.option("memory_check"), []

        def measure(nbytes: int) -> None:
            kept.append(nbytes)
            peak = check[0] - check[1] + nbytes
            if self.memory_bytes is not None and peak > self.memory_bytes:
                raise OutOfMemory(f"out of memory: predicted peak with the measured activations {peak} B "
                                  f"> the device's {self.memory_bytes} B")

        report = DeviceReport(round=instruction.round, device_id=self.device_id, config_hash=instruction.config_hash,
                              status="ok", download_bytes=sum(t.numel() * t.element_size() for t in weights.values()))
        x, y = (self.x, self.y) if self.rows is None else (self.x[self.rows], self.y[self.rows])
        try:
            tensors, losses, metrics = self.trainer.run(instruction, weights, x, y, measure if check else None)
        except OutOfMemory as exc:
            report.status, report.reason = ReportStatus.FAILED, str(exc)
        else:
            report.examples, report.tensors, report.metrics = self.examples, tensors, metrics
            report.loss_before, report.loss_after = (losses[0], losses[-1]) if losses else (None, None)
            report.upload_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        report.activation_bytes = max(kept) if kept else None
        report.wall_s = time.perf_counter() - t0
        return report
