"""Tensors on the wire: one flat float32 buffer in a stated order (edgefl.manifest's `flatten` /
`unflatten`: the order a suffix manifest lists its trainable tensors in, or the mapping's own order).
The order travels with the buffer as [{name, shape, dtype}], so a receiver needs nothing else to decode
it and every tensor comes back in its own dtype (counters are exact in float32 below 2**24)."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

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
