"""The native device agent (`edgefl-device` in C++, device_runtime/native/agent/) on a real mosquitto: a served
run trains with it and it idles small, it reaches the Python agent's weights bit for bit, and a user's mistakes
and malformed messages are met as the Python agent meets them."""
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest
import torch
from mosquitto import Mosquitto, write_credentials
from served_run import ServedRun, wait_for, write_plan

from edgefl.cost.constants import AGENTS

pytestmark = pytest.mark.usefixtures("native_trainer")    # builds the trainer and, beside it, the native agent
PHONES = "fleet:\n  name: phones\n  groups:\n    phone: {count: 2, runtime: executorch, memory_budget: 1GiB}\n"
IDLE_RSS_LIMIT = 8 * 2**20


@pytest.fixture(scope="module")
def agent_binary():
    from edgefl.device_runtime import native

    native.build()
    found = native.find_agent()
    assert found is not None and found.name == "edgefl-device"
    return found


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


ROUNDS = 3


def served(folder: Path, agent: str, probe=None, exported: Optional[Path] = None) -> tuple[dict, dict]:
    """A 3-round served run of two ExecuTorch phones with `agent` agents: (its history, its final weights).
    `probe(run, pids)` runs once the agents are online, before the coordinator starts. `exported`: another run's
    state/artifacts, which the coordinator finds as a stopped one's and ships rather than export the same sets."""
    folder.mkdir(parents=True)
    if exported is not None:
        shutil.copytree(exported, folder / "state" / "artifacts")
    fleet, plan = write_plan(folder, PHONES, "fedavg", rounds=ROUNDS)
    with ServedRun(folder, fleet, plan, train_limit=300, agent=agent) as run:
        if probe is not None:
            wait_for(lambda: len(run.device_pids()) == 2, 60, "two agents")
            pids = run.device_pids()
            wait_for(lambda: all("online at" in (folder / "fleet" / "logs" / f"{d}.log").read_text() for d in pids), 60,
                     "the agents online")
            after = probe(run, pids)
        history = run.serve(folder / "state", ROUNDS, "--round-timeout", "300")
        if probe is not None:
            time.sleep(1.0)      # the last report's receipt taken: the agents wait for the next instruction
            after(folder)
    for r in history["rounds"]:
        assert r["aggregated"] and sum(r["participating_devices"].values()) == 2, (agent, r["failed"], r["missing"])
    return history, torch.load(folder / "state" / "weights.pt")


@pytest.fixture(scope="module")
def native_run(tmp_path_factory, agent_binary):
    """The served run with native agents, measured from outside (/proc/<pid>/status) before and after, with a
    message on each agent's instruction topic that is not JSON at all sent before the first round."""
    seen: dict = {}

    def probe(run, pids):
        for device in pids:      # refused and logged, nothing to answer; the agent lives on
            subprocess.run(["mosquitto_pub", "-p", str(run.broker.port), "-q", "1", "-t",
                            f"fl/v1/dev/{device}/down/instr", "-m", "{not json"], check=True, timeout=30)
        seen["started"] = {d: vm_kib(p, "VmRSS") for d, p in pids.items()}

        def after(folder):
            seen["idle"] = {d: vm_kib(p, "VmRSS") for d, p in pids.items()}
            seen["peak"] = {d: vm_kib(p, "VmHWM") for d, p in pids.items()}
            seen["logs"] = {d: (folder / "fleet" / "logs" / f"{d}.log").read_text() for d in pids}
        return after

    folder = tmp_path_factory.mktemp("native-run") / "native"
    history, weights = served(folder, "native", probe)
    print(f"native agent VmRSS KiB at start {seen['started']}, idle after {ROUNDS} rounds {seen['idle']}, "
          f"VmHWM {seen['peak']}")
    return history, weights, seen, folder


