"""edgefl.broker pieces: mosquitto's password hash, the ACL and MQTT matching, device-id checks, the
packet limit, credentials that survive re-runs, TLS files, private file modes, the launcher's choice."""
from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys

import pytest

from edgefl.broker.acl import COORDINATOR, fleet_acl, may_subscribe, parse_acl, permits, render_acl
from edgefl.broker.credentials import sync_credentials
from edgefl.broker.files import write_file
from edgefl.broker.launch import broker_command
from edgefl.broker.mosquitto_conf import (CHUNK_BYTES, CONTROL_HEADROOM, ListenerSettings, packet_limit, read_conf,
                                          render_conf)
from edgefl.broker.passwords import hash_password, parse_password_file, render_password_file, verify_password
from edgefl.errors import ConfigError, MissingDependencyError
from edgefl.topics import check_device_id, filter_covered
from edgefl.topics import matches as topic_matches


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- passwords ---------------------------------------------------------------------------------

def test_hash_round_trip_and_format():
    h = hash_password("s3cret")
    assert h.startswith("$7$101$") and len(h.split("$")) == 5
    assert verify_password("s3cret", h) and not verify_password("s3cret!", h)
    assert hash_password("s3cret") != h                       # a fresh salt each time


def test_reads_what_mosquitto_passwd_writes(tmp_path):
    tool = shutil.which("mosquitto_passwd")
    assert tool, "mosquitto_passwd (Debian package mosquitto) is needed to cross-check the hash format"
    path = tmp_path / "pw"
    subprocess.run([tool, "-b", "-c", str(path), "alice", "pa:ss word"], check=True)
    hashes = parse_password_file(path.read_text())
    assert verify_password("pa:ss word", hashes["alice"]) and not verify_password("pass word", hashes["alice"])
    # and mosquitto_passwd keeps our line as it is when it adds another user to the file
    ours = hash_password("bob-password")
    path.write_text(render_password_file({"alice": hashes["alice"], "bob": ours}))
    subprocess.run([tool, "-b", str(path), "carol", "x"], check=True)
    assert parse_password_file(path.read_text())["bob"] == ours


@pytest.mark.parametrize("bad", ["", "plain", "$6$salt$hash", "$7$0$AAAA$AAAA", "$7$x$AAAA$AAAA",
                                 "$7$101$!!$AAAA", "$7$101$AAAA$", "$7$²$AAAA$AAAA"])
def test_malformed_hashes_never_verify(bad):
    assert not verify_password("", bad)


# --- ACL -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,topic,expected", [
    ("fl/v1/#", "fl/v1", True), ("fl/v1/#", "fl/v1/dev/a/up/x", True), ("fl/v1/#", "fl/v2/x", False),
    ("fl/v1/dev/a/up/#", "fl/v1/dev/a/up", True), ("fl/v1/dev/a/up/#", "fl/v1/dev/ab/up/x", False),
    ("fl/v1/+/x", "fl/v1/a/x", True), ("fl/v1/+/x", "fl/v1/a/b/x", False), ("fl/v1/+", "fl/v1", False),
    ("#", "$SYS/broker", False), ("+/x", "$SYS/x", False), ("fl/v1/presence/a", "fl/v1/presence/a", True),
])
def test_topic_matching_follows_mqtt(pattern, topic, expected):
    assert topic_matches(pattern, topic) is expected


@pytest.mark.parametrize("pattern,sub,expected", [
    ("fl/v1/dev/a/down/#", "fl/v1/dev/a/down/#", True), ("fl/v1/dev/a/down/#", "fl/v1/dev/a/down/+/c/1", True),
    ("fl/v1/dev/a/down/#", "fl/v1/dev/+/down/#", False), ("fl/v1/dev/a/down/#", "fl/v1/#", False),
    ("fl/v1/dev/a/down/#", "#", False), ("fl/v1/+/x", "fl/v1/+/x", True), ("fl/v1/+/x", "fl/v1/#", False),
])
def test_subscription_must_be_covered_by_a_read_rule(pattern, sub, expected):
    assert filter_covered(pattern, sub) is expected


