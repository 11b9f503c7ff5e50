"""The torch side of the zoo: `LayeredModel` and helpers shared by the architectures.

Every architecture is a `LayeredModel`: `layers[i]` maps state i to state i+1, where state 0 is the
input batch and the last state is the logits. A *boundary* b is the state between layers b-1 and b;
auxiliary heads (ProFL output modules, FeDepth skip classifiers, DepthFL exits) attach at boundaries
listed in `cut_points`, where the state is a single tensor. Builders tag the channel spaces each tensor
indexes (edgefl.zoo.spaces); `channel_dims()` reports them.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import nn

from edgefl.zoo.spaces import Dim, tag, tensor_dims


def scaled(channels: int, width: float) -> int:
    """floor(s * M), at least 1 (SLT sec. 3: w in R^{floor(sP) x floor(sM)})."""
    return max(1, math.floor(channels * width + 1e-9))


def full_widths(widths: Sequence[float] | None, num_layers: int) -> list[float]:
    if widths is None:
        return [1.0] * num_layers
    widths = [float(w) for w in widths]
    if len(widths) != num_layers:
        raise ValueError(f"widths has {len(widths)} entries but the model has {num_layers} layers")
    if any(not 0 < w <= 1 for w in widths):
        raise ValueError("every width must be in (0, 1]")
    return widths


class LayeredModel(nn.Module):
    def __init__(self, layers: Sequence[nn.Module], *, input_shape: Sequence[int], num_classes: int,
                 cut_points: Sequence[int], stages: Sequence[int],
                 aux_factory: Callable[[int, str], nn.Module], input_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.input_shape = tuple(input_shape)          # per sample
        self.input_dtype = input_dtype
        self.num_classes = num_classes
        self.cut_points = tuple(cut_points)            # boundaries where an auxiliary head may attach
        self.stages = tuple(stages)                    # boundaries ending each architectural stage
        self._aux_factory = aux_factory

    def forward(self, x, start: int = 0, end: int | None = None):
        for layer in self.layers[start:end]:
            x = layer(x)
        return x

    def aux_head(self, boundary: int, kind: str = "linear") -> nn.Module:
        """A fresh classifier reading the state at `boundary`. kind: 'linear' (pool + linear) or
        'conv' (ProFL output module: one conv per remaining stage, then pool + linear)."""
        if boundary not in self.cut_points:
            raise ValueError(f"no auxiliary head can attach at boundary {boundary}; cut points: {self.cut_points}")
        return self._aux_factory(boundary, kind)

    def channel_dims(self) -> dict:
        """Per state_dict entry, per dimension: the channel spaces it indexes (a Dim) or None."""
        return tensor_dims(self)

    def example_input(self, batch: int = 1) -> torch.Tensor:
        if self.input_dtype == torch.long:
            return torch.randint(0, self.num_classes, (batch, *self.input_shape))
        return torch.randn(batch, *self.input_shape)

    def example_target(self, batch: int = 1) -> torch.Tensor:
        """Targets matching the logits: (batch,) for classifiers, flattened tokens for LMs."""
        with torch.no_grad():
            out_shape = self(self.example_input(1)).shape
        per_sample = out_shape[0]
        return torch.randint(0, self.num_classes, (batch * per_sample,) if self.input_dtype == torch.long
                             else (batch,))


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, relu: bool = True, *,
                 out: Dim | None = None, inp: Dim | None = None):
        mods = [tag(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), out, inp),
                tag(nn.BatchNorm2d(cout), out)]
        if relu:
            mods.append(nn.ReLU())
        super().__init__(*mods)


class PoolLinear(nn.Module):
    """Global average pool over H, W, then a linear classifier."""
    def __init__(self, cin: int, classes: int, *, inp: Dim | None = None):
        super().__init__()
        self.fc = tag(nn.Linear(cin, classes), None, inp)

    def forward(self, x):
        return self.fc(x.mean(dim=(2, 3)))


def conv_output_module(channels: Sequence[int], strides: Sequence[int], classes: int,
                       dims: Sequence[Dim | None] | None = None) -> nn.Module:
    """ProFL output module: one conv+BN+ReLU per remaining stage (channels[0] -> channels[1] -> ...),
    then pool + linear. dims[i]: the channel spaces of channels[i]."""
    dims = [None] * len(channels) if dims is None else dims
    mods = [ConvBNReLU(a, b, 3, s, out=db, inp=da) for a, b, s, da, db in
            zip(channels[:-1], channels[1:], strides, dims[:-1], dims[1:], strict=True)]
    return nn.Sequential(*mods, PoolLinear(channels[-1], classes, inp=dims[-1]))


class FlattenLinear(nn.Sequential):
    """Flatten all but the batch dimension, then a linear layer (+ ReLU)."""
    def __init__(self, cin: int, cout: int, relu: bool = False, *, out: Dim | None = None,
                 inp: Dim | None = None):
        super().__init__(nn.Flatten(), tag(nn.Linear(cin, cout), out, inp), *([nn.ReLU()] if relu else []))


def stages_ahead(stages: Sequence[int], boundary: int) -> list[tuple[int, int]]:
    """(start, end) boundaries of each stage, taken between consecutive entries of `stages`, that ends
    after `boundary`: the stages a ProFL output module at `boundary` stands in for."""
    return [(a, b) for a, b in zip(stages[:-1], stages[1:], strict=True) if b > boundary]
