"""Checks on what a device uploads, before any of it can touch the global model.

A report is rejected (`ReportRejected`, with the reason; the round goes on without it) when its tensors
are not exactly the ones its instruction asked it to train: an unknown or missing name, a shape or dtype
other than the one sent, or a NaN/Inf anywhere. `clip_update` optionally bounds the L2 norm of an
update (trained minus sent, over all float tensors together), so one device cannot move the model
arbitrarily far in a round even with well-formed tensors.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import numpy as np

from edgefl.errors import ReportRejected


def _array(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):   # a torch tensor; numpy views it without copying
        t = t.detach().cpu()
    return np.asarray(t)


def check_tensors(device: str, tensors: Mapping[str, Any], expected: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
    """`expected`: name -> (shape, numpy dtype name) of every tensor the device was asked to train."""
    if unknown := sorted(set(tensors) - set(expected)):
        raise ReportRejected(f"{device}: uploaded tensors it was not asked to train: {', '.join(unknown[:3])}")
    if missing := sorted(set(expected) - set(tensors)):
        raise ReportRejected(f"{device}: report lacks trained tensors: {', '.join(missing[:3])}")
    for name, (shape, dtype) in expected.items():
        a = _array(tensors[name])
        if tuple(a.shape) != tuple(shape):
            raise ReportRejected(f"{device}: tensor {name} has shape {tuple(a.shape)}, expected {tuple(shape)}")
        if a.dtype.name != dtype:
            raise ReportRejected(f"{device}: tensor {name} has dtype {a.dtype.name}, expected {dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ReportRejected(f"{device}: tensor {name} contains NaN or Inf")


def expected_of(sent: Mapping[str, Any], names) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtypes of the tensors `names` as they were sent (a device trains them in place)."""
    out = {}
    for name in names:
        a = _array(sent[name])
        out[name] = _shape_dtype(tuple(a.shape), a.dtype.name)
    return out


@functools.lru_cache(maxsize=4096)
def _shape_dtype(shape: tuple[int, ...], dtype: str) -> tuple[tuple[int, ...], str]:
    """One tuple per (shape, dtype): a round's instructions to thousands of devices hold them once."""
    return shape, dtype


def update_norm(sent: Mapping[str, Any], trained: Mapping[str, Any]) -> float:
    total = 0.0
    for name, t in trained.items():
        a = _array(t)
        if a.dtype.kind == "f":
            total += float(np.sum((a.astype(np.float64) - _array(sent[name]).astype(np.float64)) ** 2))
    return math.sqrt(total)


def clip_update(sent: Mapping[str, Any], trained: Mapping[str, Any], max_norm: float) -> tuple[dict, float]:
    """(trained tensors with the update scaled to L2 norm <= max_norm, the update's norm before)."""
    norm = update_norm(sent, trained)
    if norm <= max_norm:
        return dict(trained), norm
    scale = max_norm / norm
    out = {}
    for name, t in trained.items():
        a = _array(t)
        if a.dtype.kind != "f":
            out[name] = t
            continue
        s = _array(sent[name])
        clipped = (s + (a - s) * scale).astype(a.dtype)
        out[name] = type(t)(clipped) if hasattr(t, "detach") else clipped
    return out, norm
