"""VGG-11 with batch norm for 32x32 inputs (the CIFAR variant): nine layers.

Each conv+BN+ReLU is one layer; a max-pool belongs to the layer before it. The classifier is a single
linear layer on the flattened 512 x (H/32) x (W/32) map. Convs have no bias (BN follows). Every inner
boundary is a cut point; stages end after each pooling, so the 'conv' output module downsamples once
per stage still ahead, as the stages it stands in for would.
"""
from __future__ import annotations

from torch import nn

from edgefl.zoo.base import (ConvBNReLU, FlattenLinear, LayeredModel, PoolLinear, conv_output_module, full_widths,
                             scaled, stages_ahead)
from edgefl.zoo.spaces import Dim, repeat, seg

CFG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class ConvPool(nn.Sequential):
    def __init__(self, cin: int, cout: int, *, out: Dim | None = None, inp: Dim | None = None):
        super().__init__(ConvBNReLU(cin, cout, 3, 1, out=out, inp=inp), nn.MaxPool2d(2))


def vgg11_bn(widths=None, input_shape=(3, 32, 32), num_classes: int = 10) -> LayeredModel:
    convs = [(c, i + 1 < len(CFG) and CFG[i + 1] == "M") for i, c in enumerate(CFG) if c != "M"]
    num_layers = len(convs) + 1
    w = full_widths(widths, num_layers)
    cin, height, width = input_shape
    pools = sum(pool for _, pool in convs)
    if height % 2 ** pools or width % 2 ** pools:
        raise ValueError(f"VGG needs an input divisible by {2 ** pools}, got {tuple(input_shape)}")
    layers: list[nn.Module] = []
    chans, stages, dims = [], [], []      # dims: the channel spaces of each layer's output
    for i, (base, pool) in enumerate(convs):
        cout = scaled(base, w[i])
        io = dict(out=seg(f"L{i}", base, i), inp=dims[-1] if dims else None)
        layers.append(ConvPool(cin, cout, **io) if pool else ConvBNReLU(cin, cout, 3, 1, **io))
        chans.append(cout)
        dims.append(io["out"])
        cin = cout
        if pool:
            stages.append(len(layers))
    spatial = (height >> pools) * (width >> pools)
    layers.append(FlattenLinear(cin * spatial, num_classes, inp=repeat(dims[-1], spatial)))
    assert len(layers) == num_layers

    def aux(boundary: int, kind: str) -> nn.Module:
        c = chans[boundary - 1]
        if kind == "linear":
            return PoolLinear(c, num_classes, inp=dims[boundary - 1])
        if kind == "conv":
            ahead = [end for _, end in stages_ahead(stages, boundary)]     # every stage ends with a pool
            return conv_output_module([c] + [chans[end - 1] for end in ahead], [2] * len(ahead), num_classes,
                                      [dims[end - 1] for end in [boundary] + ahead])
        raise ValueError(f"unknown auxiliary head kind {kind!r}")

    return LayeredModel(layers, input_shape=input_shape, num_classes=num_classes,
                        cut_points=range(1, num_layers), stages=stages, aux_factory=aux)
