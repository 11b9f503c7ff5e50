"""CIFAR-style ResNet-(6n+2) split into conv+BN+ReLU layers (SLT's unit of freezing).

A basic block is two layers. The first returns (h, x) so that the residual input x travels with the
state; the second adds the shortcut: identity restricted to its output channels inside a stage (width
slicing keeps a stage's residual stream aligned), a 1x1 conv+BN where the stage changes resolution.
"""
from __future__ import annotations

import torch
from torch import nn

from edgefl.zoo.base import ConvBNReLU, LayeredModel, PoolLinear, conv_output_module, full_widths, scaled

STAGE_CHANNELS = (16, 32, 64)


class BlockIn(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = ConvBNReLU(cin, cout, 3, stride)

    def forward(self, x):
        return self.body(x), x


class BlockOut(nn.Module):
    def __init__(self, cin: int, cout: int, cres: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.cout = cout
        self.project = None
        if stride != 1:
            self.project = nn.Sequential(nn.Conv2d(cres, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        elif cres < cout:
            raise ValueError("a residual stream cannot be narrower than the block output")
        self.relu = nn.ReLU()

    def forward(self, state):
        h, x = state
        shortcut = self.project(x) if self.project is not None else x[:, : self.cout]
        return self.relu(self.bn(self.conv(h)) + shortcut)


def resnet(depth: int = 20, widths=None, input_shape=(3, 32, 32), num_classes: int = 10) -> LayeredModel:
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    n = (depth - 2) // 6
    num_layers = depth  # stem + 2 per block + classifier
    w = full_widths(widths, num_layers)
    cin0 = input_shape[0]
    layers: list[nn.Module] = [ConvBNReLU(cin0, scaled(16, w[0]), 3, 1)]
    chans = [scaled(16, w[0])]          # output channels of each layer so far
    cut_points, stages, stage_strides = [1], [1], []
    stream = chans[0]                   # channels of the residual stream entering the block
    for stage, base in enumerate(STAGE_CHANNELS):
        for block in range(n):
            stride = 2 if stage > 0 and block == 0 else 1
            i = len(layers)
            mid = scaled(base, w[i])
            out = scaled(base, w[i + 1])
            layers.append(BlockIn(chans[-1], mid, stride))
            layers.append(BlockOut(mid, out, stream, stride))
            chans += [mid, out]
            stream = out
            cut_points.append(len(layers))
        stages.append(len(layers))
        stage_strides.append(2 if stage > 0 else 1)
    layers.append(PoolLinear(chans[-1], num_classes))
    assert len(layers) == num_layers

    def aux(boundary: int, kind: str) -> nn.Module:
        c = chans[boundary - 1]
        if kind == "linear":
            return PoolLinear(c, num_classes)
        if kind == "conv":
            # one conv per stage still ahead; it downsamples if that stage starts at or after the cut
            ahead = [(start, end, st) for start, end, st in zip(stages[:-1], stages[1:], stage_strides, strict=True)
                     if end > boundary]
            outs = [c] + [chans[end - 1] for _, end, _ in ahead]
            return conv_output_module(outs, [st if start >= boundary else 1 for start, _, st in ahead], num_classes)
        raise ValueError(f"unknown auxiliary head kind {kind!r}")

    return LayeredModel(layers, input_shape=input_shape, num_classes=num_classes, cut_points=cut_points,
                        stages=stages, aux_factory=aux)
