"""The transport contract: the in-memory transport and the MQTT transport (a real mosquitto started per
test) pass the same tests, device side (`DeviceLink`) and coordinator side (`WireTransport`) alike.

Both brokers hold packets to LIMIT bytes and artifacts travel in CHUNK-byte chunks, so multi-chunk
artifacts and reports stay small and the packet limit is reachable."""
import hashlib
import math
import os
import time

import numpy as np
import pytest
from mosquitto import Mosquitto

from edgefl import topics
from edgefl.device_runtime.cache import ArtifactCache
from edgefl.device_runtime.link import DeviceLink
from edgefl.device_runtime.mqtt_link import MqttLink
from edgefl.errors import ArtifactError, TransportError
from edgefl.manifest import PREFIX_DIR, ArtifactSet, IOSpec, Manifest, OptimizerSpec
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import WINDOW
from edgefl.protocol.mqtt_wire import MqttWire
from edgefl.protocol.tensors import pack
from edgefl.trainconfig import TrainConfig
from edgefl.transport.memory import InMemoryTransport
from edgefl.transport.mqtt import MqttTransport

GRACE_S = 1.0     # a refused upload or a dropped device is waited for this long: short in tests

CHUNK = 64 * 1024
LIMIT = 256 * 1024
STALL_S = 1.0


class MemoryHarness:
    def __init__(self, tmp):
        self.server = InMemoryTransport(max_packet_size=LIMIT, chunk_size=CHUNK, grace_s=GRACE_S)

    def link(self, device, cache):
        return DeviceLink(self.server.connect(device), device, cache, stall_s=STALL_S)

    def inject(self, topic, payload, retain=False):
        wire = self.server.hub.connect("intruder")
        wire.publish(topic, payload, retain)
        wire.close()

    def observer(self):
        return self.server.hub.connect("observer", persistent=False)

    def close(self):
        self.server.close()


class MqttHarness:
    def __init__(self, tmp):
        self.broker = Mosquitto(tmp / "broker", max_packet_size=LIMIT).start()
        self.server = MqttTransport(self.broker.url, chunk_size=CHUNK, grace_s=GRACE_S)

    def link(self, device, cache):
        return MqttLink(self.broker.url, device, None, cache, stall_s=STALL_S)

    def inject(self, topic, payload, retain=False):
        wire = MqttWire(self.broker.url, "intruder")
        wire.publish(topic, payload, retain)
        assert wire.flush(5)
        wire.close()

    def observer(self):
        return MqttWire(self.broker.url, "observer", session_expiry_s=0)

    def close(self):
        self.server.close()
        self.broker.stop()


@pytest.fixture(params=["memory", "mqtt"])
def harness(request, tmp_path):
    h = (MemoryHarness if request.param == "memory" else MqttHarness)(tmp_path)
    links = []
    real_link = h.link

    def link(device="d1", cache=None):
        links.append(real_link(device, cache or tmp_path / f"cache-{device}"))
        return links[-1]
    h.link = link
    yield h
    for lk in links:
        lk.abort()
    h.close()


def instruction(device="d1", round=1, **options):
    return RoundInstruction(round=round, device_id=device, config=TrainConfig(num_layers=4, frozen_prefix=2),
                            weights_version=round - 1, seed=7, lr=0.05, options=tuple(sorted(options.items())))


def weights():
    return {"layers.2.weight": np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6),
            "layers.2.bn.num_batches_tracked": np.array(41, dtype=np.int64),
            "layers.3.bias": np.arange(3, dtype=np.float32)}


def blob(chunks: int) -> bytes:
    return os.urandom(chunks * CHUNK - 123)   # the last chunk is a short one


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------ instructions
def test_instruction_and_weights_arrive_as_sent(harness):
    link = harness.link()
    sent = instruction(widths=[1.0, 0.5])
    harness.server.send(sent, weights())
    job = link.next_instruction(timeout_s=5)
    assert job.instruction == sent
    received = link.weights(job, timeout_s=5)
    assert list(received) == list(weights())              # the stated order
    for name, value in weights().items():
        assert received[name].dtype == value.dtype and np.array_equal(received[name], value)


