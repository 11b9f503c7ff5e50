"""Low-rank training of linear weights (imports torch): Heterogeneous LoRA and FedHM, device and server side.

A config with `rank` (edgefl.trainconfig) trains every nn.Linear inside its rank layers (the trained layers
but the output layer) at low rank; everything else in those layers (LayerNorms, convolutions) trains in
full. edgefl.server.submodel calls in here for the tensors this changes; edgefl.cost.model prices it.

LoRA (Hu et al. 2021), heterogeneous as in CAFF App. B (Cho et al. 2023: per-device rank, adapters aggregated
like HeteroFL). The linear at module path p computes W x + b + B A x; W and b stay frozen.
  * Global state: 'aux.lora.<p>.A' (R x Q), '.B' (P x R) at the largest rank R a device has asked for, and
    '.base', the frozen W0; '<p>.weight' holds W0 + B A, so the global model (the state without 'aux.*')
    is the adapted model and evaluates as such. A device with a rank beyond R grows the adapters
    (`ensure_adapters`): rows of A seeded per (path, row), so the order devices arrive in does not matter,
    and zero columns of B, so W does not move.
  * A device with rank r receives W0 under '<p>.weight' and the truncated adapters A[:r], B[:, :r] under
    '<p>.lora.A', '<p>.lora.B' (device and wire names); it trains and uploads only the adapters (plus the
    layers' other tensors). Its rows / columns go back in place (`place`), aggregation mode 'trained'
    averages each rank component over the devices that hold it (HeteroFL's rule for nested slices), and
    `merge` sets W = W0 + B A again.
  * The scale alpha / r is fixed at 1 for every rank: the first r components mean the same on every device.

FedHM (Yao et al. 2021; CAFF App. B): a device with rank z receives, per linear, the truncated SVD of the
global W = U diag(S) V^T as two factors '<p>.weight_u' = U diag(S) (P x z) and '<p>.weight_v' = V^T
(z x Q), and trains both; the server reconstructs W_k = U V (`place`) and averages full matrices.
"""
from __future__ import annotations

import functools
import math
import weakref
import zlib
from typing import Mapping, Optional, cast

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.errors import ReportRejected
from edgefl.trainconfig import TrainConfig

LORA = "aux.lora."
State = dict[str, torch.Tensor]


def lora_key(path: str, part: str) -> str:
    """Global key of a LoRA tensor of the linear at `path`: part 'A', 'B' or 'base'."""
    return f"{LORA}{path}.{part}"


def adapted(model: nn.Module, config: TrainConfig) -> list[tuple[int, str, nn.Linear]]:
    """(layer, module path, module) of every nn.Linear trained at low rank: those inside the rank layers."""
    out = []
    for i in config.rank_layers:
        for name, module in model.get_submodule(f"layers.{i}").named_modules():
            if isinstance(module, nn.Linear):
                out.append((i, f"layers.{i}" + (f".{name}" if name else ""), module))
    return out


class LoRAAdapter(nn.Module):
    """A (r x in) and B (out x r); the linear it adapts adds B A x to its output (`_lora_forward`)."""

    def __init__(self, rank: int, in_features: int, out_features: int):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))


def _lora_forward(module: nn.Linear, inputs, output):
    # reads the adapter through the module it is given, so a deep copy of the model adapts with its own copy
    adapter = cast(LoRAAdapter, module.lora)
    return output + F.linear(F.linear(inputs[0], adapter.A), adapter.B)


