"""CIFAR-style ResNet-(6n+2) split into conv+BN+ReLU layers (SLT's unit of freezing).

A basic block is two layers. The first returns (h, x) so that the residual input x travels with the
state; the second adds the shortcut: identity restricted to its output channels inside a stage (width
slicing keeps a stage's residual stream aligned), a 1x1 conv+BN where the stage changes resolution.
Channel spaces: a BlockIn's output is its own space; the stem (or a stage's projection) and every
BlockOut of a stage write one shared space, the stage's residual stream.
"""
from __future__ import annotations

from torch import nn

from edgefl.zoo.base import ConvBNReLU, LayeredModel, PoolLinear, conv_output_module, full_widths, scaled
from edgefl.zoo.spaces import Dim, seg, tag

STAGE_CHANNELS = (16, 32, 64)


class BlockIn(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = ConvBNReLU(cin, cout, 3, stride)

    def forward(self, x):
        return self.body(x), x

    def tag(self, out: Dim, inp: Dim) -> "BlockIn":
        tag(self.body[0], out, inp)
        tag(self.body[1], out)
        return self


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

    def tag(self, out: Dim, mid: Dim, res: Dim) -> "BlockOut":
        """out: the stage's stream; mid: the BlockIn's output; res: the stream this block adds to."""
        tag(self.conv, out, mid)
        tag(self.bn, out)
        if self.project is not None:
            tag(self.project[0], out, res)
            tag(self.project[1], out)
        return self

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
    dims = [seg("stream0", STAGE_CHANNELS[0], 0)]      # channel spaces of each layer's output so far
    layers: list[nn.Module] = [ConvBNReLU(cin0, scaled(16, w[0]), 3, 1, out=dims[0])]
    chans = [scaled(16, w[0])]          # output channels of each layer so far
    cut_points, stages, stage_strides = [1], [1], []
    stream = chans[0]                   # channels of the residual stream entering the block
    for stage, base in enumerate(STAGE_CHANNELS):
        for block in range(n):
            stride = 2 if stage > 0 and block == 0 else 1
            i = len(layers)
            mid = scaled(base, w[i])
            out = scaled(base, w[i + 1])
            mid_dim, out_dim = seg(f"L{i}", base, i), seg(f"stream{stage}", base, i + 1)
            layers.append(BlockIn(chans[-1], mid, stride).tag(mid_dim, dims[-1]))
            layers.append(BlockOut(mid, out, stream, stride).tag(out_dim, mid_dim, dims[-1]))
            chans += [mid, out]
            dims += [mid_dim, out_dim]
            stream = out
            cut_points.append(len(layers))
        stages.append(len(layers))
        stage_strides.append(2 if stage > 0 else 1)
    layers.append(PoolLinear(chans[-1], num_classes, inp=dims[-1]))
    assert len(layers) == num_layers

    def aux(boundary: int, kind: str) -> nn.Module:
        c = chans[boundary - 1]
        if kind == "linear":
            return PoolLinear(c, num_classes, inp=dims[boundary - 1])
        if kind == "conv":
            # one conv per stage still ahead; it downsamples if that stage starts at or after the cut
            ahead = [(start, end, st) for start, end, st in zip(stages[:-1], stages[1:], stage_strides, strict=True)
                     if end > boundary]
            outs = [c] + [chans[end - 1] for _, end, _ in ahead]
            return conv_output_module(outs, [st if start >= boundary else 1 for start, _, st in ahead], num_classes,
                                      [dims[boundary - 1]] + [dims[end - 1] for _, end, _ in ahead])
        raise ValueError(f"unknown auxiliary head kind {kind!r}")

    return LayeredModel(layers, input_shape=input_shape, num_classes=num_classes, cut_points=cut_points,
                        stages=stages, aux_factory=aux)
