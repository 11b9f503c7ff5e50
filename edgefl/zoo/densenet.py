"""DenseNet for CIFAR (Huang et al. 2017; no bottleneck, no compression), e.g. DenseNet-40, growth 12.

Layers: a 3x3 stem conv (16 channels), three dense blocks of (depth-4)/3 BN-ReLU-Conv3x3 layers with
two BN-ReLU-Conv1x1-AvgPool transitions between them, and a BN-ReLU-pool-linear classifier: depth
layers in all. The state inside a block is the concatenation of every feature map so far: a dense layer
returns torch.cat([x, new], 1), so the next layer sees them all. The width of a dense layer scales its
growth; a transition's scales its output channels (at full width, as many as it reads). Channel spaces: the
stem, each dense layer's growth and each transition's output is a space; a state inside a block is the
concatenation of the stem's (or the transition's) space and the growths so far.

Width slicing note: a dense layer's input is the concatenation of segments (stem, then one per earlier
layer), so the channels a narrower model keeps are a prefix of each segment, not of the whole input.

Cut points: after the stem, after each transition, before the classifier. Stages end after the stem
(as in the ResNets) and after each dense block with its transition; the 'conv' output module has one
conv per stage ahead, downsampling where that stage ends with a transition.
"""
from __future__ import annotations

import torch
from torch import nn

from edgefl.zoo.base import LayeredModel, PoolLinear, conv_output_module, full_widths, scaled, stages_ahead
from edgefl.zoo.spaces import seg, tag

STEM_CHANNELS = 16
BLOCKS = 3


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, growth, 3, 1, 1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.body(x)], 1)


class Transition(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2))


class Classifier(nn.Sequential):
    def __init__(self, cin: int, classes: int):
        super().__init__(nn.BatchNorm2d(cin), nn.ReLU(), PoolLinear(cin, classes))


def densenet(depth: int = 40, growth: int = 12, widths=None, input_shape=(3, 32, 32),
             num_classes: int = 10) -> LayeredModel:
    if (depth - 4) % BLOCKS:
        raise ValueError(f"DenseNet depth must be 3n+4, got {depth}")
    n = (depth - 4) // BLOCKS
    w = full_widths(widths, depth)  # stem + 3n dense layers + 2 transitions + classifier
    c = scaled(STEM_CHANNELS, w[0])
    dims = [seg("L0", STEM_CHANNELS, 0)]            # channel spaces of each layer's output so far
    layers: list[nn.Module] = [tag(nn.Conv2d(input_shape[0], c, 3, 1, 1, bias=False), dims[0])]
    chans, full = [c], STEM_CHANNELS    # output channels of each layer so far; the same at full width
    cut_points, stages, pooled = [1], [1], set()   # pooled: boundaries right after a transition
    for block in range(BLOCKS):
        for _ in range(n):
            i = len(layers)
            g = scaled(growth, w[i])
            layers.append(DenseLayer(c, g))
            tag(layers[i].body[0], dims[-1])
            tag(layers[i].body[2], seg(f"L{i}", growth, i), dims[-1])
            c, full = c + g, full + growth
            chans.append(c)
            dims.append(dims[-1] + seg(f"L{i}", growth, i))
        if block < BLOCKS - 1:
            i = len(layers)
            out = scaled(full, w[i])
            layers.append(Transition(c, out))
            tag(layers[i][0], dims[-1])
            tag(layers[i][2], seg(f"L{i}", full, i), dims[-1])
            c = out
            chans.append(c)
            dims.append(seg(f"L{i}", full, i))
            pooled.add(len(layers))
        cut_points.append(len(layers))
        stages.append(len(layers))
    layers.append(Classifier(c, num_classes))
    tag(layers[-1][0], dims[-1])
    tag(layers[-1][2].fc, None, dims[-1])
    assert len(layers) == depth

    def aux(boundary: int, kind: str) -> nn.Module:
        c = chans[boundary - 1]
        if kind == "linear":
            return PoolLinear(c, num_classes, inp=dims[boundary - 1])
        if kind == "conv":
            ahead = [end for _, end in stages_ahead(stages, boundary)]
            strides = [2 if end in pooled else 1 for end in ahead]
            return conv_output_module([c] + [chans[end - 1] for end in ahead], strides, num_classes,
                                      [dims[end - 1] for end in [boundary] + ahead])
        raise ValueError(f"unknown auxiliary head kind {kind!r}")

    return LayeredModel(layers, input_shape=input_shape, num_classes=num_classes, cut_points=cut_points,
                        stages=stages, aux_factory=aux)
