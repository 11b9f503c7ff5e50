"""Issue 6 acceptance, against a real mosquitto running the config `edgefl broker config` wrote:
devices are kept apart by the ACL (tested by delivery, each with a positive control that proves the
message would have arrived had it been allowed), wrong logins are refused, and with --tls only clients
holding the generated CA get in."""
from __future__ import annotations

import shutil
import ssl
import subprocess

import pytest
from broker_fixture import Client, credentials, edgefl, free_port, mosquitto_path, running, write_fleet

A, B = "dev-a", "dev-b"


def _deploy(tmp_path_factory, *extra):
    root = tmp_path_factory.mktemp("broker")
    port = free_port()
    out = root / "deploy"
    r = edgefl("broker", "config", "--devices", write_fleet(root, [A, B, "dev-c"]), "-o", out,
               "--port", port, "--bind", "127.0.0.1", *(extra or ("--plain",)))
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

    from edgefl import topics
    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.messages import DeviceReport, RoundInstruction
    from edgefl.protocol.chunks import CHUNK_SIZE
    from edgefl.protocol.wire import publish_packet_bytes
    from edgefl.trainconfig import TrainConfig
    from edgefl.transport.mqtt import MqttTransport

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


# ------------------------------------------------------------------------ groups' shared topics
GROUPS = {"lab": [A, B], "field": ["dev-c"]}


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory):
    """A deployment of a two-group fleet: the ACL gives each device its own group's shared topics."""
    root = tmp_path_factory.mktemp("groups")
    fleet = root / "fleet.yaml"
    fleet.write_text("fleet:\n  name: two\n  groups:\n" + "".join(
        f"    {g}: {{ids: [{', '.join(ids)}], memory_budget: 512MiB}}\n" for g, ids in GROUPS.items()))
    port, out = free_port(), root / "deploy"
    r = edgefl("broker", "config", "--devices", fleet, "-o", out, "--port", port, "--bind", "127.0.0.1", "--plain")
    assert r.returncode == 0, r.stderr
    with running([mosquitto_path(), "-c", "mosquitto.conf"], out, port):
        yield out, port


def mosquitto_sub(out, port, user, topic, count=1):
    """A third-party client (Debian's mosquitto_sub) with `user`'s login: what it prints in 3 s, and its exit status."""
    r = subprocess.run([shutil.which("mosquitto_sub") or "/usr/bin/mosquitto_sub", "-h", "127.0.0.1", "-p", str(port),
                        "-u", user, "-P", credentials(out, user)["password"], "-t", topic, "-v", "-C", str(count),
                        "-W", "3"], capture_output=True, text=True, timeout=20)
    return r.returncode, r.stdout


def test_a_device_reads_its_own_groups_shared_topics_and_no_other_groups(group_broker):
    out, port = group_broker
    sha = "e" * 64
    coordinator = Client(port, "coordinator", credentials(out, "coordinator")["password"])
    assert not coordinator.connect().is_failure
    try:
        for group in GROUPS:       # retained, as the coordinator publishes a group's artifacts
            coordinator.c.publish(f"fl/v1/group/{group}/art/{sha}/manifest", f"{group}'s set".encode(), qos=1,
                                  retain=True).wait_for_publish(5)
        rc, printed = mosquitto_sub(out, port, A, f"fl/v1/group/lab/art/{sha}/manifest")
        assert rc == 0 and printed.strip() == f"fl/v1/group/lab/art/{sha}/manifest lab's set"
        rc, printed = mosquitto_sub(out, port, A, f"fl/v1/group/field/art/{sha}/manifest")
        assert rc != 0 and printed == ""                       # granted, then filtered: nothing comes
        rc, printed = mosquitto_sub(out, port, A, "fl/v1/group/#", count=2)
        assert rc != 0 and printed.strip() == f"fl/v1/group/lab/art/{sha}/manifest lab's set"   # only its own
        rc, printed = mosquitto_sub(out, port, "dev-c", "fl/v1/group/#", count=2)
        assert printed.strip() == f"fl/v1/group/field/art/{sha}/manifest field's set"
    finally:
        coordinator.close()


def test_a_device_cannot_write_its_groups_shared_topics(group_broker):
    out, port = group_broker
    topic = f"fl/v1/group/lab/art/{'f' * 64}/c/0"
    a, coordinator = (Client(port, u, credentials(out, u)["password"]) for u in (A, "coordinator"))
    assert not a.connect().is_failure and not coordinator.connect().is_failure
    try:
        a.c.publish(topic, b"forged chunk", qos=1, retain=True).wait_for_publish(5)
        coordinator.c.publish(topic + "1", b"the control", qos=1, retain=True).wait_for_publish(5)
        rc, printed = mosquitto_sub(out, port, B, f"fl/v1/group/lab/art/{'f' * 64}/c/+", count=2)
        assert printed.strip() == f"{topic}1 the control"     # B, of the same group, never sees A's forgery
    finally:
        a.close()
        coordinator.close()


def test_the_transport_shares_each_groups_weights_over_the_generated_acl(group_broker, tmp_path):
    """The coordinator publishes a group's weights once on its topics; each device of the group fetches them
    from there with its own login (no chunk is asked of the coordinator), a device of the other group from
    its group's."""
    import numpy as np

    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.messages import RoundInstruction
    from edgefl.trainconfig import TrainConfig
    from edgefl.transport.mqtt import MqttTransport

    out, port = group_broker
    url = f"mqtt://127.0.0.1:{port}"
    coordinator = MqttTransport(url, out / "credentials" / "coordinator.json")
    coordinator.share_by_group({d: g for g, ids in GROUPS.items() for d in ids})
    links = [MqttLink(url, d, out / "credentials" / f"{d}.json", tmp_path / d) for d in (A, B, "dev-c")]
    try:
        weights = {"w": np.arange(3 * 2**18, dtype=np.float32)}      # 3 MiB: several chunks
        before = coordinator.wire.sent.copy()
        for link in links:
            coordinator.send(RoundInstruction(round=1, device_id=link.device_id, config=TrainConfig(num_layers=2),
                                              weights_version=0, seed=0, lr=0.1), weights)
        for link in links:
            assert np.array_equal(link.weights(link.next_instruction(10), 30)["w"], weights["w"])
            assert link.stats.wants == 0                          # all of it from the group's topics
        sent = coordinator.wire.sent.since(before).payload_bytes
        assert 2 * weights["w"].nbytes < sent < 2.01 * weights["w"].nbytes   # once per group, not per device
    finally:
        for link in links:
            link.close()
        coordinator.close()
