"""The MQTT transport against a real mosquitto, beyond the shared contract: device processes killed and
restarted, sessions that outlive connections and broker restarts, TLS and logins, the broker's packet
limit, and the errors a user sees for a bad URL or login file."""
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from mosquitto import Mosquitto, write_credentials

from edgefl.device_runtime.cache import ArtifactCache
from edgefl.device_runtime.mqtt_link import MqttLink
from edgefl.errors import ConfigError, TransportError
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.trainconfig import TrainConfig
from edgefl.transport.mqtt import MqttTransport

CHUNK = 64 * 1024
DEVICE = Path(__file__).parents[1] / "mqtt_device.py"


def instruction(device="pi", round=1):
    return RoundInstruction(round=round, device_id=device, config=TrainConfig(num_layers=3), weights_version=0,
                            seed=1, lr=0.1)


def wait_until(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_killed_device_process_resumes_its_artifact_in_a_new_process(tmp_path):
    with Mosquitto(tmp_path / "broker") as broker:
        server = MqttTransport(broker.url, chunk_size=CHUNK)
        data = os.urandom(20 * CHUNK)
        artifact = server.ship("pi", data)
        argv = [sys.executable, str(DEVICE), broker.url, "pi", str(tmp_path / "cache"), artifact]
        first = subprocess.Popen(argv + ["--delay", "0.1"], stdout=subprocess.PIPE, text=True)
        try:
            assert server.wait_online(["pi"], timeout_s=30) == {"pi": {"pid": first.pid}}
            for line in first.stdout:
                if json.loads(line)["held"] >= 5:
                    break
            first.kill()                                  # SIGKILL mid-artifact: no goodbye
            first.wait()
        finally:
            first.kill()
        wait_until(lambda: "pi" not in server.online())   # the broker published its last will
        held = len(ArtifactCache(tmp_path / "cache").partial(artifact).held)
        assert 5 <= held < 20

        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        done = json.loads(second.stdout.splitlines()[-1])
        assert done["sha256"] == artifact == hashlib.sha256(data).hexdigest()
        assert done["stats"]["chunks_accepted"] == 20 - held    # resumed, not restarted
        server.close()


def test_an_instruction_waits_in_the_session_while_the_device_and_the_broker_are_down(tmp_path):
    broker = Mosquitto(tmp_path / "broker", persistence=True).start()
    try:
        server = MqttTransport(broker.url)
        MqttLink(broker.url, "pi", None, tmp_path / "cache").close()     # the session exists, the device is away
        server.send(instruction(), {"w": np.ones(5, np.float32)})
        assert server.wire.flush(5)
        broker.stop()
        broker.start()                                                     # the session survives a restart
        link = MqttLink(broker.url, "pi", None, tmp_path / "cache")
        job = link.next_instruction(timeout_s=10)
        assert job.instruction == instruction()
        wait_until(lambda: server.wire.connected)                          # paho reconnected by itself
        assert np.array_equal(link.weights(job, timeout_s=20)["w"], np.ones(5, np.float32))
        link.close()
        server.close()
    finally:
        broker.stop()


def test_group_artifacts_a_restarted_broker_lost_are_published_again(tmp_path):
    """A broker killed soon after the coordinator published a group's artifact keeps only what it had saved of
    the retained messages (here nothing: no persistence). Reconnected, the coordinator publishes them again, so
    the group's device reads them from the group's topics instead of waiting out its group wait (set to 60 s
    here, past the fetch's 20 s) before it asks the coordinator."""
    broker = Mosquitto(tmp_path / "broker").start()
    try:
        server = MqttTransport(broker.url, chunk_size=CHUNK)
        server.share_by_group({"pi": "A"})
        data = os.urandom(8 * CHUNK)
        artifact = server.ship("pi", data, name="program")
        assert server.wire.flush(5) and server.artifacts.group_chunks_published == 8
        broker.stop()
        broker.start()
        wait_until(lambda: server.wire.connected)
        wait_until(lambda: server.artifacts.group_chunks_published == 16)      # all 8 again
        link = MqttLink(broker.url, "pi", None, tmp_path / "cache", stall_s=1.0, group_wait_s=60.0)
        server.send(instruction(), {})
        link.next_instruction(timeout_s=10)
        assert link.fetch(artifact, timeout_s=20).read_bytes() == data
        assert server.artifacts.chunks_sent == 0          # none sent to the device itself
        link.close()
        server.close()
    finally:
        broker.stop()


def test_a_fetch_survives_a_broker_restart(tmp_path):
    broker = Mosquitto(tmp_path / "broker", persistence=True).start()
    try:
        server = MqttTransport(broker.url, chunk_size=CHUNK)
        data = os.urandom(30 * CHUNK)
        artifact = server.ship("pi", data)
        link = MqttLink(broker.url, "pi", None, tmp_path / "cache", stall_s=1.0)
        link.announce({"runtime": "ort"})
        fifth, result = threading.Event(), {}

        def slow(held, total):
            if held == 5:
                fifth.set()
            time.sleep(0.05)

        def fetch():
            result["path"] = link.fetch(artifact, timeout_s=60, progress=slow)
        worker = threading.Thread(target=fetch)
        worker.start()
        assert fifth.wait(20)
        broker.stop()
        broker.start()
        worker.join(60)
        assert result["path"].read_bytes() == data
        assert server.wait_online(["pi"], timeout_s=10) == {"pi": {"runtime": "ort"}}   # announced again
        link.close()
        server.close()
    finally:
        broker.stop()


def test_chunks_a_broker_drops_are_sent_again(tmp_path):
    # one message in flight and two queued per client: the rest of a window of 8 is dropped, silently
    with Mosquitto(tmp_path / "broker", extra="max_inflight_messages 1\nmax_queued_messages 2\n") as broker:
        server = MqttTransport(broker.url, chunk_size=CHUNK)
        data = os.urandom(30 * CHUNK)
        artifact = server.ship("pi", data)
        link = MqttLink(broker.url, "pi", None, tmp_path / "cache", stall_s=0.3, resend_after_s=1.0)
        assert link.fetch(artifact, timeout_s=60).read_bytes() == data
        assert "messages are being dropped" in broker.log()
        assert link.stats.resend_wants > 1 and server.artifacts.chunks_sent > 30
        link.close()
        server.close()


def test_tls_and_logins(tmp_path):
    logins = {"coordinator": "coord-pass", "pi": "pi-pass"}
    with Mosquitto(tmp_path / "broker", tls=True, logins=logins) as broker:
        assert broker.url.startswith("mqtts://")
        coordinator = write_credentials(tmp_path / "coordinator.json", "coordinator", "coord-pass")
        device = write_credentials(tmp_path / "pi.json", "pi", "pi-pass")
        server = MqttTransport(broker.url, coordinator, ca_file=broker.ca_file)
        link = MqttLink(broker.url, "pi", device, tmp_path / "cache", ca_file=broker.ca_file)
        server.send(instruction(), {"w": np.arange(4, dtype=np.float32)})
        job = link.next_instruction(timeout_s=5)
        w = link.weights(job, timeout_s=10)
        link.report(DeviceReport(round=1, device_id="pi", config_hash=job.instruction.config_hash, status="ok",
                                 examples=2, tensors={"w": w["w"] + 1}))
        [report] = server.collect(1, ["pi"], timeout_s=10)
        assert np.array_equal(report.tensors["w"], np.arange(1, 5, dtype=np.float32))

        wrong = write_credentials(tmp_path / "wrong.json", "pi", "guess")
        with pytest.raises(TransportError, match="did not accept 'pi'.*check --credentials"):
            MqttLink(broker.url, "pi", wrong, tmp_path / "cache", ca_file=broker.ca_file)
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED.*--ca-file"):
            MqttLink(broker.url, "pi", device, tmp_path / "cache")          # the system CAs do not know this one
        link.close()
        server.close()


def test_the_broker_packet_limit_is_learned_and_artifacts_fit_under_it(tmp_path):
    with Mosquitto(tmp_path / "broker", max_packet_size=100_000) as broker:
        server = MqttTransport(broker.url)
        assert server.wire.max_packet_size == 100_000
        assert server.artifacts.chunk_size < 100_000
        data = os.urandom(300_000)
        artifact = server.ship("pi", data)
        link = MqttLink(broker.url, "pi", None, tmp_path / "cache")
        assert link.wire.max_packet_size == 100_000
        assert link.fetch(artifact, timeout_s=10).read_bytes() == data
        link.close()
        server.close()


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:1883", "scheme is 'http'"),
    ("mqtt://", "host is missing"),
    ("mqtt://127.0.0.1:99999", "port is not a number"),
    ("mqtt://user:pw@127.0.0.1", "--credentials file"),
])
def test_a_bad_broker_url_names_the_expected_form(url, message):
    with pytest.raises(ConfigError, match=message):
        MqttTransport(url)


def test_login_and_ca_files_are_checked_before_connecting(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        MqttTransport("mqtt://127.0.0.1:1", tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"username": "pi"}')
    with pytest.raises(ConfigError, match="'username' and 'password'"):
        MqttTransport("mqtt://127.0.0.1:1", bad)
    with pytest.raises(ConfigError, match="not TLS"):
        MqttTransport("mqtt://127.0.0.1:1", ca_file=bad)
    with pytest.raises(ConfigError, match="device id 'a/b'"):
        MqttLink("mqtt://127.0.0.1:1", "a/b", None, tmp_path / "cache")


def test_an_unreachable_broker_is_a_one_line_transport_error(tmp_path):
    with Mosquitto(tmp_path / "broker") as broker:
        port = broker.port
    with pytest.raises(TransportError, match=f"cannot connect to the broker at mqtt://127.0.0.1:{port}"):
        MqttTransport(f"mqtt://127.0.0.1:{port}")
