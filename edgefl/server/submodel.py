"""Submodels: which channels a device keeps, and the only code that slices or places tensors.

A device runs `device_model(ref, config, indices)`: `build(ref, indices.widths)` cut after layer
`config.end`, plus the auxiliary head `config.aux_head` at boundary `config.end` as submodule `aux`. Every
width-scaled dimension indexes channel spaces of the global model (edgefl.zoo.spaces); `IndexSets` holds,
for each reduced space, the global channels kept. `extract` slices the global state into the device state
(frozen layers included: the device runs them), `embed` places the tensors the device trained into
global-shaped tensors with a mask of the entries they cover, and `aggregate` combines such contributions
(one at a time, as they arrive, in edgefl.server.aggregate).

Auxiliary heads live in the global state as 'aux.<boundary>.<kind>.<name>' (one per boundary and kind) and
on the device as 'aux.<name>'; a head the global state lacks starts from a seeded init (`ensure_aux`).
A config with a rank trains its linears at low rank (edgefl.server.lowrank): its device tensors that are not
slices of a global tensor name the global tensor they come from (`Entry.source`, `Entry.part`), and LoRA's
frozen base weights inside trained layers are marked `frozen` (sent, never uploaded).
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Collection, Iterable, Literal, Mapping, Optional, Sequence, cast

import torch
from torch import nn

from edgefl.errors import ConfigError, ReportRejected
from edgefl.server import lowrank
from edgefl.server.aggregate import Contribution, RunningAggregate
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build
from edgefl.zoo.base import scaled
from edgefl.zoo.spaces import Dim, Seg, tensor_dims

State = dict[str, torch.Tensor]
Mode = Literal["trained", "sampled"]    # aggregation: over the devices that trained a tensor, or all sampled


@dataclass(frozen=True)
class IndexSets:
    """widths: the device model's width per layer; kept: per reduced channel space, the sorted global
    indices it keeps. A segment whose layer is at full width keeps every channel of its space."""
    widths: tuple[float, ...]
    kept: Mapping[str, tuple[int, ...]]

    def channels(self, s: Seg) -> Sequence[int]:
        local = scaled(s.size, self.widths[s.layer])
        if local == s.size:
            return range(s.size)
        kept = self.kept.get(s.space, ())
        if len(kept) != local:
            raise ValueError(f"channel space {s.space}: layer {s.layer} has {local} of its {s.size} channels "
                             f"but the index set keeps {len(kept)}")
        return kept

    def positions(self, dim: Dim) -> list[int]:
        """The global entries of a dimension the device holds, in device order."""
        out, offset = [], 0
        for s in dim:
            out += [offset + c * s.inner + j for c in self.channels(s) for j in range(s.inner)]
            offset += s.size * s.inner
        return out


@dataclass(frozen=True)
class Entry:
    key: str                            # global state key (the wire name: for low-rank tensors, the device key)
    device_key: str
    layer: int                          # layer holding the tensor; config.end for the auxiliary head
    dims: tuple[Optional[Dim], ...]
    source: Optional[str] = None        # low-rank tensors: the global tensor it is derived from
    part: Optional[str] = None          # ... and how (edgefl.server.lowrank.device_tensors)
    frozen: bool = False                # inside a trained layer but never trained (LoRA's base weight, bias)


@lru_cache(maxsize=8)
def _global(ref: ModelRef):
    with torch.random.fork_rng(devices=[]):
        model = build(ref)
    return model, model.channel_dims()


@lru_cache(maxsize=64)
def _aux(ref: ModelRef, boundary: int, kind: str):
    """The full-width auxiliary head's dims and its seeded initial state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(f"{ref.key()}/{boundary}/{kind}".encode()))
        head = _global(ref)[0].aux_head(boundary, kind)
    return tensor_dims(head), {k: v.detach().clone() for k, v in head.state_dict().items()}


def aux_prefix(config: TrainConfig) -> str:
    return config.aux_prefix


@lru_cache(maxsize=256)
def entries(ref: ModelRef, config: TrainConfig) -> tuple[Entry, ...]:
    """The tensors a device with `config` holds: layers [0, end), then the auxiliary head."""
    out = [Entry(k, k, int(k.split(".")[1]), d) for k, d in _global(ref)[1].items()]
    out = [e for e in out if e.layer < config.end]
    if config.aux_head is not None:
        dims, _ = _aux(ref, config.end, config.aux_head)
        out += [Entry(aux_prefix(config) + k, "aux." + k, config.end, d) for k, d in dims.items()]
    return tuple(_low_rank_entries(ref, config, out)) if config.rank is not None else tuple(out)


