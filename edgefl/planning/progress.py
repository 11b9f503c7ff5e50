"""ProFL's block freezing determination (sec. 3.3): effective movement and its least-squares slope.

For a scalar s of a block B with update U_s^k = s^k - s^{k-1} at round k, its movement over the last H
rounds is D_{s,k}^H = |sum_{h=0}^{H-1} U_s^{k-h}|; the block's is D_{B,k}^H = sum_{s in B} D_{s,k}^H. The
effective movement normalises it by the distance travelled,

    EM_k = D_{B,k}^H / sum_{s in B} sum_{h=0}^{H-1} |U_s^{k-h}|    (in [0, 1]; 0 when nothing moved),

near 1 while every scalar moves steadily one way and near 0 once they oscillate around an optimum. A
block freezes once EM has flattened: the least-squares slope of EM over the last `window` evaluations is
below phi in magnitude, |slope| < phi, for W consecutive evaluations. The paper's "slope below phi" (sec.
3.3) read with its sign would freeze on any falling EM, i.e. while the block still converges fast; the
paper means the converged, flat state ("approach 0", sec. 3.3; EM "decreases until reaching a converged
state", sec. 4.4). An evaluation is a round k with at least H + window - 1 earlier rounds.

No torch: snapshots are arrays, tensors (anything numpy converts) or dicts of them (a block's state).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _flat(snapshot: Any) -> np.ndarray:
    if isinstance(snapshot, dict):
        return np.concatenate([_flat(snapshot[k]) for k in sorted(snapshot)]) if snapshot else np.zeros(0)
    return np.asarray(snapshot, dtype=np.float64).ravel()


def _updates(history: Sequence[Any]) -> np.ndarray:
    """U^k for k = 1..K, one float64 row each; built pair by pair so that no stack of every snapshot in
    float64 is held beside them (a VGG-11 block is 8.3M scalars: 66 MB a row)."""
    if len(history) < 2:
        return np.zeros((0, _flat(history[0]).size if len(history) else 0))
    previous = _flat(history[0])
    updates = np.empty((len(history) - 1, previous.size))
    for row, snapshot in zip(updates, history[1:]):
        current = _flat(snapshot)
        np.subtract(current, previous, out=row)
        previous = current
    return updates


def movement_series(history: Sequence[Any], H: int) -> list[float]:
    """EM_k for every round k >= H of a block's snapshots history[0..K] (one per round)."""
    if H < 1:
        raise ValueError(f"H must be >= 1, got {H}")
    updates = _updates(history)                             # updates[k - 1] = U^k
    distance = np.abs(updates)                              # each |U| once, not once per window holding it
    out = []
    for k in range(H, len(history)):
        travelled = distance[k - H: k].sum()
        out.append(float(np.abs(updates[k - H: k].sum(axis=0)).sum() / travelled) if travelled > 0 else 0.0)
    return out


def effective_movement(history: Sequence[Any], H: int) -> float:
    """EM at the last round of `history` (needs H + 1 snapshots)."""
    if len(history) < H + 1:
        raise ValueError(f"effective movement over H={H} rounds needs {H + 1} snapshots, got {len(history)}")
    return movement_series(history[-(H + 1):], H)[-1]


def slope(values: Sequence[float]) -> float:
    """Linear least-squares slope of values against 0, 1, 2, ..."""
    y = np.asarray(values, dtype=np.float64)
    if y.size < 2:
        raise ValueError("a slope needs at least two values")
    x = np.arange(y.size) - (y.size - 1) / 2
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def slopes(history: Sequence[Any], H: int, window: int = 5) -> list[float]:
    """The slope at each evaluation: over the last `window` effective movements."""
    return trend(movement_series(history, H), window)


def trend(movements: Sequence[float], window: int = 5) -> list[float]:
    """The slope at each evaluation of an EM series (movement_series's): a caller that asks for EM, its
    slopes and the freeze decision in one round computes the series once (12 s a round on VGG-11's second
    block when each question recomputed it)."""
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    return [slope(movements[i - window: i]) for i in range(window, len(movements) + 1)]


def is_flat(trend_values: Sequence[float], W: int, phi: float) -> bool:
    """True when the last W slopes are all below phi in magnitude."""
    if W < 1:
        raise ValueError(f"W must be >= 1, got {W}")
    recent = list(trend_values)[-W:]
    return len(recent) == W and all(abs(s) < phi for s in recent)


def should_freeze(history: Sequence[Any], H: int, W: int, phi: float, window: int = 5) -> bool:
    """True when EM stayed flat, |slope| < phi, for the last W consecutive evaluations."""
    return is_flat(slopes(history, H, window), W, phi)