def test_next_instruction_times_out_with_none(harness):
    link = harness.link()
    t0 = time.monotonic()
    assert link.next_instruction(timeout_s=0.3) is None
    assert 0.3 <= time.monotonic() - t0 < 2


# ------------------------------------------------------------------------------------------- artifacts
def test_artifact_arrives_verified_and_a_cached_one_is_not_fetched_again(harness):
    link = harness.link()
    data = blob(5)
    artifact = harness.server.ship("d1", data)
    assert artifact == hashlib.sha256(data).hexdigest()
    assert link.fetch(artifact, timeout_s=10).read_bytes() == data
    assert link.stats.chunks_accepted == 5 and link.stats.corrupt_chunks == 0
    before = link.wire.received.copy()
    assert link.fetch(artifact, timeout_s=10).read_bytes() == data
    assert link.wire.received == before                   # served from the cache: nothing downloaded


def fetch_cut_at(link, artifact: str, chunks: int, tmp_path) -> int:
    """Fetch until `chunks` chunks are held, then drop the connection as a crash would; the chunks device
    d1's cache kept for the resume."""
    def cut(held, total):
        if held == chunks:
            link.abort()
    with pytest.raises(TransportError, match="resumes"):
        link.fetch(artifact, timeout_s=10, progress=cut)
    return len(ArtifactCache(tmp_path / "cache-d1").partial(artifact).held)


def test_fetch_resumes_after_a_forced_disconnect_mid_artifact(harness, tmp_path):
    data, n = blob(12), 12
    artifact = harness.server.ship("d1", data)
    first = harness.link()
    held = fetch_cut_at(first, artifact, 3, tmp_path)
    assert held == 3

    second = harness.link()
    assert second.fetch(artifact, timeout_s=10).read_bytes() == data
    assert second.stats.chunks_accepted == n - held       # only the missing chunks were taken
    assert harness.server.artifacts.chunks_sent <= n + WINDOW   # and only they (plus those in flight) were sent


def test_corrupt_chunk_is_fetched_again(harness):
    data = blob(12)
    artifact = harness.server.ship("d1", data)
    link = harness.link()

    def corrupt_the_last(held, total):
        if held == 1:  # chunk 11 cannot be out yet: a window of 8 needs 4 more acknowledgements
            harness.inject(topics.artifact_chunk("d1", artifact, 11), os.urandom(len(data) - 11 * CHUNK))
    assert link.fetch(artifact, timeout_s=10, progress=corrupt_the_last).read_bytes() == data
    assert link.stats.corrupt_chunks == 1 and link.stats.chunks_accepted == 12


def test_duplicate_chunks_are_ignored(harness):
    data = blob(12)
    artifact = harness.server.ship("d1", data)
    link = harness.link()

    def repeat_the_first(held, total):
        if held == 1:
            harness.inject(topics.artifact_chunk("d1", artifact, 0), data[:CHUNK])
    assert link.fetch(artifact, timeout_s=10, progress=repeat_the_first).read_bytes() == data
    assert link.stats.duplicate_chunks >= 1 and link.stats.chunks_accepted == 12


def test_an_artifact_not_offered_to_the_device_is_refused(harness):
    link = harness.link()
    other = harness.server.ship("d2", blob(1))
    with pytest.raises(ArtifactError, match="not offered"):
        link.fetch(other, timeout_s=10)