def test_fleet_acl_separates_devices():
    acl = fleet_acl(["a", "b"])
    assert list(acl) == [COORDINATOR, "a", "b"]
    a = acl["a"]
    assert permits(a, "write", "fl/v1/dev/a/up/result/3/c/0") and permits(a, "write", "fl/v1/presence/a")
    assert permits(a, "read", "fl/v1/dev/a/down/instr") and permits(a, "read", "fl/v1/broadcast/round")
    for topic in ("fl/v1/dev/b/up/ack", "fl/v1/dev/a/down/instr", "fl/v1/broadcast/round", "fl/v1/presence/b"):
        assert not permits(a, "write", topic), topic
    for topic in ("fl/v1/dev/b/down/instr", "fl/v1/dev/a/up/ack", "fl/v1/presence/a"):
        assert not permits(a, "read", topic), topic
    assert may_subscribe(a, "fl/v1/dev/a/down/#") and not may_subscribe(a, "fl/v1/dev/+/down/#")
    assert permits(acl[COORDINATOR], "write", "fl/v1/dev/b/down/instr")
    assert permits(acl[COORDINATOR], "read", "fl/v1/dev/b/up/ack")
    assert not permits(acl[COORDINATOR], "read", "other/topic")


def test_a_device_reads_its_own_groups_shared_topics_only():
    acl = fleet_acl(["a1", "a2", "b1"], {"a1": "lab", "a2": "lab", "b1": "field"})
    shared = f"fl/v1/group/lab/art/{'0' * 64}/c/3"
    assert permits(acl["a1"], "read", shared) and permits(acl["a2"], "read", shared)
    assert not permits(acl["b1"], "read", shared) and permits(acl["b1"], "read", "fl/v1/group/field/art/x/manifest")
    assert not any(permits(acl[d], "write", shared) for d in ("a1", "b1"))      # only the coordinator publishes there
    assert may_subscribe(acl["a1"], "fl/v1/group/lab/art/+/c/+") and not may_subscribe(acl["a1"], "fl/v1/group/#")
    assert permits(acl[COORDINATOR], "write", shared)
    assert not any(r.topic.startswith("fl/v1/group/") for r in fleet_acl(["a1"])["a1"])   # no group, no rule
    assert parse_acl(render_acl(acl)) == acl
    with pytest.raises(ConfigError, match="rename the group"):
        fleet_acl(["a1"], {"a1": "the lab"})


def test_acl_file_round_trip_and_refuses_what_it_does_not_write():
    acl = fleet_acl(["dev-1", "lab.pi_5"])
    assert parse_acl(render_acl(acl)) == acl
    with pytest.raises(ConfigError, match="line 2"):
        parse_acl("user a\npattern read fl/v1/dev/%u/down/#\n")
    with pytest.raises(ConfigError, match="line 1"):
        parse_acl("topic read fl/v1/#\n")        # a rule before any user


@pytest.mark.parametrize("bad", ["a/b", "a+", "#", "a:b", "a b", "a\tb", "$sys", "", "a\x00", "\ud800", "x" * 5000])
def test_device_ids_that_would_break_topics_or_files_are_refused(bad):
    with pytest.raises(ConfigError, match="rename it"):
        check_device_id(bad)


def test_device_ids_must_not_take_the_coordinators_login():
    with pytest.raises(ConfigError, match="coordinator"):
        fleet_acl(["a", COORDINATOR])
    assert check_device_id("lab-pi5.a_1") == "lab-pi5.a_1"


# --- packet limit and mosquitto.conf ---------------------------------------------------------------

def test_packet_limit_covers_a_chunk_and_its_framing():
    limit = packet_limit(["d" * 40])
    longest_topic = len(f"fl/v1/dev/{'d' * 40}/down/artifact/{'0' * 64}/c/4294967296")
    assert limit.bytes >= CHUNK_BYTES + longest_topic + 2 + 2 + 5
    assert packet_limit(["d" * 400]).bytes - limit.bytes == 360       # grows with the longest topic only
    small = packet_limit(["d"], largest_transfer=100_000)
    assert small.bytes < packet_limit(["d"]).bytes and small.bytes > 100_000 + CONTROL_HEADROOM
    assert packet_limit(["d"], largest_transfer=5 * CHUNK_BYTES).bytes == packet_limit(["d"]).bytes
    assert packet_limit(["d"], override=8 * CHUNK_BYTES).bytes == 8 * CHUNK_BYTES
    for bad in (10, 300 * 2**20):
        with pytest.raises(ConfigError, match="--max-packet-size"):
            packet_limit(["d"], override=bad)


