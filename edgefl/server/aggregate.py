"""The round's running aggregate (imports torch): each device's contribution is folded in as it arrives and
dropped, so the server holds one float64 sum per trained tensor, never every upload of a round.

A contribution is what `edgefl.server.submodel.embed` makes of an upload: (n_k, placed x_k, mask m_k), n_k the
device's local example count. Entry by entry, with the global value w:

'trained' (FedOLF alg. 1, ProFL eq. 1, FeDepth, HeteroFL / FjORD / FedRolex / FD slices, LoRA ranks): the
    weighted mean over the devices that trained it,
    w'[e] = sum_k n_k m_k[e] x_k[e] / sum_k n_k m_k[e],   and w'[e] = w[e] where no device trained e;
'sampled' (CoCoFL / CAFF eq. 5, layer-wise): every device of the round counts, with the global value where
    it did not train e,   w'[e] = (sum_k n_k m_k[e] x_k[e] + (N - sum_k n_k m_k[e]) w[e]) / N,  N = sum_k n_k.

Both are sums, so they fold one contribution at a time. Integer tensors (BN num_batches_tracked) take the
max over the devices that trained them, else the global value. LoRA-adapted weights are then set to their
base plus the new adapters' product (`edgefl.server.lowrank.merge`).

Reproducibility: the sums are float64 and cast to the tensor's dtype once, in `result`. The denominators are
sums of example counts, exact in any order; the numerators are float64 sums whose rounding depends on the
order devices arrive in, which changes a float32 result at most in its last bit, and only in the rare entries
whose float64 value lies that close to a float32 rounding boundary. Folded in device order (the in-process
engine's arrival order) the result is bit-identical to summing the same contributions in a batch.
"""
from __future__ import annotations

from typing import Mapping, cast

import torch

from edgefl.server import lowrank

State = dict[str, torch.Tensor]
Contribution = tuple[float, State, State]      # (local example count, placed, mask) from `embed`
MODES = ("trained", "sampled")


def _whole(mask: torch.Tensor) -> bool:
    """True for embed's mask of a tensor trained whole: one True broadcast over the shape (all strides 0),
    told apart without reading every element."""
    return mask.numel() > 0 and not any(mask.stride()) and bool(mask[(0,) * mask.dim()])


class RunningAggregate:
    """`add` folds one contribution into per-tensor sums over `global_state` (read, never written);
    `result` is the new global state. Per floating tensor a contribution touched it holds sum n_k m_k x_k
    (float64) and sum n_k m_k: one number while every mask on it was whole, per element once one was not;
    per integer tensor the running max and where it was trained."""

    def __init__(self, global_state: Mapping[str, torch.Tensor], mode: str = "trained"):
        if mode not in MODES:
            raise ValueError(f"unknown aggregation mode {mode!r}")
        self.global_state, self.mode = global_state, mode
        self.count = 0              # contributions folded
        self.total = 0.0            # sum n_k over them: the 'sampled' denominator
        self._num: dict[str, torch.Tensor] = {}
        self._den: dict[str, float | torch.Tensor] = {}
        self._best: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}    # integer tensors: (max, trained)

    def add(self, contribution: Contribution) -> None:
        n, placed, mask = contribution
        n = float(n)
        if n < 0:
            raise ValueError(f"example counts must be >= 0, got {n}")
        if placed.keys() != mask.keys():
            raise ValueError("placed and mask name different tensors")
        if unknown := sorted(placed.keys() - self.global_state.keys()):
            raise KeyError(f"{unknown[:3]} not in the global state; add new auxiliary heads with ensure_aux")
        for key, p in placed.items():
            g, m = self.global_state[key], mask[key]
            if not g.is_floating_point():
                low = torch.full(g.shape, torch.iinfo(g.dtype).min, dtype=g.dtype)
                best, trained = self._best.get(key, (low, torch.zeros(g.shape, dtype=torch.bool)))
                self._best[key] = (torch.maximum(best, torch.where(m, p.to(g.dtype), low)), trained | m)
                continue
            num = self._num.setdefault(key, torch.zeros(g.shape, dtype=torch.float64))
            den = self._den.get(key, 0.0)
            if _whole(m):
                num.add_(p, alpha=n)
                den = den + n if isinstance(den, float) else den.add_(n)
            else:
                num.add_(torch.where(m, p.double(), 0.0), alpha=n)
                den = torch.full(g.shape, den, dtype=torch.float64) if isinstance(den, float) else den
                den.add_(m.double(), alpha=n)
            self._den[key] = den
        self.count += 1
        self.total += n

    def result(self) -> State:
        """The new global state: a new dict; tensors no contribution touched are the global ones."""
        if self.count and self.total <= 0:
            raise ValueError(f"example counts must have a positive sum, got {self.total}")
        new = {}
        for key, g in self.global_state.items():
            if key in self._best:
                best, trained = self._best[key]
                new[key] = torch.where(trained, best, g)
            elif key not in self._num:
                new[key] = g
            else:
                num, den, g64 = self._num[key], self._den[key], g.detach().double()
                if self.mode == "trained" and isinstance(den, float):
                    out = num / den if den > 0 else g64
                elif self.mode == "trained":
                    den = cast(torch.Tensor, den)      # a tensor where devices trained different parts of it
                    out = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), g64)
                else:
                    out = (num + (self.total - den) * g64) / self.total
                new[key] = out.to(g.dtype)
        return lowrank.merge(new)
