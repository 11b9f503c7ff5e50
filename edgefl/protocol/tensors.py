"""Tensors on the wire: one flat float32 buffer in a stated order (edgefl.manifest's `flatten` /
`unflatten`: the order a suffix manifest lists its trainable tensors in, or the mapping's own order).
The order travels with the buffer as [{name, shape, dtype}], so a receiver needs nothing else to decode
it and every tensor comes back in its own dtype (counters are exact in float32 below 2**24)."""
from __future__ import annotations

import functools
import json
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from edgefl.errors import ReportRejected
from edgefl.manifest import TensorEntry, flatten, unflatten

DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}


def as_array(t: Any) -> np.ndarray:
    """A numpy view of a numpy array or a (CPU or CUDA) torch tensor, without importing torch."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def order_of(tensors: Mapping[str, Any]) -> tuple[TensorEntry, ...]:
    """The mapping's own order, for tensors no manifest describes (the weights a round sends)."""
    out = []
    for name, t in tensors.items():
        a = as_array(t)
        out.append(TensorEntry(name, name, tuple(int(n) for n in a.shape), a.dtype.name))
    return tuple(out)


def pack(tensors: Mapping[str, Any], order: Optional[Sequence[TensorEntry]] = None) -> tuple[bytes, tuple[TensorEntry, ...]]:
    order = tuple(order) if order is not None else order_of(tensors)
    if missing := [e.name for e in order if e.name not in tensors]:
        raise ValueError(f"tensors missing from the upload: {missing[:3]}")
    if extra := sorted(set(tensors) - {e.name for e in order}):
        raise ValueError(f"tensors not in the stated order: {extra[:3]}")
    buffer = flatten(order, {name: as_array(t) for name, t in tensors.items()})
    return buffer.tobytes(), order


def unpack(buffer: bytes, order: Sequence[TensorEntry]) -> dict[str, np.ndarray]:
    if len(buffer) % 4:
        raise ReportRejected(f"a tensor buffer of {len(buffer)} bytes is not float32")
    return unflatten(order, np.frombuffer(buffer, dtype=np.float32))


def order_to_json(order: Sequence[TensorEntry]) -> list[dict]:
    return [{"name": e.name, "shape": list(e.shape), "dtype": e.dtype} for e in order]


def order_from_json(items: list) -> tuple[TensorEntry, ...]:
    try:
        order = tuple(TensorEntry(str(i["name"]), str(i["name"]), tuple(int(n) for n in i["shape"]),
                                  str(i["dtype"])) for i in items)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportRejected(f"malformed tensor order ({type(exc).__name__}: {exc})") from None
    if bad := [e.name for e in order if e.dtype not in DTYPES or any(n < 0 for n in e.shape)]:
        raise ReportRejected(f"tensor order: bad dtype or shape for {bad[:3]}")
    return order


def shared_order(items: list) -> tuple[TensorEntry, ...]:
    """`order_from_json`, one tuple for every upload that states the same order (a group's devices all do):
    the tensor names of reports waiting to be taken are held once, not once per report."""
    return _order_of(json.dumps(items, separators=(",", ":")))


@functools.lru_cache(maxsize=256)
def _order_of(text: str) -> tuple[TensorEntry, ...]:
    return order_from_json(json.loads(text))


class PackedTensors(Mapping):
    """A report's tensors as they arrived, one flat float32 buffer and its order, unpacked on first use: a
    report that waits to be taken holds its upload's bytes, not an array per tensor. Names and sizes are
    checked here, so unpacking cannot fail later."""

    def __init__(self, buffer: bytes, order: Sequence[TensorEntry]):
        values = sum(e.numel for e in order)
        if len(buffer) != 4 * values:
            raise ReportRejected(f"the tensor buffer holds {len(buffer)} bytes, its order names {values} values")
        if len({e.name for e in order}) != len(order):
            raise ReportRejected("the tensor order names a tensor twice")
        self._buffer: Optional[bytes] = buffer
        self._order = tuple(order)
        self._tensors: Optional[dict[str, np.ndarray]] = None

    def _unpacked(self) -> dict[str, np.ndarray]:
        if self._tensors is None:
            self._tensors, self._buffer = unpack(self._buffer, self._order), None
        return self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        return self._unpacked()[name]

    def __iter__(self) -> Iterator[str]:
        return (e.name for e in self._order)

    def __len__(self) -> int:
        return len(self._order)