def test_conf_lines(tmp_path):
    text = render_conf(ListenerSettings(8883, "10.0.0.2", True), packet_limit(["a"]), devices=1000, user="broker")
    (tmp_path / "mosquitto.conf").write_text(text)
    conf = read_conf(tmp_path / "mosquitto.conf")
    assert conf["listener"] == ["8883 10.0.0.2"] and conf["certfile"] == ["tls/server.crt"]
    assert conf["cafile"] == ["tls/ca.crt"] and conf["keyfile"] == ["tls/server.key"]
    assert conf["max_packet_size"] == [str(packet_limit(["a"]).bytes)] and "message_size_limit" not in conf
    assert int(conf["max_queued_messages"][0]) >= 1000 * 8 and conf["user"] == ["broker"]
    with pytest.raises(ConfigError, match="edgefl broker config"):
        read_conf(tmp_path / "absent.conf")


# --- credentials and files ---------------------------------------------------------------------------

def test_credentials_are_kept_added_removed_and_rotated(tmp_path):
    folder = tmp_path / "credentials"
    first, changes = sync_credentials(folder, ["coordinator", "a", "b"], rotate=False)
    assert changes.new == ["coordinator", "a", "b"] and mode(folder) == 0o700
    assert all(mode(folder / f"{u}.json") == 0o600 for u in first)
    again, changes = sync_credentials(folder, ["coordinator", "b", "c"], rotate=False)
    assert changes.kept == ["coordinator", "b"] and changes.new == ["c"] and changes.removed == ["a"]
    assert again["b"] == first["b"] and not (folder / "a.json").exists()
    rotated, changes = sync_credentials(folder, ["coordinator", "b", "c"], rotate=True)
    assert changes.rotated == ["coordinator", "b", "c"] and rotated["b"] != again["b"]
    assert json.loads((folder / "b.json").read_text()) == {"username": "b", "password": rotated["b"]}


@pytest.mark.parametrize("content", ["not json", '{"username": "a"}', '{"username": "a", "password": ""}',
                                     '{"username": "z", "password": "p"}', "[1, 2]"])
def test_a_damaged_credentials_file_is_not_silently_replaced(tmp_path, content):
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "a.json").write_text(content)
    with pytest.raises(ConfigError, match="a.json"):
        sync_credentials(folder, ["a"], rotate=False)
    assert (folder / "a.json").read_text() == content


def test_write_file_reports_changes_and_sets_modes(tmp_path):
    path = tmp_path / "f"
    assert write_file(path, "x", private=True) and mode(path) == 0o600
    assert not write_file(path, "x", private=True)
    assert write_file(path, "y") and mode(path) == 0o644 and path.read_text() == "y"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]          # no temporary file left behind


# --- TLS ----------------------------------------------------------------------------------------------

def test_tls_server_certificate_chains_to_the_ca_and_is_kept(tmp_path):
    from cryptography import x509

    from edgefl.broker.tls import ensure_tls

    lines = ensure_tls(tmp_path, ["broker.lan", "127.0.0.1"], "test")
    assert lines[0].startswith("new CA") and lines[1].startswith("new server")
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["broker.lan"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert mode(tmp_path / "ca.key") == 0o600 and mode(tmp_path / "server.key") == 0o600
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert ensure_tls(tmp_path, ["127.0.0.1", "broker.lan"], "test")[1].startswith("kept")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert ensure_tls(tmp_path, ["broker2.lan"], "test")[1].startswith("new server")
    assert (tmp_path / "ca.crt").read_bytes() == before["ca.crt"]          # same CA: devices keep working
    x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes()).verify_directly_issued_by(ca)


# --- launcher -----------------------------------------------------------------------------------------

def test_without_mosquitto_or_amqtt_the_launcher_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "mosquitto.conf").write_text("listener 1883\n")
    monkeypatch.setattr("edgefl.broker.launch.find_mosquitto", lambda: None)
    monkeypatch.setitem(sys.modules, "amqtt", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'edgefl\[broker\]'"):
        broker_command(tmp_path, embedded=False)


def test_the_launcher_prefers_mosquitto(tmp_path, monkeypatch):
    (tmp_path / "mosquitto.conf").write_text("listener 1883\n")
    monkeypatch.setattr("edgefl.broker.launch.find_mosquitto", lambda: "/opt/mosquitto")
    assert broker_command(tmp_path, embedded=False) == (["/opt/mosquitto", "-c", "mosquitto.conf"], "mosquitto")