def _low_rank_entries(ref: ModelRef, config: TrainConfig, out: list[Entry]) -> list[Entry]:
    """LoRA: the base weight comes from its '.base' copy and stays frozen with the bias, the adapters are
    added; FedHM: the weight is replaced by its two factors."""
    by_key = {e.key: e for e in out}
    for layer, path, linear in lowrank.adapted(_global(ref)[0], config):
        weight = by_key[f"{path}.weight"]
        if config.rank_mode == "lora" and linear.bias is not None:
            by_key[f"{path}.bias"] = replace(by_key[f"{path}.bias"], frozen=True)
        del by_key[weight.key]
        for device_key, source, part in lowrank.device_tensors(path, linear, config):
            by_key[device_key] = Entry(device_key, device_key, layer, weight.dims if part == "base" else (None, None),
                                       source=source, part=part, frozen=part == "base")
    return list(by_key.values())


def _select(mode: str, size: int, keep: int, round: int, seed: str) -> tuple[int, ...]:
    if mode == "prefix":                # HeteroFL, FjORD, small model, SLT's head
        return tuple(range(keep))
    if mode == "rolling":               # FedRolex, SLT eq. 3: {(r + i) mod M : 0 <= i < floor(sM)}
        return tuple(sorted((round + i) % size for i in range(keep)))
    if mode == "random":                # Federated Dropout: a fresh draw per device per round
        return tuple(sorted(random.Random(seed).sample(range(size), keep)))
    raise ValueError(f"unknown index_mode {mode!r}")


def index_sets(ref: ModelRef, config: TrainConfig, round: int = 0, device_seed: int = 0) -> IndexSets:
    """Keep floor(s*M) channels of each space the scaled layers (>= head_start) index, chosen by
    `config.index_mode`; layers below head_start keep every channel. A space read at two sizes (a ResNet
    stream crossing head_start) nests only as a prefix: other modes are refused there."""
    sizes: dict[str, set[int]] = {}
    totals: dict[str, int] = {}
    for e in entries(ref, config):
        for s in (s for dim in e.dims if dim for s in dim):
            sizes.setdefault(s.space, set()).add(scaled(s.size, config.widths[s.layer]))
            totals[s.space] = s.size
    kept = {}
    for space in sorted(sizes):
        size, keep = totals[space], min(sizes[space])
        if keep == size:
            continue
        if len(sizes[space]) > 1 and config.index_mode != "prefix":
            raise ConfigError(f"channel space {space} is used at {sorted(sizes[space])} channels under head_start="
                              f"{config.head_start}; index_mode {config.index_mode!r} needs one width per space: "
                              "use 'prefix' or put head_start at a stage boundary")
        kept[space] = _select(config.index_mode, size, keep, round, f"{device_seed}/{round}/{space}")
    return IndexSets(config.widths, kept)


def device_model(ref: ModelRef, config: TrainConfig, indices: IndexSets) -> nn.Module:
    """The model the device runs: layers [0, end) at `indices.widths`, the auxiliary head as `aux`, the rank
    layers' linears at low rank."""
    model = build(ref, indices.widths)
    if config.aux_head is not None:
        model.aux = model.aux_head(config.end, config.aux_head)
    model.layers = nn.ModuleList(list(model.layers)[: config.end])
    return lowrank.convert(model, config) if config.rank is not None else model


def ensure_aux(global_state: Mapping[str, torch.Tensor], ref: ModelRef, configs: Iterable[TrainConfig]) -> State:
    """The global state plus the seeded initial state of every auxiliary head `configs` use that it lacks,
    and LoRA adapters grown to every rank they ask for (edgefl.server.lowrank.ensure_adapters)."""
    state = dict(global_state)
    for config in configs:
        if config.aux_head is not None:
            for k, t in _aux(ref, config.end, config.aux_head)[1].items():
                state.setdefault(aux_prefix(config) + k, t.clone())
        if config.rank is not None:
            state = lowrank.ensure_adapters(state, _global(ref)[0], config)
    return state


def _index(dims: tuple[Optional[Dim], ...], indices: IndexSets, shape: torch.Size):
    """Open-mesh index tensors selecting the device's entries, or None when the tensor is kept whole."""
    picks = [None if d is None else indices.positions(d) for d in dims]
    picks = [None if p is None or p == list(range(n)) else p for p, n in zip(picks, shape, strict=True)]
    if all(p is None for p in picks):
        return None
    axes = [torch.arange(n) if p is None else torch.tensor(p) for p, n in zip(picks, shape, strict=True)]
    return tuple(a.reshape([-1 if i == d else 1 for i in range(len(axes))]) for d, a in enumerate(axes))


