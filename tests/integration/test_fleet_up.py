"""`edgefl fleet up` as an operator uses it (issue: operating a served run): the logins of a deployment
folder or its credentials/ folder, a TLS broker set up the README's way, a subset fleet logging in with the
full fleet's deployment (device ids do not depend on the count), and a fleet whose agents all die is a
failure that says which and where their logs are."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_fixture import edgefl, free_port, mosquitto_path, running

FULL = "fleet:\n  name: full\n  groups:\n    lab: {count: 12, runtime: torch, memory_budget: 1GiB}\n"
SUBSET = "fleet:\n  name: subset\n  groups:\n    lab: {count: 2, runtime: torch, memory_budget: 1GiB}\n"


def fleet_up(folder: Path, fleet: Path, broker: str, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgefl", "fleet", "up", "--devices", str(fleet), "--broker", broker,
                             "--dataset", "fashion-mnist", "--train-limit", "200", "--workdir", str(folder / "fleet"),
                             *map(str, extra)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    return proc.communicate(timeout=60)


@pytest.fixture(scope="module")
def tls_deployment(tmp_path_factory):
    """The full fleet's TLS deployment, as the README sets one up, running."""
    root = tmp_path_factory.mktemp("deploy")
    port = free_port()
    (root / "full.yaml").write_text(FULL)
    r = edgefl("broker", "config", "--devices", root / "full.yaml", "-o", root / "deploy", "--tls", "--port", port,
               "--host", "localhost")
    assert r.returncode == 0, r.stderr
    with running([mosquitto_path(), "-c", "mosquitto.conf"], root / "deploy", port):
        yield root / "deploy", f"mqtts://localhost:{port}"


@pytest.mark.parametrize("given", ["deployment folder", "credentials folder"])
def test_a_subset_fleet_logs_in_over_tls_with_the_full_deployment(tls_deployment, tmp_path, given):
    from edgefl.transport.mqtt import MqttTransport

    deploy, url = tls_deployment
    subset = tmp_path / "subset.yaml"
    subset.write_text(SUBSET)
    logins = ["--credentials-dir", deploy] if given == "deployment folder" else \
        ["--credentials-dir", deploy / "credentials", "--ca-file", deploy / "tls" / "ca.crt"]
    proc = fleet_up(tmp_path, subset, url, *logins)
    coordinator = MqttTransport(url, deploy / "credentials" / "coordinator.json", ca_file=deploy / "tls" / "ca.crt")
    try:
        online = coordinator.wait_online(["lab-0", "lab-1"], 120)
    finally:
        coordinator.close()
        out, err = stop(proc)
    assert {"lab-0", "lab-1"} <= set(online), (out, err, _logs(tmp_path))
    assert proc.returncode == 0 and out.rstrip().endswith("fleet stopped"), (out, err)
    if given == "deployment folder":       # the CA came with the deployment
        assert f"CA certificate: {deploy / 'tls' / 'ca.crt'}" in out


def test_a_folder_without_the_fleets_logins_is_one_line_naming_both_places(tmp_path):
    subset = tmp_path / "subset.yaml"
    subset.write_text(SUBSET)
    (tmp_path / "empty").mkdir()
    r = edgefl("fleet", "up", "--devices", subset, "--broker", "mqtt://127.0.0.1:1", "--dataset", "fashion-mnist",
               "--credentials-dir", tmp_path / "empty", "--workdir", tmp_path / "fleet")
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert f"--credentials-dir {tmp_path / 'empty'}: neither it nor {tmp_path / 'empty' / 'credentials'}" in line
    assert "lab-0.json" in line and "edgefl broker config -o DIR" in line


def test_when_every_agent_dies_fleet_up_fails_saying_which_and_where_the_logs_are(tmp_path):
    subset = tmp_path / "subset.yaml"
    subset.write_text(SUBSET)
    port = free_port()                    # nobody listens there
    proc = fleet_up(tmp_path, subset, f"mqtt://127.0.0.1:{port}")
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        stop(proc)
    assert proc.returncode == 2, (out, err)
    [line] = err.strip().splitlines()
    logs = tmp_path / "fleet" / "logs"
    assert line.startswith("edgefl: error: every device agent exited: lab-0 (2), lab-1 (2); "
                           f"logs in {logs} (lab-0.log ends: "), line
    assert f"cannot connect to the broker at mqtt://127.0.0.1:{port}" in line
    assert "fleet stopped" not in out


def _logs(folder: Path) -> str:
    return "\n".join(p.read_text()[-800:] for p in sorted((folder / "fleet" / "logs").glob("*.log"))) \
        if (folder / "fleet" / "logs").exists() else ""


def test_device_command_passes_each_agent_its_own_login_and_the_ca(tmp_path):
    from edgefl.engines.agents import device_command
    from edgefl.fleet import parse_fleet

    group = parse_fleet(SUBSET).group("lab")
    cmd = device_command("lab-1", group, "mqtts://h:8883", tmp_path / "d", tmp_path, tmp_path / "creds",
                         tmp_path / "ca.crt", False)
    assert cmd[cmd.index("--credentials") + 1] == str(tmp_path / "creds" / "lab-1.json")
    assert cmd[cmd.index("--ca-file") + 1] == str(tmp_path / "ca.crt")
    assert cmd[cmd.index("--broker") + 1] == "mqtts://h:8883"


ONE = "fleet:\n  name: one\n  groups:\n    lab: {count: 1, runtime: ort, memory_budget: 1GiB}\n"


