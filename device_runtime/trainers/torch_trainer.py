"""The torch Trainer: one local training loop shared by every method (CPU or CUDA).

Frozen layers run in eval mode under no_grad and keep no activations; trained layers and the head train.
SGD with momentum and weight decay (or AdamW); the learning rate comes with each round's instruction
(the coordinator anneals it over rounds). The model itself is built by a function handed in by whoever
wires the device, so this module needs only torch.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

from edgefl.errors import ConfigError
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.trainconfig import TrainConfig


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch here; use --device cpu "
                          "or install a CUDA build of torch 2.13.0")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"--device: expected cpu or cuda, got {name!r}")
    return torch.device(name)


class TorchTrainer:
    def __init__(self, build: Callable[[TrainConfig], torch.nn.Module], device: str = "cpu",
                 momentum: float = 0.9, weight_decay: float = 1e-5):
        self.build = build
        self.device = resolve_device(device)
        self.momentum, self.weight_decay = momentum, weight_decay

    def load(self, config: TrainConfig, weights: dict) -> torch.nn.Module:
        model = self.build(config)
        model.load_state_dict(weights, strict=True)
        return model.to(self.device)

    def logits(self, model, config: TrainConfig, x):
        with torch.no_grad():
            state = model(x, 0, config.frozen_prefix)
        state = model(state, config.frozen_prefix, config.end)
        out = model.aux(state) if config.aux_head is not None else state
        return out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out

    def trained_names(self, model, config: TrainConfig) -> list[str]:
        trained = {f"layers.{i}." for i in config.trained_layers}
        return [n for n in model.state_dict() if n.startswith("aux.") or any(n.startswith(p) for p in trained)]

    def train(self, model, config: TrainConfig, x: np.ndarray, y: np.ndarray, lr: float, seed: int):
        torch.manual_seed(seed)
        model.train()
        for i in range(config.frozen_prefix):
            model.layers[i].eval()
        trained = set(self.trained_names(model, config))
        params = []
        for name, p in model.named_parameters():
            p.requires_grad_(name in trained)
            if name in trained:
                params.append(p)
        opt = (torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)
               if config.optimizer == "sgd" else torch.optim.AdamW(params, lr=lr))
        rng = np.random.default_rng(seed)
        losses = []
        for _ in range(config.local_epochs):
            order = rng.permutation(len(x))
            for start in range(0, len(x), config.batch_size):
                idx = order[start:start + config.batch_size]
                xb = torch.as_tensor(x[idx], device=self.device)
                yb = torch.as_tensor(y[idx], device=self.device).reshape(-1)
                loss = F.cross_entropy(self.logits(model, config, xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        return losses

    @torch.no_grad()
    def evaluate(self, model, config: TrainConfig, x: np.ndarray, y: np.ndarray, batch: int = 512) -> dict:
        model.eval()
        total, correct, loss = 0, 0, 0.0
        for start in range(0, len(x), batch):
            xb = torch.as_tensor(x[start:start + batch], device=self.device)
            yb = torch.as_tensor(y[start:start + batch], device=self.device).reshape(-1)
            out = self.logits(model, config, xb)
            loss += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(-1) == yb).sum())
            total += yb.numel()
        return {"loss": loss / max(total, 1), "accuracy": correct / max(total, 1)}


class EmulatedDevice:
    """A device of the emulation: its local data and a trainer; answers instructions with reports."""

    def __init__(self, device_id: str, trainer: TorchTrainer, x: np.ndarray, y: np.ndarray):
        self.device_id, self.trainer, self.x, self.y = device_id, trainer, x, y

    def handle(self, instruction: RoundInstruction, weights: dict) -> DeviceReport:
        t0 = time.perf_counter()
        config = instruction.config
        model = self.trainer.load(config, weights)
        losses = self.trainer.train(model, config, self.x, self.y, instruction.lr, instruction.seed)
        names = self.trainer.trained_names(model, config)
        state = model.state_dict()
        tensors = {n: state[n].detach().to("cpu") for n in names}
        return DeviceReport(
            round=instruction.round, device_id=self.device_id, config_hash=instruction.config_hash, status="ok",
            examples=len(self.x), loss_before=losses[0] if losses else None, loss_after=losses[-1] if losses else None,
            tensors=tensors, wall_s=time.perf_counter() - t0,
            upload_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
            download_bytes=sum(t.numel() * t.element_size() for t in weights.values()))
