"""The one-machine default (issue: the embedded broker): `edgefl broker up --embedded` (amqtt, MQTT 3.1.1 only)
serves edgefl's own clients, which speak MQTT 5 and fall back to 3.1.1 when it does not answer. Real
processes: the broker as `edgefl broker up` runs it, two device agents, `edgefl serve` for two rounds."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
from broker_fixture import edgefl, free_port, wait_for_port

pytest.importorskip("amqtt", reason="the embedded broker needs amqtt: pip install 'edgefl[broker]'")

FLEET = "fleet:\n  name: embedded\n  groups:\n    lab: {count: 2, runtime: ort, memory_budget: 1GiB, examples: 200}\n"
DEVICES = ("lab-0", "lab-1")


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The fleet's deployment folder served by `edgefl broker up --embedded`: (folder, URL, fleet file)."""
    root = tmp_path_factory.mktemp("embedded")
    (root / "fleet.yaml").write_text(FLEET)
    port = free_port()
    r = edgefl("broker", "config", "--devices", root / "fleet.yaml", "-o", root / "deploy", "--port", port,
               "--bind", "127.0.0.1", "--plain")
    assert r.returncode == 0, r.stderr
    with (root / "broker.log").open("w") as log:      # a file: amqtt logs a traceback per MQTT 5 try it dropped
        proc = subprocess.Popen([sys.executable, "-m", "edgefl", "broker", "up", "--config", str(root / "deploy"),
                                 "--embedded"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
        yield root / "deploy", f"mqtt://127.0.0.1:{port}", root / "fleet.yaml"
    finally:
        proc.terminate()            # `broker up` passes it on to the broker
        proc.wait(timeout=30)


def test_the_wire_falls_back_to_mqtt_311_and_says_so_once(embedded, tmp_path, caplog):
    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.protocol.mqtt_wire import MQTT311, MqttWire

    deploy, url, _ = embedded
    caplog.set_level(logging.DEBUG, logger="edgefl.transport")
    t0 = time.monotonic()
    coordinator = MqttWire(url, "coordinator", credentials=deploy / "credentials" / "coordinator.json")
    assert time.monotonic() - t0 < 10          # within the connect timeout, both tries together
    link = MqttLink(url, DEVICES[0], deploy / "credentials" / f"{DEVICES[0]}.json", tmp_path / "cache")
    try:
        assert (coordinator.protocol, link.wire.protocol) == (MQTT311, MQTT311)
        assert not coordinator.can_confirm and not link.wire.can_confirm
        got = []
        coordinator.on_message(lambda topic, payload, wire_bytes: got.append((topic, payload, wire_bytes)))
        coordinator.subscribe(["fl/v1/dev/+/up/#"])
        topic = f"fl/v1/dev/{DEVICES[0]}/up/test"
        assert link.wire.confirm(topic, b"hello") is None             # taken: 3.1.1 cannot say otherwise
        deadline = time.monotonic() + 10
        while not any(t == topic for t, _, _ in got) and time.monotonic() < deadline:
            time.sleep(0.05)
        [(_, payload, wire_bytes)] = [m for m in got if m[0] == topic]
        assert payload == b"hello"
        assert wire_bytes == 2 + len(topic) + 2 + len(payload) + 2     # a 3.1.1 PUBLISH: no properties field
    finally:
        link.close()
        coordinator.close()
    fallbacks = [r for r in caplog.records if "does not answer MQTT 5" in r.getMessage()]
    assert [r.levelno for r in fallbacks] == [logging.WARNING, logging.DEBUG], fallbacks    # said once
    assert any("the login check needs MQTT 5" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records), caplog.text


def test_serve_and_two_devices_complete_two_rounds_on_the_embedded_broker(embedded, tmp_path):
    from edgefl.engines.agents import export_shares
    from edgefl.fleet import load_fleet

    deploy, url, fleet_file = embedded
    plan = tmp_path / "plan.json"
    r = edgefl("plan", "--devices", fleet_file, "--model", "cnn", "--method", "fedavg", "--rounds", "2", "--format",
               "json", "-o", plan, timeout=300)
    assert r.returncode == 0, r.stderr
    shares = export_shares(load_fleet(fleet_file), "fashion-mnist", "iid", 0, tmp_path / "data", train_limit=400)
    agents = {}
    t0 = time.monotonic()
    for device in DEVICES:
        log = (tmp_path / f"{device}.log").open("w")
        agents[device] = subprocess.Popen(
            [sys.executable, "-m", "edgefl.device_runtime.cli", "run", "--id", device, "--broker", url,
             "--credentials", str(deploy / "credentials" / f"{device}.json"), "--data", str(shares[device]),
             "--runtime", "ort", "--memory", "1GiB", "--power", "3W", "--cache", str(tmp_path / "cache" / device),
             "--rounds", "2"], stdout=log, stderr=subprocess.STDOUT)
    try:
        served = edgefl("serve", "--plan", plan, "--devices", fleet_file, "--broker", url, "--credentials",
                        deploy / "credentials" / "coordinator.json", "--state", tmp_path / "run", "--rounds", "2",
                        "--wait-online", "60", "--round-timeout", "300", timeout=600)
        for proc in agents.values():
            proc.wait(timeout=60)           # --rounds 2: each agent stops by itself after its two rounds
    finally:
        for proc in agents.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {d: (tmp_path / f"{d}.log").read_text() for d in DEVICES}
    assert served.returncode == 0, (served.stdout, served.stderr, logs)
    history = json.loads((tmp_path / "run" / "history.json").read_text())["rounds"]
    assert len(history) == 2
    for record in history:
        assert not record["failed"] and not record["missing"] and record["aggregated"], record
        assert sorted(record["measured_peak_bytes"]) == list(DEVICES), record
    assert {d: p.returncode for d, p in agents.items()} == dict.fromkeys(DEVICES, 0), logs
    assert served.stderr.count("does not answer MQTT 5") == 1, served.stderr     # the fallback, said once
    for device in DEVICES:
        assert logs[device].count("does not answer MQTT 5") == 1, logs[device]
    print(f"broker up --embedded + serve + 2 devices, 2 rounds: {time.monotonic() - t0:.1f} s")
