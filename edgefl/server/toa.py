"""FedOLF's Tensor Operation Approximation (TOA, sec. 3.3, eq. 3, alg. 2): shrink the frozen prefix a device
downloads.

For every frozen layer W_q except the last frozen one, the server keeps floor(s * H_q) of its H_q output
filters (conv) or neurons (linear), sampled without replacement with probability proportional to their
Frobenius norms, P(Z_j) = ||Z_j||_F / sum_i ||Z_i||_F (successive draws, each over the filters still left).
The next layer's input channels shrink with them, through the same channel spaces `extract` slices by, so
the device model `device_model(ref, config, result.indices)` still runs; the last frozen layer keeps its
outputs, so the trained layers see full-size inputs.

A layer writes a space when dim 0 of one of its weights (tensors of 2+ dims) indexes it; every other use
reads it (input dims, and a BN before a conv). A channel space is reducible when every layer writing it is
a frozen layer before the last, every tensor reading it is in a frozen layer, and the config does not
already scale it. Layers
change width as a whole, so a layer is reduced only if every space it writes is reducible (a ResNet
stream written by a trained block stays whole, and so does every BlockOut writing it). A filter's norm
is taken over every weight (tensors of 2+ dims) that writes it: for a residual stream, the stem's or
projection's filter and each block's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from edgefl.server.submodel import IndexSets, ensure_aux, entries
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef
from edgefl.zoo.base import scaled


@dataclass(frozen=True)
class TOAResult:
    indices: IndexSets       # the config's index sets plus the sampled filters of the reduced spaces
    saved_bytes: int         # download bytes saved against sending those layers whole
    reduced_layers: tuple[int, ...]


def _reducible(ref: ModelRef, config: TrainConfig, indices: IndexSets):
    """(layers to reduce, their spaces, the entries writing each space)."""
    last = config.frozen_prefix - 1
    writers: dict[str, set[int]] = {}
    readers: dict[str, set[int]] = {}
    written: dict[int, set[str]] = {}
    for e in entries(ref, config):
        for d, dim in enumerate(e.dims):
            writes = d == 0 and len(e.dims) >= 2
            for s in dim or ():
                (writers if writes else readers).setdefault(s.space, set()).add(e.layer)
                if writes:
                    written.setdefault(e.layer, set()).add(s.space)
    spaces = {sp for sp, ws in writers.items()
              if max(ws) < last and max(readers.get(sp, set()) | ws) <= last and sp not in indices.kept}
    while True:  # a layer changes width as a whole: drop spaces written by a layer that cannot shrink
        layers = {q for q, sps in written.items() if q < last and sps <= spaces and indices.widths[q] == 1.0}
        keep = {sp for sp in spaces if writers[sp] <= layers}
        if keep == spaces:
            return layers, spaces
        spaces = keep


def filter_norms(global_state: Mapping[str, torch.Tensor], ref: ModelRef, config: TrainConfig,
                  space: str) -> torch.Tensor:
    """||Z_j||_F for each channel j of `space` over every weight writing it."""
    sq = None
    for e in entries(ref, config):
        t = global_state[e.key]
        if t.dim() < 2 or not e.dims[0]:
            continue
        rows = t.detach().double().pow(2).flatten(1).sum(1)
        offset = 0
        for s in e.dims[0]:
            if s.space == space:
                part = rows[offset: offset + s.size * s.inner].reshape(s.size, s.inner).sum(1)
                sq = part if sq is None else sq + part
            offset += s.size * s.inner
    if sq is None:
        raise ValueError(f"no weight of the config writes channels of {space!r}")
    return sq.sqrt()


def sample_filters(norms: torch.Tensor, keep: int, generator: torch.Generator) -> torch.Tensor:
    """`keep` filter indices drawn without replacement, each draw with probability proportional to the
    norms of the filters left (eq. 3). Zero-norm filters get a negligible weight, so that `keep` can
    exceed the number of filters with a norm."""
    weights = norms.double() + (norms.max().item() * 1e-12 or 1.0)
    return torch.multinomial(weights, keep, replacement=False, generator=generator)


def toa(global_state: Mapping[str, torch.Tensor], ref: ModelRef, config: TrainConfig, indices: IndexSets,
        s: float, seed: int = 0) -> TOAResult:
    """Sample the kept filters of the frozen layers before the last one (alg. 2) on top of `indices`."""
    if not 0 < s <= 1:
        raise ValueError(f"TOA scale must be in (0, 1], got {s}")
    if s == 1 or config.frozen_prefix < 2:
        return TOAResult(indices, 0, ())
    layers, spaces = _reducible(ref, config, indices)
    kept = dict(indices.kept)
    gen = torch.Generator().manual_seed(seed)
    for space in sorted(spaces):
        norms = filter_norms(global_state, ref, config, space)
        kept[space] = tuple(sorted(sample_filters(norms, scaled(norms.numel(), s), gen).tolist()))
    widths = tuple(s if q in layers else w for q, w in enumerate(indices.widths))
    reduced = IndexSets(widths, kept)
    return TOAResult(reduced, download_bytes(global_state, ref, config, indices)
                     - download_bytes(global_state, ref, config, reduced), tuple(sorted(layers)))


def download_bytes(global_state: Mapping[str, torch.Tensor], ref: ModelRef, config: TrainConfig,
                   indices: IndexSets) -> int:
    """Bytes of the state `extract` sends for (config, indices), without slicing anything."""
    state, total = ensure_aux(global_state, ref, [config]), 0
    for e in entries(ref, config):
        t = state[e.key]
        sizes = [n if d is None else len(indices.positions(d)) for d, n in zip(e.dims, t.shape, strict=True)]
        total += math.prod(sizes) * t.element_size()
    return total