def exported(folder, suffix_bytes: bytes, prefix_bytes: bytes):
    """A minimal artifact set as export writes it: suffix manifest + file, prefix manifest + file in prefix/."""
    (folder / PREFIX_DIR).mkdir(parents=True)
    (folder / PREFIX_DIR / "model.pte").write_bytes(prefix_bytes)
    (folder / "training.pte").write_bytes(suffix_bytes)
    common = dict(backend="executorch", versions={}, model={"name": "cnn"}, config={}, config_hash="c0ffee", files=(),
                  inputs=(IOSpec("x", ("batch", 8), "float32"),))
    prefix = Manifest(kind="prefix", outputs=(IOSpec("h", ("batch", 8), "float32"),), **common)
    prefix = prefix.with_files(folder / PREFIX_DIR, {"model.pte": "program"})
    prefix.write(folder / PREFIX_DIR)
    suffix = Manifest(kind="suffix", outputs=(IOSpec("loss", (), "float32"),), prefix_id=prefix.id,
                      optimizer=OptimizerSpec(), **common).with_files(folder, {"training.pte": "program"})
    suffix.write(folder)
    return suffix.id


def test_an_artifact_set_arrives_as_a_folder_and_an_unchanged_prefix_only_once(harness, tmp_path):
    link = harness.link()
    prefix = os.urandom(3 * CHUNK)
    first = exported(tmp_path / "round1", os.urandom(CHUNK // 2), prefix)
    assert harness.server.ship_artifact("d1", tmp_path / "round1") == first
    folder = link.fetch_artifact(first, timeout_s=10)
    opened = ArtifactSet.open(folder)                      # every file checked against the manifests again
    assert opened.prefix.id == opened.suffix.prefix_id
    assert (folder / PREFIX_DIR / "model.pte").read_bytes() == prefix

    before = link.wire.received.copy()
    second = exported(tmp_path / "round2", os.urandom(CHUNK // 2), prefix)
    harness.server.ship_artifact("d1", tmp_path / "round2")
    ArtifactSet.open(link.fetch_artifact(second, timeout_s=10))
    moved = link.wire.received.since(before).payload_bytes
    assert CHUNK // 2 < moved < CHUNK                      # the new suffix and manifests; the prefix stayed


# --------------------------------------------------------------------------------------------- reports
def test_report_arrives_with_its_tensors_and_measured_bytes(harness):
    link = harness.link()
    sent = instruction()
    harness.server.send(sent, weights())
    job = link.next_instruction(timeout_s=5)
    w = link.weights(job, timeout_s=5)
    trained = {"layers.2.weight": w["layers.2.weight"] * 3,
               "layers.2.big": np.random.default_rng(0).standard_normal(100_000).astype(np.float32),  # 400 kB: chunks
               "layers.2.bn.num_batches_tracked": np.array(42, dtype=np.int64)}
    report = DeviceReport(round=1, device_id="d1", config_hash=sent.config_hash, status="ok", examples=17,
                          loss_before=2.0, loss_after=1.5, tensors=trained, metrics={"widths": [1.0]})
    upload = link.report(report)
    [got] = harness.server.collect(1, ["d1"], timeout_s=10)
    got.check(sent)
    assert (got.examples, got.loss_after, got.metrics["widths"]) == (17, 1.5, [1.0])
    for name, value in trained.items():
        assert got.tensors[name].dtype == value.dtype and np.array_equal(got.tensors[name], value)
    assert got.upload_bytes == 4 * (24 + 100_000 + 1)      # one flat float32 buffer
    traffic = got.metrics["transport"]
    assert traffic["upload"] == upload.to_json()          # what the device sent is what arrived
    assert traffic["upload"]["messages"] == 3              # two chunks and the meta message
    assert traffic["upload"]["wire_bytes"] > traffic["upload"]["payload_bytes"] > got.upload_bytes
    assert got.download_bytes == traffic["download"]["payload_bytes"] > 4 * (24 + 1 + 3)
    assert traffic["download"]["wire_bytes"] > got.download_bytes


def test_an_upload_that_does_not_verify_becomes_a_failed_report(harness):
    buffer, order = pack({"w": np.ones(4, np.float32)})
    report = DeviceReport(round=1, device_id="d1", config_hash="abc", status="ok", examples=1, upload="0" * 16)
    harness.server.send(instruction(), {})             # tensors are taken only for a round the device was sent
    harness.inject(topics.result_chunk("d1", 1, report.upload, 0), buffer[:-1] + b"\x00")   # changed on the way
    harness.inject(topics.result_meta("d1", 1, report.upload), envelopes.upload_meta(
        report, order, len(buffer), hashlib.sha256(buffer).hexdigest(), 1, {}))
    report.device_id = "d2"                                                       # someone else's topic
    harness.inject(topics.result_meta("d1", 2, "1" * 16), envelopes.upload_meta(
        report, (), 0, hashlib.sha256().hexdigest(), 0, {}))
    [bad] = harness.server.collect(1, ["d1"], timeout_s=10)
    assert (bad.status, bad.tensors) == (ReportStatus.REJECTED, {}) and "does not match its size and sha256" in bad.reason
    [spoofed] = harness.server.collect(2, ["d1"], timeout_s=10)
    assert spoofed.status is ReportStatus.REJECTED and "claims 'd2'" in spoofed.reason


def test_collect_returns_when_all_reports_are_in_or_at_the_timeout(harness):
    a, b = harness.link("a"), harness.link("b")
    for device in ("a", "b"):
        harness.server.send(instruction(device), weights())
    ok = {}
    for link in (a, b):
        job = link.next_instruction(timeout_s=5)
        ok[link.device_id] = DeviceReport(round=1, device_id=link.device_id, config_hash=job.instruction.config_hash,
                                          status="ok", examples=3, tensors=link.weights(job, timeout_s=5))
    a.report(ok["a"])
    t0 = time.monotonic()
    reports = harness.server.collect(1, ["a", "b"], timeout_s=0.6)
    assert [r.device_id for r in reports] == ["a"]
    assert 0.6 <= time.monotonic() - t0 < 3

    harness.server.send(instruction("b", round=2), {})
    assert b.next_instruction(timeout_s=5).weights is None
    b.report(DeviceReport(round=2, device_id="b", config_hash=ok["b"].config_hash, status="failed", reason="oom"))
    t0 = time.monotonic()
    [late] = harness.server.collect(2, ["b"], timeout_s=30)
    assert time.monotonic() - t0 < 5 and (late.status, late.reason) == ("failed", "oom")


def test_oversize_payload_is_refused_before_publish(harness):
    link = harness.link()
    with pytest.raises(TransportError, match="max_packet_size"):
        harness.server.send(instruction(note="x" * LIMIT), weights())
    harness.server.send(instruction(), weights())           # the connection is still good
    job = link.next_instruction(timeout_s=5)
    assert job.instruction == instruction()
    report = DeviceReport(round=1, device_id="d1", config_hash=job.instruction.config_hash, status="ok", examples=1,
                          metrics={"log": "y" * LIMIT})
    with pytest.raises(TransportError, match="max_packet_size"):
        link.report(report)
    report.metrics = {}
    link.report(report)
    assert [r.device_id for r in harness.server.collect(1, ["d1"], timeout_s=10)] == ["d1"]


# -------------------------------------------------------------------------------------------- presence
def test_presence_is_announced_and_the_last_will_marks_a_lost_device_offline(harness):
    link = harness.link()
    link.announce({"ram_bytes": 512 << 20, "runtime": "ort"})
    assert harness.server.wait_online(["d1"], timeout_s=5) == {"d1": {"ram_bytes": 512 << 20, "runtime": "ort"}}
    link.abort()
    wait_until(lambda: "d1" not in harness.server.online())


# --------------------------------------------------------------------------------------- group sharing
def artifact_bytes(traffic_topics, kind):
    """Payload bytes of artifact messages (manifests and chunks) among (topic, bytes) pairs, by where they went."""
    return sum(n for t, n in traffic_topics if (p := topics.parse(t)) and p.kind in ("manifest", "chunk")
               and (p.group is not None) == (kind == "group"))


def record_sent(wire):
    """Every (topic, payload bytes) `wire` publishes from now on."""
    sent, publish = [], wire.publish

    def counting(topic, payload, retain=False):
        publish(topic, payload, retain)
        sent.append((topic, len(payload)))
    wire.publish = counting
    return sent


def retained_under(harness, topic_filter, settle_s=1.0):
    """The retained messages a new subscriber to `topic_filter` gets: {topic: payload}."""
    got = {}
    wire = harness.observer()
    wire.on_message(lambda topic, payload, _: got.__setitem__(topic, payload) if payload else got.pop(topic, None))
    wire.subscribe([topic_filter])
    time.sleep(settle_s)
    wire.close()
    return got


def test_what_a_group_shares_is_published_once_per_group_and_fetched_from_there(harness):
    harness.server.share_by_group({"a1": "A", "a2": "A", "b1": "B"})
    links = [harness.link(d) for d in ("a1", "a2", "b1")]
    w = {"big": np.random.default_rng(1).standard_normal(5 * CHUNK // 4).astype(np.float32)}   # 5 chunks
    sent = record_sent(harness.server.wire)
    for link in links:
        harness.server.send(instruction(link.device_id), w)
    for link in links:
        job = link.next_instruction(timeout_s=5)
        assert job.shared == {job.weights.artifact: "B" if link.device_id == "b1" else "A"}
        assert np.array_equal(link.weights(job, timeout_s=10)["big"], w["big"])
        assert link.stats.wants == 0 and link.stats.chunks_accepted == 5     # nothing asked of the coordinator
    assert artifact_bytes(sent, "device") == 0 and harness.server.artifacts.chunks_sent == 0
    size = 4 * w["big"].size
    assert 2 * size < artifact_bytes(sent, "group") < 2 * size + 2048           # once per group: two groups
    assert harness.server.artifacts.group_chunks_published == 2 * 5
    # no acknowledgements, yet the live view sees each device download: it says so when it has the file
    wait_until(lambda: all(a["bytes"] == size and a["state"] == "downloading"
                           for a in harness.server.activity.snapshot()["devices"].values()))


def test_a_device_resumes_a_group_fetch_from_the_retained_copy(harness, tmp_path):
    harness.server.share_by_group({"d1": "A"})
    data = blob(12)
    first = harness.link()
    artifact = harness.server.ship("d1", data, name="program")
    harness.server.send(instruction(), {})
    assert first.next_instruction(timeout_s=5).shared == {artifact: "A"}

    held = fetch_cut_at(first, artifact, 4, tmp_path)
    assert 4 <= held < 12

    second = harness.link()
    harness.server.ship("d1", data, name="program")     # the next instruction names it again
    harness.server.send(instruction(round=2), {})
    assert second.next_instruction(timeout_s=5).shared == {artifact: "A"}
    assert second.fetch(artifact, timeout_s=10).read_bytes() == data
    assert second.stats.chunks_accepted == 12 - held and second.stats.wants == 0
    assert harness.server.artifacts.chunks_sent == 0 and harness.server.artifacts.group_chunks_published == 12


def shipped_to_group(harness, chunks: int):
    """Device d1 of group A, told of an artifact of `chunks` chunks that group A's topics hold."""
    harness.server.share_by_group({"d1": "A"})
    data = blob(chunks)
    link = harness.link()
    artifact = harness.server.ship("d1", data, name="program")
    harness.server.send(instruction(), {})
    link.next_instruction(timeout_s=5)
    return link, data, artifact


def test_a_corrupt_or_missing_group_chunk_is_sent_by_the_coordinator(harness):
    link, data, artifact = shipped_to_group(harness, 6)
    harness.inject(topics.group_chunk("A", artifact, 2), os.urandom(CHUNK), retain=True)   # replaced on the broker
    assert link.fetch(artifact, timeout_s=15).read_bytes() == data
    assert link.stats.corrupt_chunks == 1 and link.stats.chunks_accepted == 6
    assert harness.server.artifacts.chunks_sent == 1                # only that one, on the device's own topic


def test_a_group_whose_topics_hold_nothing_falls_back_to_the_coordinator(harness):
    link, data, artifact = shipped_to_group(harness, 3)
    harness.server.artifacts.retire(before_round=math.inf)     # as a broker that lost them, or an ACL without them
    # the clearing publishes reach the broker before the device subscribes (else, on a busy machine, the broker
    # still holds the group's chunks and the fetch takes them from there)
    assert harness.server.wire.flush(5)
    t0 = time.monotonic()
    assert link.fetch(artifact, timeout_s=15).read_bytes() == data
    assert 3 * STALL_S <= time.monotonic() - t0 < 3 * STALL_S + 5     # the group wait: 3 x stall_s
    assert harness.server.artifacts.chunks_sent == 3


def test_what_differs_within_a_group_travels_per_device(harness, tmp_path):
    """Federated Dropout's random slices: a set whose suffix differs per device and whose prefix does not."""
    harness.server.share_by_group({"a1": "A", "a2": "A"})
    a1, a2 = harness.link("a1"), harness.link("a2")
    prefix = os.urandom(2 * CHUNK)
    sets = {d: exported(tmp_path / d, os.urandom(CHUNK), prefix) for d in ("a1", "a2")}
    for link in (a1, a2):
        harness.server.send(instruction(link.device_id), {"w": np.full(3, int(link.device_id[1]), np.float32)},
                            artifacts={"set": harness.server.ship_artifact(link.device_id, tmp_path / link.device_id)})
    jobs = {link.device_id: link.next_instruction(timeout_s=5) for link in (a1, a2)}
    prefix_ids = {ArtifactSet.open(tmp_path / "a1").prefix.id, hashlib.sha256(prefix).hexdigest()}
    assert set(jobs["a1"].shared) > prefix_ids                 # the first device: all through the group
    assert set(jobs["a2"].shared) == prefix_ids                # then only what is the same for both
    for link in (a1, a2):
        ArtifactSet.open(link.fetch_artifact(sets[link.device_id], timeout_s=10))
        link.weights(jobs[link.device_id], timeout_s=10)
    assert harness.server.artifacts.chunks_sent == 3           # a2's own suffix, manifest and weights, to a2 only
    harness.server.collect(1, ["a1", "a2"], timeout_s=0.1)

    harness.server.send(instruction("a1", round=2), {"w": np.zeros(3, np.float32)})
    assert a1.next_instruction(timeout_s=5).shared == {}      # the weights differed in round 1: per device now


def test_what_a_round_no_longer_offers_is_cleared_from_the_broker(harness):
    harness.server.share_by_group({"d1": "A"})
    link = harness.link()
    old, new = (harness.server.ship("d1", blob(2), name=name) for name in ("old", "new"))   # round 1 ships both
    harness.server.send(instruction(), {})
    harness.server.collect(1, ["d1"], timeout_s=0.1)
    assert set(retained_under(harness, "fl/v1/group/A/#")) == {
        topics.group_manifest("A", a) for a in (old, new)} | {topics.group_chunk("A", a, s) for a in (old, new)
                                                                for s in (0, 1)}
    harness.server.ship("d1", link.fetch(new, timeout_s=10).read_bytes(), name="new")   # round 2: only new
    harness.server.send(instruction(round=2), {})
    harness.server.collect(2, ["d1"], timeout_s=0.1)
    assert {topics.parse(t).sha for t in retained_under(harness, "fl/v1/group/A/#")} == {new}
    newer = harness.server.ship("d1", blob(1), name="new")               # round 3: the next version of it
    assert {topics.parse(t).sha for t in retained_under(harness, "fl/v1/group/A/#")} == {newer}   # at once
    harness.server.close()
    assert retained_under(harness, "fl/v1/group/#") == {}
