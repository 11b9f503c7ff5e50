"""A report's tensors wait to be taken as the bytes they arrived in: one buffer per report, one order per
distinct order, unpacked when first read."""
import numpy as np
import pytest

from edgefl.errors import ReportRejected
from edgefl.protocol.tensors import PackedTensors, order_to_json, pack, shared_order

TENSORS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "steps": np.array(7, dtype=np.int64)}


def test_packed_tensors_name_without_unpacking_and_unpack_once_read():
    buffer, order = pack(TENSORS)
    packed = PackedTensors(buffer, order)
    assert list(packed) == ["w", "steps"] and len(packed) == 2 and packed._tensors is None
    assert np.array_equal(packed["w"], TENSORS["w"]) and packed["steps"].dtype == np.int64
    assert packed._buffer is None                       # the bytes are let go once unpacked
    assert {k: v.tolist() for k, v in packed.items()} == {k: v.tolist() for k, v in TENSORS.items()}


def test_a_buffer_that_does_not_hold_its_order_is_refused_before_anything_reads_it():
    buffer, order = pack(TENSORS)
    with pytest.raises(ReportRejected, match="order names 7 values"):
        PackedTensors(buffer[:-4], order)
    with pytest.raises(ReportRejected, match="twice"):
        PackedTensors(buffer + buffer, order + order)


def test_uploads_with_the_same_order_share_it():
    _, order = pack(TENSORS)
    first, second = (shared_order(order_to_json(order)) for _ in range(2))
    assert first is second and first == order
