"""The model, data and local training every FedAvg system of the benchmark shares (torch + numpy only).

The local loop does what edgefl's torch Trainer does for FedAvg, step for step: seed torch and a numpy
generator with the round's device seed, shuffle with that generator, SGD with momentum 0.9 and weight
decay 1e-5 at the round's learning rate, cross-entropy, one loss read back per batch. With the same
initial weights, partitions, learning rates and seeds, the systems then train the same models (up to the
order of floating-point sums), so their accuracies are comparable to the last digit.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def cnn(classes: int = 10) -> nn.Module:
    """The 2-conv CNN (conv5x5-32, pool, conv5x5-64, pool, fc-512, fc-classes) on 1x28x28 inputs; its
    parameters come in the same order as edgefl's zoo `cnn`."""
    return nn.Sequential(nn.Conv2d(1, 32, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, classes))


def images(raw: np.ndarray) -> np.ndarray:
    """uint8 (N, 1, 28, 28) -> float32 in [0, 1], computed as edgefl's IDX loader does."""
    return raw.astype(np.float32) / np.float32(255)


@lru_cache(maxsize=2)
def load(path: str) -> dict:
    """The bench's data file: training images and labels, per-client index arrays, the test set. Cached
    per process, as a Flower client keeps its data set between calls."""
    with np.load(path) as f:
        cuts = f["partition_offsets"]
        flat = f["partition_indices"]
        return {"x": images(f["x_train"]), "y": f["y_train"].astype(np.int64),
                "partitions": [flat[a:b] for a, b in zip(cuts[:-1], cuts[1:])],
                "x_test": images(f["x_test"]), "y_test": f["y_test"].astype(np.int64)}


def partition(path: str, client: int) -> tuple[np.ndarray, np.ndarray]:
    data = load(path)
    idx = data["partitions"][client]
    return data["x"][idx], data["y"][idx]


def initial_state(path: str, model: nn.Module) -> dict:
    """The initial weights (arrays in state_dict order) under `model`'s own names."""
    with np.load(path) as f:
        arrays = [f[f"arr_{i}"] for i in range(len(f.files))]
    names = list(model.state_dict())
    if len(names) != len(arrays):
        raise ValueError(f"{path}: {len(arrays)} arrays for a model with {len(names)} tensors")
    return {n: torch.from_numpy(a.copy()) for n, a in zip(names, arrays)}


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, lr: float, seed: int, epochs: int = 1,
          batch_size: int = 32, momentum: float = 0.9, weight_decay: float = 1e-5) -> list[float]:
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(model(torch.as_tensor(x[idx])), torch.as_tensor(y[idx]).reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 512) -> dict:
    model.eval()
    correct, loss = 0, 0.0
    for start in range(0, len(x), batch):
        xb, yb = torch.as_tensor(x[start:start + batch]), torch.as_tensor(y[start:start + batch])
        out = model(xb)
        loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(-1) == yb).sum())
    return {"accuracy": correct / max(len(y), 1), "loss": loss / max(len(y), 1)}
