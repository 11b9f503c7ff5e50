import numpy as np
import pytest

from edgefl.errors import ReportRejected
from edgefl.server.validate import check_tensors, clip_update, expected_of, update_norm

SENT = {"layers.3.weight": np.ones((4, 2), np.float32), "layers.3.bn.num_batches_tracked": np.array(5, np.int64)}
EXPECTED = expected_of(SENT, SENT)


def test_a_well_formed_update_passes():
    check_tensors("d", {"layers.3.weight": np.zeros((4, 2), np.float32),
                        "layers.3.bn.num_batches_tracked": np.array(6, np.int64)}, EXPECTED)


@pytest.mark.parametrize("tensors, reason", [
    ({**SENT, "layers.9.weight": np.zeros(1, np.float32)}, "not asked to train: layers.9.weight"),
    ({"layers.3.weight": SENT["layers.3.weight"]}, "lacks trained tensors: layers.3.bn.num_batches_tracked"),
    ({**SENT, "layers.3.weight": np.zeros((2, 4), np.float32)}, r"shape \(2, 4\), expected \(4, 2\)"),
    ({**SENT, "layers.3.weight": np.zeros((4, 2), np.float64)}, "dtype float64, expected float32"),
    ({**SENT, "layers.3.weight": np.full((4, 2), np.nan, np.float32)}, "NaN or Inf"),
    ({**SENT, "layers.3.weight": np.full((4, 2), np.inf, np.float32)}, "NaN or Inf"),
])
def test_each_bad_upload_is_rejected_with_its_reason(tensors, reason):
    with pytest.raises(ReportRejected, match=reason):
        check_tensors("dev-7", tensors, EXPECTED)


def test_clip_scales_the_update_not_the_weights():
    trained = {"layers.3.weight": SENT["layers.3.weight"] + 3.0, "layers.3.bn.num_batches_tracked": np.array(6)}
    norm = update_norm(SENT, trained)
    assert norm == pytest.approx(3.0 * np.sqrt(8))
    clipped, before = clip_update(SENT, trained, max_norm=1.0)
    assert before == pytest.approx(norm)
    assert update_norm(SENT, clipped) == pytest.approx(1.0, rel=1e-6)
    assert clipped["layers.3.bn.num_batches_tracked"] == 6      # counters are not updates
    unchanged, _ = clip_update(SENT, trained, max_norm=100.0)
    np.testing.assert_array_equal(unchanged["layers.3.weight"], trained["layers.3.weight"])


def test_torch_tensors_are_checked_and_clipped_too():
    torch = pytest.importorskip("torch")
    sent = {"w": torch.zeros(3)}
    check_tensors("d", {"w": torch.ones(3)}, expected_of(sent, ["w"]))
    clipped, _ = clip_update(sent, {"w": torch.full((3,), 2.0)}, max_norm=1.0)
    assert isinstance(clipped["w"], torch.Tensor)
    assert float(clipped["w"].norm()) == pytest.approx(1.0, rel=1e-6)
