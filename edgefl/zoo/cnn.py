"""The 2-conv CNN of FedAvg / LEAF (EMNIST, Fashion-MNIST): four layers.

conv5x5-32 (padding 2) + ReLU + max-pool 2, conv5x5-64 (padding 2) + ReLU + max-pool 2, fc-512 + ReLU (the
flatten happens at its start), fc-classes. Widths scale the conv channels and the 512 hidden units.
Stages end after each conv layer and after fc-512; auxiliary heads read every inner boundary. The 'conv'
output module has one conv+BN+ReLU per conv stage still ahead; the fc-512 stage has no conv stand-in
(pool + linear replaces it).
"""
from __future__ import annotations

from torch import nn

from edgefl.zoo.base import (FlattenLinear, LayeredModel, PoolLinear, conv_output_module, full_widths, scaled,
                             stages_ahead)
from edgefl.zoo.spaces import repeat, seg, tag

CHANNELS = (32, 64)
HIDDEN = 512


class ConvReLUPool(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2))


def cnn(widths=None, input_shape=(1, 28, 28), num_classes: int = 10) -> LayeredModel:
    w = full_widths(widths, 4)
    cin, height, width = input_shape
    c1, c2, hidden = scaled(CHANNELS[0], w[0]), scaled(CHANNELS[1], w[1]), scaled(HIDDEN, w[2])
    if height < 4 or width < 4:
        raise ValueError(f"input {tuple(input_shape)} is too small for two 2x2 poolings")
    spatial = (height // 4) * (width // 4)
    dims = [seg("L0", CHANNELS[0], 0), seg("L1", CHANNELS[1], 1), seg("L2", HIDDEN, 2)]  # each layer's output
    layers = [ConvReLUPool(cin, c1), ConvReLUPool(c1, c2),
              FlattenLinear(c2 * spatial, hidden, relu=True, out=dims[2], inp=repeat(dims[1], spatial)),
              tag(nn.Linear(hidden, num_classes), None, dims[2])]
    tag(layers[0][0], dims[0])
    tag(layers[1][0], dims[1], dims[0])
    chans = [c1, c2, hidden]
    stages = [1, 2, 3]

    def aux(boundary: int, kind: str) -> nn.Module:
        c = chans[boundary - 1]
        if kind not in ("linear", "conv"):
            raise ValueError(f"unknown auxiliary head kind {kind!r}")
        if boundary == 3:                   # the state is the fc-512 output: (N, hidden)
            return tag(nn.Linear(c, num_classes), None, dims[2])
        if kind == "linear":
            return PoolLinear(c, num_classes, inp=dims[boundary - 1])
        ahead = [end for _, end in stages_ahead(stages, boundary) if end < 3]     # conv stages: each pools
        return conv_output_module([c] + [chans[end - 1] for end in ahead], [2] * len(ahead), num_classes,
                                  [dims[end - 1] for end in [boundary] + ahead])

    return LayeredModel(layers, input_shape=input_shape, num_classes=num_classes, cut_points=[1, 2, 3],
                        stages=stages, aux_factory=aux)