@lru_cache(maxsize=64)
def nested_index(ref: ModelRef, outer: TrainConfig, inner: TrainConfig) -> dict[str, Optional[tuple]]:
    """For each tensor of the `inner` device model, the index of its entries in the `outer` device model's
    tensor (None: all of it): basic slices where they are prefixes, open-mesh index tensors otherwise.
    Both take prefix index sets (HeteroFL, FjORD) and inner is no wider anywhere, so its channels are a
    subset of outer's: FjORD's ordered dropout trains the inner model on these slices of the outer one."""
    outer_ix, inner_ix = index_sets(ref, outer), index_sets(ref, inner)
    out: dict[str, Optional[tuple]] = {}
    for e in entries(ref, inner):
        picks: list[Optional[list[int]]] = []
        for d in e.dims:
            if d is None:
                picks.append(None)
                continue
            where = {g: i for i, g in enumerate(outer_ix.positions(d))}
            local = [where[g] for g in inner_ix.positions(d)]
            picks.append(None if len(local) == len(where) and local == sorted(local) else local)
        if all(p is None for p in picks):
            out[e.device_key] = None
        elif all(p is None or p == list(range(len(p))) for p in picks):
            out[e.device_key] = tuple(slice(None) if p is None else slice(0, len(p)) for p in picks)
        else:
            full = (_aux(ref, inner.end, inner.aux_head)[1][e.device_key[4:]] if e.key.startswith("aux.")
                    else _global(ref)[0].state_dict()[e.key]).shape
            shape = [n if d is None else len(outer_ix.positions(d)) for d, n in zip(e.dims, full, strict=True)]
            axes = [torch.arange(n) if p is None else torch.tensor(p) for p, n in zip(picks, shape, strict=True)]
            out[e.device_key] = tuple(a.reshape([-1 if i == k else 1 for i in range(len(axes))])
                                      for k, a in enumerate(axes))
    return out


def extract(global_state: Mapping[str, torch.Tensor], ref: ModelRef, config: TrainConfig,
            indices: IndexSets) -> State:
    """The device model's state (device_model(ref, config, indices).load_state_dict(..., strict=True))."""
    state = ensure_aux(global_state, ref, [config])
    out: State = {}
    factors: dict = {}
    for e in entries(ref, config):
        if e.source is not None:
            out[e.device_key] = lowrank.extract_part(state, e.source, cast(str, e.part), cast(int, config.rank), factors)
            continue
        t = state[e.key].detach()
        ix = _index(e.dims, indices, t.shape)
        # a whole tensor is the global one itself: every consumer copies (load_state_dict) or serialises it,
        # and a round's global state is replaced, never written in place; a clone per device of a round
        # was a model per device held until the round's reports were in
        out[e.device_key] = t if ix is None else t[ix]
    return out


def embed(global_state: Mapping[str, torch.Tensor], device_update: Mapping[str, torch.Tensor], ref: ModelRef,
          config: TrainConfig, indices: IndexSets, only: Optional[Collection[str]] = None) -> tuple[State, State]:
    """Place the tensors the device trained (layers [frozen_prefix, end) with their BN statistics, and the
    auxiliary head) into global-shaped tensors. Returns (placed, mask): placed holds the global value
    where mask is False; frozen tensors are never uploaded, so they appear in neither. A tensor trained
    whole is placed as the upload itself (shared, not copied) with a broadcast True mask. `only`: the
    global names the device was asked to train where it trains fewer than the config (ProFL's output layer)."""
    state = ensure_aux(global_state, ref, [config])
    placed: State = {}
    mask: State = {}
    low_rank: dict[tuple[str, str], torch.Tensor] = {}
    for e in entries(ref, config):
        if e.layer < config.frozen_prefix or e.frozen or (only is not None and e.key not in only):
            continue
        if e.device_key not in device_update:
            raise ReportRejected(f"the update lacks trained tensor {e.device_key!r}")
        if e.source is not None:
            low_rank[e.source, cast(str, e.part)] = device_update[e.device_key].detach()
            continue
        base, update = state[e.key].detach(), device_update[e.device_key].detach()
        ix = _index(e.dims, indices, base.shape)
        expected = base.shape if ix is None else torch.Size(a.numel() for a in ix)
        if update.shape != expected:
            raise ReportRejected(f"tensor {e.device_key!r} has shape {tuple(update.shape)}, expected {tuple(expected)}")
        if ix is None:
            # trained whole: the upload itself, and a mask that is one broadcast True (no copies, which held
            # two model-sized tensors per device of a round until aggregation)
            placed[e.key] = update.to(base.dtype)
            mask[e.key] = torch.ones((), dtype=torch.bool).expand(base.shape)
            continue
        p, m = base.clone(), torch.zeros(base.shape, dtype=torch.bool)
        p[ix] = update.to(base.dtype)
        m[ix] = True
        placed[e.key], mask[e.key] = p, m
    if low_rank:
        factor_placed, factor_mask = lowrank.place(state, low_rank, cast(int, config.rank))
        placed.update(factor_placed)
        mask.update(factor_mask)
    return placed, mask


def aggregate(global_state: Mapping[str, torch.Tensor], contributions: Sequence[Contribution],
              mode: Mode = "trained") -> State:
    """Combine a round's `embed` contributions (n_k, x_k, m_k) by the rule `mode` names: the same fold as the
    coordinator's, in their order (edgefl.server.aggregate.RunningAggregate states the rules). Pure: returns a new
    dict; tensors nobody touched are the global ones. Every contribution key must be in global_state (add
    new auxiliary heads with `ensure_aux` first)."""
    running = RunningAggregate(global_state, mode)
    for contribution in contributions:
        running.add(contribution)
    return running.result()
