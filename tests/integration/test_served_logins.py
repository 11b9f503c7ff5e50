"""Operating a served run (issue: no silent failures), against a real mosquitto running the deployment
`edgefl broker config` wrote: a wrong login fails at start, naming the file and the fix, on both ends;
a device whose presence goes offline mid-round is dropped from the round at once."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from broker_fixture import edgefl, free_port, mosquitto_path, running, write_fleet

from edgefl.errors import TransportError
from edgefl.messages import ReportStatus

A, B = "dev-a", "dev-b"
GRACE_S = 3.0     # a device gone offline is waited for this long (serve: --grace, 30 s by default)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("broker")
    port = free_port()
    out = root / "deploy"
    r = edgefl("broker", "config", "--devices", write_fleet(root, [A, B]), "-o", out, "--port", port,
               "--bind", "127.0.0.1", "--plain")
    assert r.returncode == 0, r.stderr
    with running([mosquitto_path(), "-c", "mosquitto.conf"], out, port):
        yield out, f"mqtt://127.0.0.1:{port}"


def test_the_coordinator_with_a_devices_login_fails_at_start_naming_the_file(deployment):
    from edgefl.transport.mqtt import MqttTransport

    out, url = deployment
    wrong = out / "credentials" / f"{A}.json"
    t0 = time.monotonic()
    with pytest.raises(TransportError) as caught:
        MqttTransport(url, wrong)
    message = str(caught.value)
    assert f"--credentials {wrong}" in message and "credentials/coordinator.json" in message, message
    assert "Not authorized" in message, message        # the PUBACK's reason code, 0x87
    assert time.monotonic() - t0 < 8                   # refused by the PUBACK, not by a timeout
    MqttTransport(url, out / "credentials" / "coordinator.json").close()     # the right one passes


def test_edgefl_serve_with_a_devices_login_exits_2_with_one_line(deployment, tmp_path):
    out, url = deployment
    plan = _tiny_plan(tmp_path)
    wrong = out / "credentials" / f"{B}.json"
    r = edgefl("serve", "--plan", plan, "--broker", url, "--credentials", wrong, "--state", tmp_path / "state",
               "--wait-online", "1", timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    [line] = r.stderr.strip().splitlines()
    assert str(wrong) in line and "credentials/coordinator.json" in line and "Traceback" not in r.stderr, line
    assert "devices online" not in r.stdout       # it stopped before waiting for anybody


def test_a_device_agent_with_another_devices_login_exits_2_naming_both(deployment, tmp_path):
    out, url = deployment
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", np.zeros((4, 1, 28, 28), np.float32))
    np.save(data / "y.npy", np.zeros(4, np.int64))
    wrong = out / "credentials" / f"{B}.json"
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "run", "--id", A, "--broker", url,
                        "--credentials", str(wrong), "--data", str(data), "--runtime", "torch", "--power", "3W",
                        "--cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "online" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert A in lines[0] and str(wrong) in lines[0] and f"credentials/{A}.json" in lines[0], lines[0]


def test_a_device_that_goes_offline_mid_round_is_dropped_after_the_grace(deployment, tmp_path):
    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.messages import DeviceReport, RoundInstruction
    from edgefl.trainconfig import TrainConfig
    from edgefl.transport.mqtt import MqttTransport

    out, url = deployment
    server = MqttTransport(url, out / "credentials" / "coordinator.json", grace_s=GRACE_S)
    links = {d: MqttLink(url, d, out / "credentials" / f"{d}.json", tmp_path / d) for d in (A, B)}
    changes = []
    server.activity.listen(changes.append)
    try:
        for d, link in links.items():
            link.announce({"runtime": "torch"})
        assert set(server.wait_online([A, B], 10)) >= {A, B}
        sent = {d: RoundInstruction(round=1, device_id=d, config=TrainConfig(num_layers=2), weights_version=0,
                                    seed=0, lr=0.1) for d in (A, B)}
        for ins in sent.values():
            server.send(ins, {"w": np.ones(3, np.float32)})
        for d, link in links.items():
            link.weights(link.next_instruction(10), 10)      # both download their weights
        links[A].report(DeviceReport(round=1, device_id=A, config_hash=sent[A].config_hash, status="ok",
                                     examples=3, tensors={"w": np.zeros(3, np.float32)}))
        links[B].abort()                                     # killed: the broker sends its last will
        t0 = time.monotonic()
        reports = {r.device_id: r for r in server.collect(1, [A, B], timeout_s=120)}
        assert GRACE_S <= time.monotonic() - t0 < 20, "it waited for the dead device (or not the grace)"
        assert reports[A].ok
        assert reports[B].status is ReportStatus.OFFLINE and reports[B].config_hash == sent[B].config_hash
        assert reports[B].reason.startswith("offline: its connection was lost (last will)"), reports[B].reason
        states = [(c.device, c.state) for c in changes]
        for d in (A, B):
            assert (d, "sent") in states and (d, "downloading") in states, states
        assert (A, "reported") in states and (B, "offline") in states, states
        snapshot = server.activity.snapshot()
        assert snapshot["round"] == 1 and snapshot["devices"][B]["state"] == "offline"
        assert snapshot["devices"][A]["bytes"] == 12            # the 3 float32 weights it acknowledged
    finally:
        links[A].close()
        server.close()


def _tiny_plan(folder):
    fleet = write_fleet(folder, [A, B])
    plan = folder / "plan.json"
    r = edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "fedavg", "--rounds", "1", "--format",
               "json", "-o", plan, timeout=300)
    assert r.returncode == 0, r.stderr
    json.loads(plan.read_text())
    return plan
