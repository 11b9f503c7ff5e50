"""Issue 6 acceptance, against a real mosquitto running the config `edgefl broker config` wrote:
devices are kept apart by the ACL (tested by delivery, each with a positive control that proves the
message would have arrived had it been allowed), wrong logins are refused, and with --tls only clients
holding the generated CA get in."""
from __future__ import annotations

import ssl

import pytest

from broker_fixture import Client, credentials, edgefl, free_port, mosquitto_path, running, write_fleet

A, B = "dev-a", "dev-b"


def _deploy(tmp_path_factory, *extra):
    root = tmp_path_factory.mktemp("broker")
    port = free_port()
    out = root / "deploy"
    r = edgefl("broker", "config", "--devices", write_fleet(root, [A, B, "dev-c"]), "-o", out,
               "--port", port, "--bind", "127.0.0.1", *extra)
    assert r.returncode == 0, r.stderr
    return out, port


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    out, port = _deploy(tmp_path_factory)
    with running([mosquitto_path(), "-c", "mosquitto.conf"], out, port):
        yield out, port


@pytest.fixture
def login(broker):
    out, port = broker
    clients = []

    def connect(user, **kw):
        c = Client(port, user, credentials(out, user)["password"], **kw)
        assert not c.connect().is_failure
        clients.append(c)
        return c
    yield connect
    for c in clients:
        c.close()


def assert_nothing_from(received, *prefixes):
    leaked = [t for t, _ in received if t.startswith(prefixes)]
    assert not leaked, f"delivered against the ACL: {leaked}"


def test_a_device_cannot_read_another_devices_downlink(login):
    coordinator, a, b = login("coordinator"), login(A), login(B)
    a.subscribe(f"fl/v1/dev/{B}/down/#", "fl/v1/dev/+/down/#", "#")
    b.subscribe(f"fl/v1/dev/{B}/down/#")
    coordinator.publish(f"fl/v1/dev/{B}/down/instr", b"secret for b")
    coordinator.publish(f"fl/v1/dev/{B}/down/artifact/{'0' * 64}/c/0", b"b's weights")
    coordinator.publish(f"fl/v1/dev/{A}/down/instr", b"for a")           # the control: A may read this
    assert_nothing_from(a.wait_for(f"fl/v1/dev/{A}/down/instr", b"for a"), f"fl/v1/dev/{B}/")
    b.wait_for(f"fl/v1/dev/{B}/down/instr", b"secret for b")             # and B did get its own


def test_a_device_cannot_forge_another_devices_reports(login):
    coordinator, a = login("coordinator"), login(A)
    coordinator.subscribe("fl/v1/#")
    a.publish(f"fl/v1/dev/{B}/up/result/3/meta", b"forged report")
    a.publish(f"fl/v1/dev/{B}/up/ack", b"forged ack")
    a.publish(f"fl/v1/presence/{B}", b"forged presence")
    a.publish(f"fl/v1/dev/{A}/up/result/3/meta", b"own report")           # the control
    assert_nothing_from(coordinator.wait_for(f"fl/v1/dev/{A}/up/result/3/meta", b"own report"),
                        f"fl/v1/dev/{B}/", f"fl/v1/presence/{B}")


def test_a_device_cannot_send_instructions_or_broadcasts(login):
    coordinator, a, b = login("coordinator"), login(A), login(B)
    b.subscribe(f"fl/v1/dev/{B}/down/#", "fl/v1/broadcast/#")
    a.publish(f"fl/v1/dev/{B}/down/instr", b"forged instruction")
    a.publish("fl/v1/broadcast/round", b"forged round")
    coordinator.publish("fl/v1/broadcast/round", b"round 4")             # the control: devices read broadcasts
    received = b.wait_for("fl/v1/broadcast/round", b"round 4")
    assert (f"fl/v1/dev/{B}/down/instr", b"forged instruction") not in received
    assert ("fl/v1/broadcast/round", b"forged round") not in received


def test_a_device_cannot_read_another_devices_uplink(login):
    coordinator, a, b = login("coordinator"), login(A), login(B)
    a.subscribe(f"fl/v1/dev/{B}/up/#", "fl/v1/presence/#", f"fl/v1/dev/{A}/down/#")
    coordinator.subscribe(f"fl/v1/dev/{B}/up/#")
    b.publish(f"fl/v1/dev/{B}/up/metrics", b"b's loss")
    coordinator.wait_for(f"fl/v1/dev/{B}/up/metrics", b"b's loss")      # B's upload went through...
    coordinator.publish(f"fl/v1/dev/{A}/down/instr", b"marker")
    assert_nothing_from(a.wait_for(f"fl/v1/dev/{A}/down/instr", b"marker"), f"fl/v1/dev/{B}/", "fl/v1/presence/")


def test_a_crashed_devices_last_will_reaches_the_coordinator(broker, login):
    out, port = broker
    coordinator = login("coordinator")
    coordinator.subscribe("fl/v1/presence/#")
    a = Client(port, A, credentials(out, A)["password"], will=f"fl/v1/presence/{A}")
    assert not a.connect().is_failure
    a.drop()
    coordinator.wait_for(f"fl/v1/presence/{A}", b"offline")