def test_a_served_run_with_native_agents_idles_under_8_mib(native_run):
    history, _, seen, _ = native_run
    for device, log in seen["logs"].items():
        assert "refused an instruction: instruction: not a JSON object" in log, log
    rounds = history["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    for r in rounds:
        for device, metrics in r["device_metrics"].items():
            assert metrics["agent"] == "native" and metrics["trainer"] == "native", metrics
            assert 0 < metrics["agent_idle_rss_bytes"] <= IDLE_RSS_LIMIT, metrics     # its own, as it waited
            assert metrics["agent_idle_rss_bytes"] <= metrics["agent_peak_bytes"], metrics
            # the promise for the whole device: the training process's peak and the agent's, within the plan's
            # prediction (which counts the native agent), within the group's budget
            measured, predicted = r["measured_peak_bytes"][device], r["predicted_peak_bytes"][device]
            assert measured == metrics["child_peak_bytes"] + metrics["agent_peak_bytes"], metrics
            assert metrics["child_peak_bytes"] > 0 and measured <= predicted <= 2**30, (measured, predicted)
            assert metrics["energy"]["source"] in ("rapl", "battery", "profile") and metrics["energy"]["joules"] > 0
            assert metrics["cache_bytes"] > 0
    upload = rounds[0]["upload_bytes"] // 2          # each device's trained tensors
    for device in seen["idle"]:
        assert max(seen["started"][device], seen["idle"][device]) * 1024 <= IDLE_RSS_LIMIT, seen
        # what the plan counts for the agent covers its peak seen from outside (with its round's upload)
        assert seen["peak"][device] * 1024 <= AGENTS["native"].bytes(upload), (seen, upload)


def test_the_native_and_the_python_agent_reach_the_same_weights_bit_for_bit(native_run, tmp_path):
    """For one seed, the Python agent (with the native trainer) and the native agent make the same global model."""
    history, native, _, native_folder = native_run
    python_history, python = served(tmp_path / "python", "python", exported=native_folder / "state" / "artifacts")
    for r in python_history["rounds"]:
        assert {m.get("agent", "python") for m in r["device_metrics"].values()} == {"python"}
        assert {m["trainer"] for m in r["device_metrics"].values()} == {"native"}
    assert python.keys() == native.keys()
    for key, value in python.items():
        assert torch.equal(native[key], value), key


def start_agent(binary: Path, broker: Mosquitto, folder: Path) -> subprocess.Popen:
    """The native agent as device dev-0 on `broker`, with an empty data folder (it trains nothing here)."""
    (folder / "data").mkdir()
    return subprocess.Popen([str(binary), "--id", "dev-0", "--broker", broker.url, "--data", str(folder / "data"),
                             "--power", "3W", "--cache", str(folder / "cache")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_wrong_password_is_one_line_and_exit_2(tmp_path, agent_binary, native_trainer):
    data = tmp_path / "data"
    data.mkdir()
    with Mosquitto(tmp_path / "broker", logins={"dev-0": "right"}) as broker:
        login = write_credentials(tmp_path / "dev-0.json", "dev-0", "wrong")
        r = subprocess.run([str(agent_binary), "run", "--id", "dev-0", "--broker", broker.url, "--credentials",
                            str(login), "--data", str(data), "--runtime", "executorch", "--power", "3W",
                            "--cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=30)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert lines[0].startswith("edgefl-device: error: ") and "--credentials" in lines[0], lines


def test_a_malformed_instruction_naming_its_round_is_refused_with_a_report(tmp_path, agent_binary, native_trainer):
    """An instruction of another schema that still names its round is answered with a failed report and the
    reason (the coordinator hears why); the agent goes on."""
    import paho.mqtt.client as mqtt

    with Mosquitto(tmp_path / "broker") as broker:
        agent = start_agent(agent_binary, broker, tmp_path)
        got: list[tuple[str, bytes]] = []
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="coordinator", protocol=mqtt.MQTTv5)
        c.on_message = lambda client, userdata, msg: got.append((msg.topic, msg.payload))
        c.connect("127.0.0.1", broker.port)
        c.subscribe("fl/v1/#", qos=1)
        c.loop_start()
        try:
            wait_for(lambda: any(t == "fl/v1/presence/dev-0" and json.loads(p)["online"] for t, p in got), 30, "presence")
            bad = {"schema": "edgefl.assignment/9", "instruction": {"round": 4, "config_hash": "abc"}}
            c.publish("fl/v1/dev/dev-0/down/instr", json.dumps(bad), qos=1)
            wait_for(lambda: any(t.endswith("/meta") for t, _ in got), 30, "a report")
            meta = json.loads(next(p for t, p in got if t.endswith("/meta")))
            assert agent.poll() is None
            agent.terminate()
            t0 = time.monotonic()
            out, _ = agent.communicate(timeout=10)
            stopped_s = time.monotonic() - t0
            wait_for(lambda: any(t == "fl/v1/presence/dev-0" and json.loads(p).get("reason") == "it stopped"
                                 for t, p in got), 10, "offline: it stopped")
        finally:
            c.loop_stop()
            c.disconnect()
            if agent.poll() is None:
                agent.kill()
    report = meta["report"]
    assert meta["schema"] == "edgefl.upload/2" and meta["tensors"]["chunks"] == 0
    assert report["round"] == 4 and report["status"] == "failed" and report["config_hash"] == "abc"
    assert report["reason"].startswith("refused: instruction: schema"), report
    assert agent.returncode == 0 and stopped_s < 5, (agent.returncode, stopped_s, out)


def test_sigterm_ends_a_native_agent_stuck_in_a_fetch_within_5_s(tmp_path, agent_binary, native_trainer):
    """Rule 4: an instruction whose set nobody serves leaves the agent asking; SIGTERM ends the fetch at once,
    says offline ("it stopped") and exits."""
    with Mosquitto(tmp_path / "broker") as broker:
        agent = start_agent(agent_binary, broker, tmp_path)
        try:
            wait_for(lambda: (tmp_path / "cache" / "partial").is_dir(), 30, "the agent's cache")
            time.sleep(1.0)
            instruction = {"schema": "edgefl.assignment/1", "weights": None, "artifacts": {"set": "ab" * 32},
                           "instruction": {"schema": "edgefl.instruction/1", "round": 1, "device_id": "dev-0",
                                           "config": {"local_epochs": 1}, "config_hash": "0" * 16, "weights_version": 0,
                                           "seed": 0, "lr": 0.05, "options": {}, "sequence": []}}
            subprocess.run(["mosquitto_pub", "-p", str(broker.port), "-q", "1", "-t", "fl/v1/dev/dev-0/down/instr",
                            "-m", json.dumps(instruction)], check=True, timeout=30)
            wanted = subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-t", "fl/v1/dev/dev-0/up/ack", "-C", "1",
                                     "-W", "20"], capture_output=True, text=True, timeout=30)
            assert json.loads(wanted.stdout)["want"] == "ab" * 32, wanted
            t0 = time.monotonic()
            agent.terminate()
            out, _ = agent.communicate(timeout=10)
            stopped_s = time.monotonic() - t0
            presence = subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-t", "fl/v1/presence/dev-0", "-C", "1",
                                       "-W", "5"], capture_output=True, text=True, timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
    assert agent.returncode == 0 and stopped_s < 5, (agent.returncode, stopped_s, out)
    assert json.loads(presence.stdout)["reason"] == "it stopped", presence.stdout
