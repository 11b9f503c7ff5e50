"""The device agent refuses what it must not run, with the reason, over the real device protocol (the
in-process broker of the in-memory transport speaks it byte for byte)."""
import json
import threading

import pytest

from edgefl import topics
from edgefl.device_runtime.agent import DeviceAgent
from edgefl.device_runtime.link import DeviceLink
from edgefl.messages import RoundInstruction
from edgefl.trainconfig import TrainConfig
from edgefl.transport.memory import InMemoryTransport

MiB = 2**20


@pytest.fixture
def wired(tmp_path):
    transport = InMemoryTransport()
    link = DeviceLink(transport.connect("pi-1"), "pi-1", tmp_path / "cache")
    agent = DeviceAgent(link, "pi-1", tmp_path / "data", "ort", memory_bytes=100 * MiB)
    stop = threading.Event()
    thread = threading.Thread(target=agent.serve, args=(stop, 1), kwargs={"poll_s": 0.05}, daemon=True)
    thread.start()
    yield transport
    stop.set()
    thread.join(timeout=10)
    transport.close()


def _instruction(**options) -> RoundInstruction:
    return RoundInstruction(round=4, device_id="pi-1", config=TrainConfig(num_layers=4, frozen_prefix=1),
                            weights_version=3, seed=1, lr=0.05, options=tuple(sorted(options.items())))


def test_an_instruction_over_the_declared_memory_is_refused(wired):
    wired.send(_instruction(predicted_peak_bytes=300 * MiB), {})
    (report,) = wired.collect(4, ["pi-1"], timeout_s=10)
    assert report.status == "failed"
    assert report.reason == "refused: predicted peak 314572800 B exceeds this device's memory 104857600 B (declared " \
                            "with --memory)"
    assert report.config_hash == _instruction().config_hash


@pytest.mark.parametrize("group, predicted, reason", [
    (180, 190, "refused: predicted peak 199229440 B exceeds this device's memory 188743680 B (its group's budget)"),
    (None, 210, "refused: predicted peak 220200960 B exceeds this device's memory 209715200 B (its profile's "
                "default)"),
    (None, 190, "refused: the instruction names no artifact set (roles: [])"),      # 190 fits the profile's 200
])
def test_an_agent_without_memory_holds_its_groups_budget_else_its_profiles(tmp_path, group, predicted, reason):
    """A Pi Zero 2 W profile says 200 MiB; its campus group grants 180 MiB, and the coordinator sends that with
    every instruction: the agent holds 180 MiB (it declared the profile's 200 before, issue 40)."""
    transport = InMemoryTransport()
    link = DeviceLink(transport.connect("pi-1"), "pi-1", tmp_path / "cache")
    agent = DeviceAgent(link, "pi-1", tmp_path / "data", "ort", profile_memory_bytes=200 * MiB)
    assert agent.profile()["memory_bytes"] is None and agent.profile()["profile_memory_bytes"] == 200 * MiB
    options = {"predicted_peak_bytes": predicted * MiB} | ({"memory_budget_bytes": group * MiB} if group else {})
    try:
        stop = threading.Event()
        thread = threading.Thread(target=agent.serve, args=(stop, 1), kwargs={"poll_s": 0.05}, daemon=True)
        thread.start()
        transport.send(_instruction(**options), {})
        (report,) = transport.collect(4, ["pi-1"], timeout_s=10)
        thread.join(timeout=10)
    finally:
        transport.close()
    assert report.status == "failed" and report.reason == reason


def test_an_instruction_of_another_protocol_version_is_refused(wired):
    ins = _instruction().to_json()
    wired.wire.publish(topics.instruction("pi-1"),
                       json.dumps({"schema": "edgefl.assignment/99", "instruction": ins}).encode())
    (report,) = wired.collect(4, ["pi-1"], timeout_s=10)
    assert report.status == "failed"
    assert "refused" in report.reason and "edgefl.assignment/99" in report.reason


@pytest.mark.parametrize("case", ["nan", "negative-label", "text-x", "count"])
def test_the_agent_refuses_bad_data_at_start_before_connecting(case, tmp_path):
    """Checked without a model: numbers, no NaN/inf, integer labels from 0 (-100 ignored), as many
    targets as examples. The broker address is closed: a refusal must come before any connection."""
    import subprocess
    import sys

    import numpy as np

    x, y = np.zeros((8, 3, 8, 8), np.float32), np.arange(8) % 10
    if case == "nan":
        x[6, 0, 0, 0] = np.nan
        file, expect = "x.npy", ["example 6", "NaN or infinity"]
    elif case == "negative-label":
        y[1] = -7
        file, expect = "y.npy", ["target -7 of example 1", "-100 to ignore"]
    elif case == "text-x":
        x = np.array(["a"] * 8)
        file, expect = "x.npy", ["<U1", "float32"]
    else:
        y = np.arange(5)
        file, expect = "y.npy", ["x has 8 examples and y 5 targets"]
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "run", "--id", "pi-1", "--broker",
                        "mqtt://127.0.0.1:9", "--data", str(data), "--runtime", "ort", "--energy", "profile",
                        "--power", "3W", "--cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=60)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "broker" not in lines[0] and str(data / file) in lines[0], lines[0]
    for needle in expect:
        assert needle in lines[0], lines[0]


def test_a_flat_upload_travels_as_it_is_and_the_peak_is_settled_once_its_chunks_are_out(tmp_path):
    """The agent hands the link its training process's flat buffer (no second whole copy) and takes its own peak
    again once the chunks are acknowledged, so that the round's report counts the upload's copies (it used to
    read its VmHWM before the upload, and each report carried the previous round's)."""
    import numpy as np

    from edgefl.manifest import TensorEntry
    from edgefl.messages import DeviceReport

    transport = InMemoryTransport()
    link = DeviceLink(transport.connect("pi-1"), "pi-1", tmp_path / "cache")
    order = (TensorEntry("w", "w", (3, 100_000), "float32"), TensorEntry("n", "n", (), "int64"))
    flat = np.arange(300_001, dtype=np.float32)
    sent_when_settled = []

    def settle(report):
        sent_when_settled.append(link.wire.sent.payload_bytes)
        report.peak_rss_bytes = 123 * MiB

    try:
        transport.send(_instruction(), {})
        link.next_instruction(timeout_s=10)
        link.report(DeviceReport(round=4, device_id="pi-1", config_hash=_instruction().config_hash, status="ok",
                                 examples=8, peak_rss_bytes=1), order, flat=flat, settle=settle)
        (report,) = transport.collect(4, ["pi-1"], timeout_s=10)
    finally:
        transport.close()
    assert sent_when_settled[0] >= flat.nbytes          # every chunk was out before the peak was taken
    assert report.peak_rss_bytes == 123 * MiB
    np.testing.assert_array_equal(report.tensors["w"], flat[:300_000].reshape(3, 100_000))
    assert report.tensors["n"] == 300_000 and report.tensors["n"].dtype == np.int64