def test_a_will_on_another_devices_presence_never_arrives(broker, login):
    out, port = broker
    coordinator = login("coordinator")
    coordinator.subscribe("fl/v1/presence/#")
    forger = Client(port, A, credentials(out, A)["password"], will=f"fl/v1/presence/{B}")
    if not forger.connect().is_failure:       # mosquitto may refuse the will at CONNECT or drop it later
        forger.drop()
    honest = Client(port, "dev-c", credentials(out, "dev-c")["password"], will="fl/v1/presence/dev-c")
    assert not honest.connect().is_failure
    honest.drop()
    assert_nothing_from(coordinator.wait_for("fl/v1/presence/dev-c", b"offline"), f"fl/v1/presence/{B}")


@pytest.mark.parametrize("user,password", [(A, "wrong-password"), ("coordinator", ""), ("intruder", "x"),
                                           (None, None)], ids=["wrong", "empty", "unknown-user", "anonymous"])
def test_bad_logins_are_refused(broker, user, password):
    out, port = broker
    rc = Client(port, user, password).connect()
    assert rc.is_failure and rc.getName() in ("Bad user name or password", "Not authorized"), rc


def test_the_right_login_with_mqtt_311_also_works(broker):
    out, port = broker
    c = Client(port, A, credentials(out, A)["password"], protocol=3)   # MQTTv311
    try:
        assert not c.connect().is_failure
    finally:
        c.close()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    out, port = _deploy(tmp_path_factory, "--tls", "--host", "127.0.0.1")
    with running([mosquitto_path(), "-c", "mosquitto.conf"], out, port):
        yield out, port


def test_tls_client_with_the_ca_connects_and_talks(tls_broker):
    out, port = tls_broker
    ca = out / "tls" / "ca.crt"
    coordinator = Client(port, "coordinator", credentials(out, "coordinator")["password"], ca=ca)
    a = Client(port, A, credentials(out, A)["password"], ca=ca)
    try:
        assert not coordinator.connect().is_failure and not a.connect().is_failure
        a.subscribe(f"fl/v1/dev/{A}/down/#")
        coordinator.publish(f"fl/v1/dev/{A}/down/instr", b"over tls")
        a.wait_for(f"fl/v1/dev/{A}/down/instr", b"over tls")
    finally:
        coordinator.close()
        a.close()


def test_tls_client_without_the_ca_is_refused(tls_broker):
    out, port = tls_broker
    c = Client(port, A, credentials(out, A)["password"], tls_default_cas=True)
    with pytest.raises(ssl.SSLCertVerificationError):
        c.connect()


def test_plain_client_on_the_tls_port_is_refused(tls_broker):
    out, port = tls_broker
    c = Client(port, A, credentials(out, A)["password"])
    try:
        assert c.connect().is_failure
    finally:
        c.close()


def test_the_transport_runs_over_the_generated_tls_deployment(tls_broker, tmp_path):
    """The coordinator's MqttTransport and a device's MqttLink, each with its generated login: a 3 MiB
    model goes down and its update comes up, chunked, under the generated packet limit, which leaves
    room for a whole chunk as the transport frames it."""
    import numpy as np

    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.messages import DeviceReport, RoundInstruction
    from edgefl.trainconfig import TrainConfig
    from edgefl.transport import topics
    from edgefl.transport.chunks import CHUNK_SIZE
    from edgefl.transport.mqtt import MqttTransport
    from edgefl.transport.wire import publish_packet_bytes

    out, port = tls_broker
    url, ca = f"mqtts://127.0.0.1:{port}", out / "tls" / "ca.crt"
    coordinator = MqttTransport(url, out / "credentials" / "coordinator.json", ca_file=ca)
    link = MqttLink(url, A, out / "credentials" / f"{A}.json", tmp_path / "cache", ca_file=ca)
    try:
        limit = int(next(line.split()[1] for line in (out / "mosquitto.conf").read_text().splitlines()
                         if line.startswith("max_packet_size")))
        assert link.wire.max_packet_size == limit          # what the broker announced to the device
        assert limit >= publish_packet_bytes(topics.artifact_chunk(A, "f" * 64, 10**6), CHUNK_SIZE)
        weights = {"layer.weight": np.arange(3 * 2**18 + 5, dtype=np.float32)}
        instruction = RoundInstruction(round=1, device_id=A, config=TrainConfig(num_layers=2), weights_version=1,
                                       seed=0, lr=0.1)
        coordinator.send(instruction, weights)
        got = link.weights(link.next_instruction(10), 20)
        assert np.array_equal(got["layer.weight"], weights["layer.weight"])
        link.report(DeviceReport(round=1, device_id=A, config_hash=instruction.config_hash, status="ok",
                                 examples=10, tensors={"layer.weight": got["layer.weight"] * 2}))
        [report] = coordinator.collect(1, [A], 20)
        assert np.array_equal(report.tensors["layer.weight"], weights["layer.weight"] * 2)
    finally:
        link.close()
        coordinator.close()