def test_a_second_fleet_up_of_the_same_devices_is_refused_saying_which_process_has_them(tmp_path):
    """Before (issue 40): both fleets' agents stayed up with the same ids, mosquitto closed one connection for the
    other every second ('already connected, closing old connection'), nothing said so, and the second overwrote the
    first's logs."""
    from mosquitto import Mosquitto

    from edgefl.transport.mqtt import MqttTransport

    fleet = tmp_path / "one.yaml"
    fleet.write_text(ONE)
    with Mosquitto(tmp_path / "broker") as broker:
        first = fleet_up(tmp_path / "a", fleet, broker.url)
        coordinator = MqttTransport(broker.url, None)
        try:
            assert "lab-0" in coordinator.wait_online(["lab-0"], 120), _logs(tmp_path / "a")
            agent = next(p for p in os.listdir("/proc") if p.isdigit() and b"--id\0lab-0" in _cmdline(p)
                         and str(broker.port).encode() in _cmdline(p))
            log = tmp_path / "a" / "fleet" / "logs" / "lab-0.log"
            deadline = time.monotonic() + 60     # it says so just after its presence is out: a loaded machine lags
            while "online at" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            before = log.read_text()
            # the same work folder: refused at once
            again = fleet_up(tmp_path / "a", fleet, broker.url)
            out, err = again.communicate(timeout=120)
            assert again.returncode == 2, (out, err)
            assert err.strip() == (f"edgefl: error: --workdir {tmp_path / 'a' / 'fleet'}: another 'edgefl fleet up' "
                                   f"(pid {first.pid}) runs its agents from it; stop that one (Ctrl-C), or give this "
                                   "one another --workdir"), err
            # another work folder: its agent refuses the id the first's runs as, and the second fleet up says so
            second = fleet_up(tmp_path / "b", fleet, broker.url)
            out, err = second.communicate(timeout=180)
            assert second.returncode == 2, (out, err)
            said = (f"lab-0: another edgefl-device (pid {agent}) runs as lab-0 at {broker.url} on this machine; stop "
                    "it first (two agents with one id take the broker connection from each other every second)")
            assert f"lab-0 exited (2): edgefl-device: error: {said}" in " ".join(out.split()), out   # rich wraps
            assert err.strip().startswith("edgefl: error: every device agent exited: lab-0 (2)"), err
            time.sleep(2)      # the first's agent stays connected, and alone
            assert first.poll() is None and "lab-0" in coordinator.online()
            assert log.read_text() == before and "already connected" not in broker.log(), broker.log()
        finally:
            coordinator.close()
            stop(first)


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _logs(folder: Path) -> str:
    return "\n".join(p.read_text()[-800:] for p in sorted((folder / "fleet" / "logs").glob("*.log"))) \
        if (folder / "fleet" / "logs").exists() else ""


MIXED = ("fleet:\n  name: mixed\n  groups:\n    pi: {count: 1, runtime: executorch, memory_budget: 180MiB}\n"
         "    lab: {count: 1, runtime: executorch, agent: python, memory_budget: 1GiB}\n"
         "    phone: {count: 1, profile: android-low}\n")


def test_each_group_runs_the_agent_its_plan_counted_and_an_override_says_where_it_differs():
    """No --agent: each group's own `agent:`, by default native for ExecuTorch and python for ort (the kind its plan
    counted), silently. --agent overrides every group, with a line for each group whose plan counted the other agent;
    the native agent trains ExecuTorch only, so an ort group still runs the Python agent, as its plan counted."""
    from edgefl.engines.agents import agent_kinds
    from edgefl.fleet import parse_fleet

    fleet = parse_fleet(MIXED)
    assert [g.agent for g in fleet.groups] == ["native", "python", "python"]
    said: list[str] = []
    assert agent_kinds(fleet, None, said.append) == {"pi": "native", "lab": "python", "phone": "python"}
    assert said == []
    assert agent_kinds(fleet, "python", said.append) == {"pi": "python", "lab": "python", "phone": "python"}
    assert said == ["group pi: --agent python runs the python agent, but its plan counted the native agent's memory: "
                    "give the group 'agent: python' in the fleet file to plan for it"]
    said.clear()
    assert agent_kinds(fleet, "native", said.append) == {"pi": "native", "lab": "native", "phone": "python"}
    assert said == ["group lab: --agent native runs the native agent, but its plan counted the python agent's memory: "
                    "give the group 'agent: native' in the fleet file to plan for it",
                    "group phone: runtime ort: the native agent trains ExecuTorch sets only, so its devices run the "
                    "Python agent, as its plan counted"]


def test_a_native_agent_for_an_ort_group_is_refused_in_one_line():
    from edgefl.errors import ConfigError
    from edgefl.fleet import parse_fleet

    with pytest.raises(ConfigError, match=r"fleet.groups.phone.agent: the native agent trains ExecuTorch sets only and "
                                          r"the group's runtime is ort; write runtime: executorch, or agent: python"):
        parse_fleet(MIXED.replace("profile: android-low}", "profile: android-low, agent: native}"))


def test_an_unknown_agent_is_one_line(tmp_path):
    fleet = tmp_path / "mixed.yaml"
    fleet.write_text(MIXED)
    r = edgefl("fleet", "up", "--devices", fleet, "--broker", "mqtt://127.0.0.1:1", "--dataset", "fashion-mnist",
               "--agent", "java", "--workdir", tmp_path / "fleet")
    assert r.returncode == 2
    assert r.stderr.strip() == "edgefl: error: --agent java: choose one of: python, native", r.stderr
