"""Channel spaces: which hidden size each dimension of each tensor of a zoo model indexes (no torch).

A channel space is a hidden size of the global model (M filters, units or per-head dimensions) that a
width s shrinks to floor(s*M). The builders, where channels are computed, tag each module whose tensors
index a space: `tag(module, out, inp)` says that dim 0 of every tensor the module holds itself (weight,
bias, BN statistics) indexes `out` and dim 1 indexes `inp`; other dims, and every tensor of an untagged
module, are never sliced. A `Dim` is a concatenation of segments: a DenseNet layer reads the stem's space
followed by each earlier dense layer's growth; a flattened feature map, and a transformer's q/k/v
(index d * heads + h), repeat each channel `inner` times (entry c * inner + j).

Names: 'L<i>' is the output of layer i, 'L<i>.head' / 'L<i>.mlp' a transformer block's per-head
dimension / MLP hidden, 'stream<s>' the residual stream of ResNet stage s (its stem or projection and
every block output of the stage). Auxiliary heads reuse the spaces of the states they read and of the
stages they stand in for. A segment names the layer that produced its channels: the local size there is
scaled(size, widths[layer]).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

ATTR = "_edgefl_dims"


@dataclass(frozen=True)
class Seg:
    space: str
    size: int       # M: the space's channels in the global model
    layer: int      # the layer whose width sets the local size
    inner: int = 1  # entries per channel: channel c covers entries c * inner .. c * inner + inner - 1


Dim = tuple[Seg, ...]


def seg(space: str, size: int, layer: int, inner: int = 1) -> Dim:
    return (Seg(space, size, layer, inner),)


def repeat(dim: Dim, inner: int) -> Dim:
    """The dim of a flattened (channels, *rest) map with `inner` entries in rest: index c * inner + j."""
    return tuple(replace(s, inner=s.inner * inner) for s in dim)


def size(dim: Dim) -> int:
    """Entries of the dim in the global model."""
    return sum(s.size * s.inner for s in dim)


def tag(module, out: Optional[Dim] = None, inp: Optional[Dim] = None):
    """Record the spaces of dims 0 and 1 of `module`'s own tensors; returns the module."""
    setattr(module, ATTR, (out, inp))
    return module


def tensor_dims(module) -> dict[str, tuple[Optional[Dim], ...]]:
    """For each state_dict entry of `module`: per dimension, the Dim it indexes or None."""
    dims = {}
    for key, tensor in module.state_dict().items():
        owner = key.rpartition(".")[0]
        out, inp = getattr(module.get_submodule(owner), ATTR, (None, None))
        dims[key] = tuple((out, inp)[d] if d < 2 else None for d in range(tensor.dim()))
    return dims