class FactorLinear(nn.Module):
    """W ~ U V with U = weight_u (out x rank) and V = weight_v (rank x in): two linears, both trained."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_u = nn.Parameter(torch.zeros(out_features, rank))
        self.weight_v = nn.Parameter(torch.zeros(rank, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x):
        return F.linear(F.linear(x, self.weight_v), self.weight_u, self.bias)


def convert(model: nn.Module, config: TrainConfig) -> nn.Module:
    """Make `model` (full width, layers [0, end)) train its rank layers' linears at `config.rank`, in place.
    Sets `model.frozen_tensors`: the state names inside trained layers that stay frozen (LoRA's W and b),
    which the trainer neither trains nor uploads."""
    if config.rank is None:
        raise ValueError("the config trains no layer at low rank")
    frozen: set[str] = set()
    for _, path, linear in adapted(model, config):
        if config.rank_mode == "lora":
            linear.lora = LoRAAdapter(config.rank, linear.in_features, linear.out_features)
            linear.register_forward_hook(_lora_forward)
            frozen |= {f"{path}.weight"} | ({f"{path}.bias"} if linear.bias is not None else set())
        else:
            parent, _, child = path.rpartition(".")
            factor = FactorLinear(linear.in_features, linear.out_features, config.rank, linear.bias is not None)
            setattr(model.get_submodule(parent), child, factor)
    setattr(model, "frozen_tensors", frozenset(frozen))    # a plain attribute, not a parameter or buffer
    return model


def device_tensors(path: str, linear: nn.Linear, config: TrainConfig) -> list[tuple[str, str, str]]:
    """(device key, global source key, part) of each tensor a device holds for the linear at `path` in
    place of, or besides, its global tensors. Parts: 'base' (LoRA's frozen W0), 'A' / 'B' (the first rank
    rows / columns of a LoRA adapter), 'U' / 'V' (FedHM's factors of W)."""
    if config.rank_mode == "lora":
        return [(f"{path}.weight", lora_key(path, "base"), "base"), (f"{path}.lora.A", lora_key(path, "A"), "A"),
                (f"{path}.lora.B", lora_key(path, "B"), "B")]
    return [(f"{path}.weight_u", f"{path}.weight", "U"), (f"{path}.weight_v", f"{path}.weight", "V")]


def _seeded_rows(path: str, rows: range, in_features: int) -> torch.Tensor:
    """Rows of A drawn as LoRA initialises it (kaiming-uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), each
    from its own seed so that growing A to any rank gives the same rows."""
    bound = 1 / math.sqrt(in_features)
    out = [(torch.rand(in_features, generator=torch.Generator().manual_seed(zlib.crc32(f"{path}/{j}".encode())),
                       dtype=torch.float64) * 2 - 1) * bound for j in rows]
    return torch.stack(out) if out else torch.zeros(0, in_features, dtype=torch.float64)


def ensure_adapters(state: Mapping[str, torch.Tensor], model: nn.Module, config: TrainConfig) -> State:
    """The global state with LoRA adapters of rank >= config.rank for every linear the config adapts
    (`model`: the global model, for the paths); the state itself when nothing is missing."""
    if config.rank is None or config.rank_mode != "lora":
        return dict(state)
    out = dict(state)
    for _, path, linear in adapted(model, config):
        w = out[f"{path}.weight"]
        a = out.get(lora_key(path, "A"), torch.zeros(0, linear.in_features, dtype=w.dtype))
        if a.shape[0] >= config.rank:
            continue
        b = out.get(lora_key(path, "B"), torch.zeros(linear.out_features, 0, dtype=w.dtype))
        grown = _seeded_rows(path, range(a.shape[0], config.rank), linear.in_features).to(w.dtype)
        out[lora_key(path, "A")] = torch.cat([a, grown])
        out[lora_key(path, "B")] = torch.cat([b, torch.zeros(b.shape[0], grown.shape[0], dtype=w.dtype)], dim=1)
        out.setdefault(lora_key(path, "base"), w.detach().clone())   # B is zero until now: W is W0
    return out


# every device of a round factors the same global tensors: one SVD per tensor object (and version), dropped
# with the tensor when aggregation replaces it (keyed by id: tensors compare elementwise, not as keys)
_SVD: dict[int, tuple] = {}


def _forget(key: int, _ref) -> None:
    _SVD.pop(key, None)


def _svd(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ref, version, cached = _SVD.get(id(w), (None, None, None))
    if ref is None or ref() is not w or version != w._version:
        cached = torch.linalg.svd(w.detach().double(), full_matrices=False)
        _SVD[id(w)] = (weakref.ref(w, functools.partial(_forget, id(w))), w._version, cached)
    return cached


def _factors(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U diag(S) (P x rank) and V^T (rank x Q) of the truncated SVD of w, zero-padded beyond min(P, Q)."""
    u, s, vh = _svd(w)
    k = min(rank, s.numel())
    left = torch.zeros(w.shape[0], rank, dtype=torch.float64)
    right = torch.zeros(rank, w.shape[1], dtype=torch.float64)
    left[:, :k], right[:k] = u[:, :k] * s[:k], vh[:k]
    return left.to(w.dtype), right.to(w.dtype)


def extract_part(state: Mapping[str, torch.Tensor], source: str, part: str, rank: int,
                 cache: Optional[dict] = None) -> torch.Tensor:
    """The device tensor `part` of global tensor `source` for a device of `rank` (see `device_tensors`)."""
    t = state[source]
    if part == "base":
        return t.detach().clone()
    if part == "A":
        return t.detach()[:rank].clone()
    if part == "B":
        return t.detach()[:, :rank].clone()
    cache = {} if cache is None else cache
    if source not in cache:                       # one SVD serves both factors
        cache[source] = _factors(t, rank)
    return cache[source][0 if part == "U" else 1].clone()


def place(state: Mapping[str, torch.Tensor], updates: Mapping[tuple[str, str], torch.Tensor],
          rank: int) -> tuple[State, State]:
    """Global-shaped (placed, mask) for the low-rank tensors a device trained, by (source, part): adapter
    rows / columns go back where they came from; factors are multiplied back into W (every entry)."""
    placed, mask = {}, {}
    for (source, part), update in updates.items():
        base = state[source].detach()
        if part in ("A", "B"):
            region = (slice(0, rank),) if part == "A" else (slice(None), slice(0, rank))
            expected = base[region].shape
            if update.shape != expected:
                raise ReportRejected(f"LoRA tensor for {source!r} has shape {tuple(update.shape)}, expected {tuple(expected)}")
            p, m = base.clone(), torch.zeros(base.shape, dtype=torch.bool)
            p[region], m[region] = update.to(base.dtype), True
            placed[source], mask[source] = p, m
    for source in sorted({s for s, part in updates if part == "U"}):
        u, v = updates[(source, "U")], updates.get((source, "V"))
        base = state[source]
        if v is None or u.shape != (base.shape[0], rank) or v.shape != (rank, base.shape[1]):
            raise ReportRejected(f"the factors of {source!r} must be {base.shape[0]}x{rank} and {rank}x{base.shape[1]}")
        placed[source] = (u.double() @ v.double()).to(base.dtype)
        mask[source] = torch.ones(base.shape, dtype=torch.bool)
    return placed, mask


def merge(state: Mapping[str, torch.Tensor]) -> State:
    """W = W0 + B A for every adapted linear of the state: the global model after its adapters changed."""
    out = dict(state)
    for key in state:
        if key.startswith(LORA) and key.endswith(".base"):
            path = key[len(LORA): -len(".base")]
            a, b, w0 = state[lora_key(path, "A")], state[lora_key(path, "B")], state[key]
            out[f"{path}.weight"] = (w0.double() + b.double() @ a.double()).to(w0.dtype)
    return out
