"""What the coordinator's end of the protocol refuses to hold, on both transports (the in-process hub and a
real mosquitto): tensors for a round it did not send the device, an upload past the instruction's
`upload_bytes` (refused before the rest of it arrives), and a second report of a device, which is handed
on beside the first instead of replacing it."""
import numpy as np
import pytest
from mosquitto import Mosquitto

from edgefl.device_runtime.link import DeviceLink
from edgefl.device_runtime.mqtt_link import MqttLink
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.trainconfig import TrainConfig
from edgefl.transport.memory import InMemoryTransport
from edgefl.transport.mqtt import MqttTransport
from edgefl.transport.uploads import UPLOAD_REJECTED

GRACE_S = 1.0     # a refused upload or a dropped device is waited for this long: short in tests

LIMIT = 256 * 1024          # the broker's packet limit: uploads travel in chunks of just under it


@pytest.fixture(params=["memory", "mqtt"])
def pair(request, tmp_path):
    """(coordinator end, device link factory)."""
    links = []
    if request.param == "memory":
        server = InMemoryTransport(max_packet_size=LIMIT, grace_s=GRACE_S)
        broker = None

        def link(device):
            links.append(DeviceLink(server.connect(device), device, tmp_path / device))
            return links[-1]
    else:
        broker = Mosquitto(tmp_path / "broker", max_packet_size=LIMIT).start()
        server = MqttTransport(broker.url, grace_s=GRACE_S)

        def link(device):
            links.append(MqttLink(broker.url, device, None, tmp_path / device))
            return links[-1]
    yield server, link
    for lk in links:
        lk.abort()
    server.close()
    if broker is not None:
        broker.stop()


def instruction(device: str, round: int, **options) -> RoundInstruction:
    return RoundInstruction(round=round, device_id=device, config=TrainConfig(num_layers=4, frozen_prefix=2),
                            weights_version=round - 1, seed=7, lr=0.05, options=tuple(sorted(options.items())))


def report(device: str, round: int, values: int = 1000, fill: float = 1.0) -> DeviceReport:
    return DeviceReport(round=round, device_id=device, config_hash=instruction(device, round).config_hash,
                        status="ok", examples=8, tensors={"w": np.full(values, fill, np.float32)})


def test_an_upload_past_its_expected_bytes_is_refused_before_the_rest_is_held(pair):
    server, link = pair
    d1 = link("d1")
    server.send(instruction("d1", 1, upload_bytes=4000), {})
    d1.report(report("d1", 1, values=1_000_000))       # 4 MB, 16 chunks, for 4000 bytes expected
    [refused] = server.collect(1, ["d1"], timeout_s=20)
    assert refused.status is ReportStatus.REJECTED
    assert refused.reason == f"{UPLOAD_REJECTED}: more than the 3.91 KiB of tensors its instruction expects"
    # it stopped holding at the first chunk past the limit: what it counted is that chunk and the meta
    assert refused.upload_bytes < LIMIT + 4096


def test_an_upload_of_exactly_the_expected_bytes_passes(pair):
    server, link = pair
    d1 = link("d1")
    server.send(instruction("d1", 1, upload_bytes=4000), {})
    d1.report(report("d1", 1, values=1000))
    [ok] = server.collect(1, ["d1"], timeout_s=20)
    assert ok.ok and ok.upload_bytes == 4000 and np.array_equal(ok.tensors["w"], np.ones(1000, np.float32))


def test_reports_for_rounds_not_sent_to_the_device_are_refused_in_the_round_they_arrive(pair):
    server, link = pair
    d1, stranger = link("d1"), link("stranger")
    server.send(instruction("d1", 1), {})
    d1.report(report("d1", 2))                         # round 2 has not started
    stranger.report(report("stranger", 1))            # never sent an instruction
    d1.report(report("d1", 1))
    reports = server.collect(1, ["d1"], timeout_s=20)
    assert (reports[0].device_id, reports[0].round, reports[0].ok) == ("d1", 1, True)
    assert sorted((r.device_id, r.round, r.ok) for r in reports[1:]) == [("d1", 2, False), ("stranger", 1, False)]
    reasons = {r.device_id: r.reason for r in reports[1:]}
    assert reasons == {"d1": f"{UPLOAD_REJECTED}: no instruction for round 2 has been sent yet",
                       "stranger": f"{UPLOAD_REJECTED}: stranger was not sent an instruction for round 1"}

    server.send(instruction("d1", 2), {})
    d1.report(report("d1", 1))                         # round 1 is closed
    d1.report(report("d1", 2))
    got = server.collect(2, ["d1"], timeout_s=20)
    assert [(r.device_id, r.round, r.ok) for r in got] == [("d1", 2, True), ("d1", 1, False)]
    assert got[1].reason == f"{UPLOAD_REJECTED}: round 1 is closed"


def test_a_second_report_of_a_round_is_handed_on_and_never_replaces_the_first(pair):
    server, link = pair
    d1 = link("d1")
    server.send(instruction("d1", 1), {})
    d1.report(report("d1", 1, fill=1.0))
    d1.report(report("d1", 1, fill=2.0))
    d1.report(report("d1", 1, fill=1.0))               # a replay of the first
    seen = []
    # d2 never answers: the round stays open to its deadline, by which time all three are in
    reports = server.collect(1, ["d1", "d2"], timeout_s=1.5, on_report=seen.append)
    assert [float(r.tensors["w"][0]) for r in reports] == [1.0, 2.0, 1.0]
    assert [float(r.tensors["w"][0]) for r in seen] == [1.0]      # only the answer is journaled


def test_a_failed_round_without_tensors_is_taken_wherever_it_is_sent(pair):
    """A device's refusal of an instruction it could not read (it has no tensors) still reaches the round."""
    server, link = pair
    d1 = link("d1")
    d1.report(DeviceReport(round=4, device_id="d1", config_hash="", status="failed", reason="refused: schema"))
    [failed] = server.collect(4, ["d1"], timeout_s=20)
    assert (failed.status, failed.reason) == ("failed", "refused: schema")


@pytest.mark.parametrize("field,value", [("loss_after", "low"), ("loss_after", float("nan")), ("reason", None),
                                         ("peak_rss_bytes", [1])])
def test_a_report_whose_summary_fields_have_the_wrong_type_is_refused(pair, field, value):
    server, link = pair
    d1 = link("d1")
    server.send(instruction("d1", 1), {})
    bad = report("d1", 1)
    setattr(bad, field, value)
    d1.report(bad)
    [refused] = server.collect(1, ["d1"], timeout_s=20)
    assert refused.status is ReportStatus.REJECTED and refused.reason.startswith(f"{UPLOAD_REJECTED}: malformed report"), refused
