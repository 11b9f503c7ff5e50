"""`edgefl broker config` and `edgefl broker up` as users run them: the files written, re-runs that keep
logins, rotation, the packet limit from a plan, one-line errors, and both brokers serving the folder."""
from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys

import pytest
import yaml
from broker_fixture import Client, credentials, edgefl, free_port, running, write_fleet
from paho.mqtt.client import MQTTv5, MQTTv311

from edgefl.broker.mosquitto_conf import CHUNK_BYTES, packet_limit
from edgefl.broker.passwords import parse_password_file, verify_password
from edgefl.cli.main import run

IDS = ["dev-a", "dev-b", "dev-c"]


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def conf_values(folder) -> dict[str, str]:
    pairs = (line.split(" ", 1) for line in (folder / "mosquitto.conf").read_text().splitlines()
             if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_config_writes_a_complete_deployment(tmp_path):
    out = tmp_path / "deploy"
    r = edgefl("broker", "config", "--devices", write_fleet(tmp_path, IDS), "-o", out, "--plain")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("warning: --plain: MQTT without TLS on 127.0.0.1: passwords and models cross")
    conf = conf_values(out)
    assert conf["listener"] == "1883 127.0.0.1" and conf["allow_anonymous"] == "false"
    assert conf["use_username_as_clientid"] == "true"      # a login cannot take over another client's id
    assert conf["password_file"] == "passwd" and conf["acl_file"] == "acl"
    assert conf["persistence"] == "true" and int(conf["autosave_interval"]) > 0 and conf["persistence_location"]
    assert int(conf["max_packet_size"]) == packet_limit(IDS).bytes > CHUNK_BYTES
    assert "message_size_limit" not in conf
    users = ["coordinator", *IDS]
    hashes = parse_password_file((out / "passwd").read_text())
    assert list(hashes) == users
    for user in users:
        cred = json.loads((out / "credentials" / f"{user}.json").read_text())
        assert set(cred) == {"username", "password"} and cred["username"] == user
        assert verify_password(cred["password"], hashes[user]) and hashes[user].startswith("$7$")
        assert mode(out / "credentials" / f"{user}.json") == 0o600
    assert len({credentials(out, u)["password"] for u in users}) == len(users)
    assert mode(out / "passwd") == 0o600 and mode(out / "acl") == 0o600
    compose = yaml.safe_load((out / "docker-compose.yml").read_text())["services"]["mosquitto"]
    assert compose["command"][-1] == "mosquitto.conf" and compose["network_mode"] == "host"
    unit = (out / "edgefl-broker.service").read_text()
    assert f"WorkingDirectory={out.resolve()}" in unit and "-c mosquitto.conf" in unit
    for name in ("passwd", "acl", "mosquitto.conf", "edgefl-broker.service", "docker-compose.yml"):
        assert f"wrote {out / name}" in r.stdout
    assert "4 new" in r.stdout and not (out / "tls").exists()


def test_a_deployment_git_would_not_ignore_is_warned_about(tmp_path):
    """The README's demo wrote deploy/ (CA key, server key, every login) into the checkout, untracked and
    unignored (issue 40): a deployment inside a git work tree that does not ignore it says so and the fix."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    fleet = write_fleet(tmp_path, IDS)
    r = edgefl("broker", "config", "--devices", fleet, "-o", "deploy", "--tls", "--host", "localhost", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stdout.splitlines() if line.startswith("warning:")]
    assert warning == [f"warning: deploy holds every login and the TLS keys inside the git work tree {tmp_path}, "
                       f"which does not ignore it: add '/deploy/' to {tmp_path}/.gitignore before 'git add'"], r.stdout
    (tmp_path / ".gitignore").write_text("/deploy/\n")
    r = edgefl("broker", "config", "--devices", fleet, "-o", "deploy", "--tls", "--host", "localhost", cwd=tmp_path)
    assert r.returncode == 0 and "warning:" not in r.stdout, r.stdout
    outside = tmp_path.parent / f"{tmp_path.name}-outside"      # no work tree: nothing to say
    r = edgefl("broker", "config", "--devices", fleet, "-o", outside, cwd=tmp_path.parent)
    assert r.returncode == 0 and "warning:" not in r.stdout, r.stdout


def test_rerun_keeps_logins_and_says_so(tmp_path):
    out = tmp_path / "deploy"
    assert edgefl("broker", "config", "--devices", write_fleet(tmp_path, IDS), "-o", out, "--plain").returncode == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = edgefl("broker", "config", "--devices", write_fleet(tmp_path, IDS[1:] + ["dev-d"]), "-o", out, "--plain")
    assert r.returncode == 0, r.stderr
    assert "1 new, 3 kept" in r.stdout and "1 removed" in r.stdout and "dev-a" in r.stdout
    assert not (out / "credentials" / "dev-a.json").exists()
    for user in ("coordinator", "dev-b", "dev-c"):
        assert (out / "credentials" / f"{user}.json").read_bytes() == before[f"{user}.json"]
    hashes = parse_password_file((out / "passwd").read_text())
    assert "dev-a" not in hashes and verify_password(credentials(out, "dev-d")["password"], hashes["dev-d"])
    r = edgefl("broker", "config", "--devices", write_fleet(tmp_path, IDS[1:] + ["dev-d"]), "-o", out, "--plain")
    assert f"unchanged {out / 'passwd'}" in r.stdout and "4 kept" in r.stdout


def test_plan_sizes_the_packet_limit(tmp_path):
    fleet = write_fleet(tmp_path, IDS)
    transfer = 300_000
    cost = {"runtime_baseline_bytes": 50_000_000, "weights_frozen_bytes": 0, "weights_trained_bytes": transfer,
            "gradient_bytes": transfer, "optimizer_bytes": transfer, "activation_bytes": 1_000_000,
            "workspace_bytes": 0, "flops_per_sample": 1e6, "upload_bytes": transfer // 2,
            "download_bytes": transfer, "trained_params": transfer // 4}
    plan = {"schema": "edgefl.plan/1", "method": "fedavg", "model": {"name": "cnn", "kwargs": {}}, "rounds": 5,
            "batch_size": 32, "optimizer": "sgd", "local_epochs": 1, "notes": [],
            "groups": {"lab": {"count": 3, "runtime": "torch", "examples": None, "min_memory_bytes": 60_000_000,
                               "budget": {"memory_bytes": 512 * 2**20, "upload_bytes": None, "flops_per_round": None},
                               "steps": [{"rounds": [1, 5], "config": {"num_layers": 4}, "predicted": cost}]}}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "deploy"
    r = edgefl("broker", "config", "--devices", fleet, "-o", out, "--plain", "--plan", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    limit = int(conf_values(out)["max_packet_size"])
    assert limit == packet_limit(IDS, transfer).bytes and transfer < limit < packet_limit(IDS).bytes
    r = edgefl("broker", "config", "--devices", fleet, "-o", out, "--plain", "--max-packet-size", "4MiB")
    assert r.returncode == 0 and int(conf_values(out)["max_packet_size"]) == 4 * 2**20
    plan["groups"] = {"other": plan["groups"]["lab"]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = edgefl("broker", "config", "--devices", fleet, "-o", out, "--plain", "--plan", tmp_path / "plan.json")
    assert_one_line_error(r, "do not match fleet groups")


@pytest.mark.parametrize("args,fleet,needles", [
    (["--devices", "missing.yaml"], None, ["missing.yaml", "cannot read"]),
    ([], "fleet:\n  groups:\n    lab: {count: 2, memory_budget: 1GiB, colour: red}\n", ["unknown key 'colour'"]),
    (["--port", "0"], "", ["--port 0", "between 1 and 65535"]),
    (["--port", "70000"], "", ["--port 70000"]),
    (["--max-packet-size", "lots"], "", ["--max-packet-size", "lots"]),
    (["--max-packet-size", "1GiB"], "", ["--max-packet-size", "256 MiB"]),
    ([], "fleet:\n  groups:\n    lab: {ids: [ok, 'a/b'], memory_budget: 1GiB}\n", ["'a/b'", "'/'"]),
    ([], "fleet:\n  groups:\n    lab: {ids: [coordinator], memory_budget: 1GiB}\n", ["'coordinator'", "rename"]),
    (["--plan", "nope.json"], "", ["nope.json", "cannot read the plan"]),
    (["--bind", "127.0.0.1 x"], "", ["--bind '127.0.0.1 x'"]),
    (["--tls", "--host", "bad host"], "", ["--host 'bad host'"]),
], ids=["missing-fleet", "unknown-key", "port-0", "port-high", "size-unparsable", "size-too-big", "slash-in-id",
        "coordinator-id", "missing-plan", "bind-with-space", "tls-host"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, fleet, needles):
    """Through the console-script entry point in this process (a subprocess each would cost seconds);
    the subprocess path is the same function, exercised by the tests around this one."""
    path = tmp_path / "fleet.yaml"
    if fleet is not None:
        path.write_text(fleet) if fleet else write_fleet(tmp_path, IDS)
    devices = [] if "--devices" in args else ["--devices", str(path)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["edgefl", "broker", "config", *devices, "-o", str(tmp_path / "deploy"), *args])
    with pytest.raises(SystemExit) as code:
        run()
    out, err = capsys.readouterr()
    assert_one_line_error(subprocess.CompletedProcess([], code.value.code, out, err), *needles)
    assert not (tmp_path / "deploy" / "credentials").exists()


def test_up_without_a_deployment_is_one_line(tmp_path):
    assert_one_line_error(edgefl("broker", "up", "--config", tmp_path), "mosquitto.conf", "edgefl broker config")


def _up(out, port, *extra):
    argv = [sys.executable, "-m", "edgefl", "broker", "up", "--config", str(out), *extra]
    return running(argv, out.parent, port)


def _deploy(tmp_path, *extra):
    out, port = tmp_path / "deploy", free_port()
    r = edgefl("broker", "config", "--devices", write_fleet(tmp_path, IDS), "-o", out, "--port", port,
               "--bind", "127.0.0.1", *(extra or ("--plain",)))
    assert r.returncode == 0, r.stderr
    return out, port


def _login(port, out, user, password=None, protocol=MQTTv5, client_id=None):
    c = Client(port, user, password if password is not None else credentials(out, user)["password"],
               protocol=protocol, client_id=client_id)
    return c, c.connect()


def test_up_runs_mosquitto_reloads_rotated_logins_and_stops_cleanly(tmp_path):
    out, port = _deploy(tmp_path)
    old = credentials(out, "dev-a")["password"]
    with _up(out, port) as proc:
        c, rc = _login(port, out, "dev-a")
        assert not rc.is_failure
        c.close()
        r = edgefl("broker", "config", "--devices", tmp_path / "fleet.yaml", "-o", out, "--port", port,
                   "--bind", "127.0.0.1", "--plain", "--rotate")
        assert r.returncode == 0 and "4 rotated" in r.stdout, r.stdout
        assert credentials(out, "dev-a")["password"] != old
        proc.send_signal(signal.SIGHUP)             # edgefl passes it on: mosquitto re-reads passwd and acl
        for _ in range(50):                          # the reload is asynchronous
            c, rc = _login(port, out, "dev-a", old)
            if rc.is_failure:
                break
            c.close()
        assert rc.is_failure, "the rotated-out password still logs in after SIGHUP"
        c, rc = _login(port, out, "dev-a")
        assert not rc.is_failure
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stdout.read()
    log = proc.stdout.read()
    assert "running /" in log and "mosquitto" in log
    assert (out / "data" / "mosquitto.db").exists()   # persistence saved on the clean shutdown


def test_up_embedded_enforces_the_same_logins_and_acl(tmp_path):
    pytest.importorskip("amqtt")
    out, port = _deploy(tmp_path)
    with _up(out, port, "--embedded") as proc:
        # amqtt speaks MQTT 3.1.1 only; a client's id is its login (mosquitto's use_username_as_clientid)
        coordinator, rc = _login(port, out, "coordinator", protocol=MQTTv311, client_id="coordinator")
        assert not rc.is_failure
        a, rc = _login(port, out, "dev-a", protocol=MQTTv311, client_id="dev-a")
        assert not rc.is_failure
        assert _login(port, out, "dev-b", "wrong", protocol=MQTTv311, client_id="dev-b")[1].is_failure
        assert _login(port, out, "dev-c", protocol=MQTTv311, client_id="dev-x")[1].is_failure   # an id not its own
        try:
            a.subscribe("fl/v1/dev/dev-b/down/#", "fl/v1/dev/dev-a/down/#")
            coordinator.subscribe("fl/v1/#")
            coordinator.publish("fl/v1/dev/dev-b/down/instr", b"for b")
            coordinator.publish("fl/v1/dev/dev-a/down/instr", b"for a")
            assert not [t for t, _ in a.wait_for("fl/v1/dev/dev-a/down/instr", b"for a") if "dev-b" in t]
            a.publish("fl/v1/dev/dev-b/up/metrics", b"forged")
            a.publish("fl/v1/dev/dev-a/up/metrics", b"own")
            got = coordinator.wait_for("fl/v1/dev/dev-a/up/metrics", b"own")
            assert ("fl/v1/dev/dev-b/up/metrics", b"forged") not in got
        finally:
            a.close()
            coordinator.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    log = proc.stdout.read()
    assert "EMBEDDED PYTHON BROKER" in log and "trusted network" in log
