"""A device agent checks its data against each round's artifact set before it starts a trainer: a round on
data the set cannot take is reported failed with a one-line reason naming the data file, and nothing
trains. Real exported sets, the real device protocol over the in-process broker."""
import threading

import numpy as np
import pytest
from export_cases import EXPORTS, RESNET, resnet_config

from edgefl.device_runtime.agent import DeviceAgent
from edgefl.device_runtime.link import DeviceLink
from edgefl.messages import RoundInstruction
from edgefl.transport.memory import InMemoryTransport

pytestmark = EXPORTS

CONFIG = resnet_config(4, 0.25)


def serve_one_round(set_folder, data, tmp_path, meter=None):
    transport = InMemoryTransport()
    lines = []
    agent = DeviceAgent(DeviceLink(transport.connect("pi-1"), "pi-1", tmp_path / "cache"), "pi-1", data, "ort",
                        log=lines.append, meter=meter)
    stop = threading.Event()
    thread = threading.Thread(target=agent.serve, args=(stop, 1), kwargs={"poll_s": 0.05}, daemon=True)
    thread.start()
    try:
        artifact = transport.ship_artifact("pi-1", set_folder)
        transport.send(RoundInstruction(round=1, device_id="pi-1", config=CONFIG, weights_version=0, seed=1, lr=0.05),
                       {}, {"set": artifact})
        (report,) = transport.collect(1, ["pi-1"], timeout_s=120)
    finally:
        stop.set()
        thread.join(timeout=30)
        transport.close()
    return report, lines


@pytest.mark.parametrize("case", ["label-57", "uint8-images", "two-labels-per-image"])
def test_a_round_on_data_the_set_cannot_take_fails_with_the_reason_and_trains_nothing(case, exported, tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 20)
    if case == "label-57":
        y[7] = 57
        file, expect = "y.npy", ["target 57 of example 7", "10 classes"]
    elif case == "uint8-images":
        x = rng.integers(0, 256, x.shape).astype(np.uint8)
        file, expect = "x.npy", ["uint8", "/ 255"]
    else:
        y = rng.integers(0, 10, 40)
        file, expect = "y.npy", ["2 targets per example", "trains on 1"]
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)

    report, lines = serve_one_round(exported("ort", RESNET, CONFIG).folder, data, tmp_path)

    assert report.status == "failed" and report.config_hash == CONFIG.hash()
    assert str(data / file) in report.reason and "\n" not in report.reason
    for needle in expect:
        assert needle in report.reason, report.reason
    assert report.peak_rss_bytes is None and "max_rss_bytes" not in report.metrics   # no trainer was started
    assert any(report.reason in line for line in lines), lines


def test_an_energy_sensor_failing_mid_round_leaves_the_round_trained_and_unmetered(exported, tmp_path):
    """An INA219 that stops answering while the child trains: the round is reported ok without its energy, and the
    log says why (the agent used to die on the meter's error)."""
    from edgefl.hardware.energy import Ina219Meter

    class Gone:       # answers the configuration and the first sample, then the bus fails
        reads = 0

        def write_word(self, address, register, value):
            pass

        def read_word(self, address, register):
            Gone.reads += 1
            if Gone.reads > 1:
                raise OSError("remote I/O error")
            return 100

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", rng.standard_normal((20, 3, 8, 8)).astype(np.float32))
    np.save(data / "y.npy", rng.integers(0, 10, 20))

    report, lines = serve_one_round(exported("ort", RESNET, CONFIG).folder, data, tmp_path,
                                    meter=lambda: Ina219Meter(Gone(), interval_s=0.001))

    assert report.status == "ok" and report.examples == 20 and "energy" not in report.metrics, report.reason
    assert any("remote I/O error" in line and "without its energy" in line for line in lines), lines
