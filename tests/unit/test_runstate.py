import json

import numpy as np
import pytest

from edgefl.errors import StorageError
from edgefl.messages import DeviceReport
from edgefl.server.runstate import RunState


class Step:
    def __init__(self):
        self.current = 0


def test_checkpoint_round_trip_and_old_files_pruned(tmp_path):
    state = RunState(tmp_path)
    assert state.load() is None
    strategy = Step()
    for r in (1, 2):
        strategy.current = r
        state.save(r, {"w": np.full(3, float(r), np.float32)}, strategy, [{"round": i} for i in range(1, r + 1)])
    round, weights, loaded, history = state.load()
    assert round == 2 and loaded.current == 2 and history == [{"round": 1}, {"round": 2}]
    np.testing.assert_array_equal(weights["w"], np.full(3, 2.0, np.float32))
    assert sorted(p.name for p in tmp_path.glob("weights-*.npz")) == ["weights-2.npz"]


def test_journal_survives_until_its_round_is_checkpointed(tmp_path):
    state = RunState(tmp_path)
    report = DeviceReport(round=3, device_id="pi-1", config_hash="abc", status="ok", examples=7, loss_after=0.5,
                          tensors={"layers.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3)},
                          peak_rss_bytes=123, metrics={"energy": {"joules": 1.5}})
    state.journal(report)
    again = list(RunState(tmp_path).journaled(3))   # a fresh coordinator process reads what the dead one accepted
    assert len(again) == 1
    got = again[0]
    assert (got.device_id, got.examples, got.loss_after, got.peak_rss_bytes, got.metrics) == \
        ("pi-1", 7, 0.5, 123, {"energy": {"joules": 1.5}})
    np.testing.assert_array_equal(got.tensors["layers.0.weight"], report.tensors["layers.0.weight"])
    state.save(3, {"w": np.zeros(1)}, Step(), [])
    assert list(state.journaled(3)) == [] and state.journaled_devices(3) == []


def test_a_checkpoint_pointer_is_written_last(tmp_path):
    state = RunState(tmp_path)
    state.save(1, {"w": np.zeros(1)}, Step(), [{"round": 1}])
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    assert (tmp_path / meta["weights"]).exists() and (tmp_path / meta["strategy"]).exists()


def test_corrupt_state_is_a_one_line_error(tmp_path):
    state = RunState(tmp_path)
    state.save(1, {"w": np.zeros(1)}, Step(), [])
    (tmp_path / "weights-1.npz").write_bytes(b"not a zip")
    with pytest.raises(StorageError, match="weights-1.npz: does not match its sha256 in .*checkpoint.json"):
        state.load()
