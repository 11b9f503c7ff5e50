"""The device agent refuses what it must not run, with the reason, over the real device protocol (the
in-process broker of the in-memory transport speaks it byte for byte)."""
import json
import threading

import pytest

from edgefl.device_runtime.agent import DeviceAgent
from edgefl.device_runtime.link import DeviceLink
from edgefl.messages import RoundInstruction
from edgefl.trainconfig import TrainConfig
from edgefl.transport import topics
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
    assert report.reason.startswith("refused: predicted peak 314572800 B exceeds this device's declared memory")
    assert report.config_hash == _instruction().config_hash


def test_an_instruction_of_another_protocol_version_is_refused(wired):
    ins = _instruction().to_json()
    wired.wire.publish(topics.instruction("pi-1"),
                       json.dumps({"schema": "edgefl.assignment/99", "instruction": ins}).encode())
    (report,) = wired.collect(4, ["pi-1"], timeout_s=10)
    assert report.status == "failed"
    assert "refused" in report.reason and "edgefl.assignment/99" in report.reason
