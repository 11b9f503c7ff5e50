"""The fault suite: one served-run fault per test, on a real mosquitto with real agent processes, each checked
for what must hold (docs/device-protocol.md): nothing hangs, no report is lost, none is taken twice, nothing
is resumed from a damaged state. ORT devices on small shares keep a round near a second; timeouts are short.

Numbers are the issue's fault list: 1 a missed round, 2 a broker SIGKILL, 3 a broker SIGTERM, 4 client-id
takeover, 5 stray upload pieces, 6 a full disk, 7 corrupt state, 8 the device cache, 9 a coordinator restart
and the broker's plain-text default."""
from __future__ import annotations

import contextlib
import queue
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from broker_fixture import Client, credentials, free_port, running, write_fleet
from mosquitto import Mosquitto
from served_run import ServedRun, edgefl, fill_disk, wait_for, write_plan

from edgefl import topics

pytestmark = pytest.mark.usefixtures("one_thread")

FLEET = """fleet:
  name: faults
  groups:
    pc: {count: 3, runtime: ort, memory_budget: 1GiB}
"""
DEVICES = ("pc-0", "pc-1", "pc-2")


# ----------------------------------------------------------------------------------------------- helpers

def _rounds(state: Path) -> list[dict]:
    try:
        return json.loads((state / "history.json").read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return []


def _status(state: Path) -> dict:
    try:
        return json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _lines(run: ServedRun, device: str, round: int) -> list[str]:
    """What the agent logged about `round`: 'ok, loss ...', 'dropped: ...', 'failed ...'."""
    log = run.folder / "fleet" / "logs" / f"{device}.log"
    prefix = f"{device}: round {round}: "
    text = log.read_text() if log.exists() else ""
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def _trained(run: ServedRun, device: str, round: int) -> int:
    return sum(line.startswith("ok") for line in _lines(run, device, round))


def _serve(run: ServedRun, state: Path, rounds: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(run.serve_command(state, rounds, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(serve: subprocess.Popen, run: ServedRun, timeout: float = 120) -> str:
    try:
        out, _ = serve.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        serve.kill()
        out, _ = serve.communicate()
        raise AssertionError(f"serve did not finish within {timeout:.0f} s:\n{out[-3000:]}\n{run.logs()}") from None
    assert serve.returncode == 0, f"{out[-3000:]}\n{run.logs()}"
    return out


def _all_aggregated(state: Path, rounds: int, devices=DEVICES) -> list[dict]:
    records = _rounds(state)
    assert [r["round"] for r in records] == list(range(1, rounds + 1)), records
    for r in records:
        assert r["aggregated"] and sorted(r["device_metrics"]) == sorted(devices), (r["round"], r["failed"],
                                                                                   r["missing"])
    return records


# ------------------------------------------------------------------------------- 1: a device misses a round

def test_1_a_device_that_misses_a_round_drops_it_and_trains_the_next(tmp_path):
    """pc-1 is paused through round 2's deadline; the coordinator ships round 3's weights under a new name.
    Resumed, pc-1 drops the stale round 2 (the round-closed notice) and trains round 3, at once."""
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=4)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=192) as run:
        serve = _serve(run, state, 4, "--round-timeout", "6", "--grace", "1")
        wait_for(lambda: _trained(run, "pc-1", 1) or serve.poll() is not None, 120, "pc-1 trained round 1")
        pid = run.device_pids()["pc-1"]
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: len(_rounds(state)) >= 2 or serve.poll() is not None, 60, "round 2 closed")
        finally:
            os.kill(pid, signal.SIGCONT)
        _finish(serve, run)
        records = _rounds(state)
        assert "pc-1" not in records[1]["device_metrics"]          # it missed round 2 ...
        assert not _trained(run, "pc-1", 2), _lines(run, "pc-1", 2)
        for r in records[2:]:                                       # ... and is back for 3 and 4
            assert r["aggregated"] and "pc-1" in r["device_metrics"], (r["round"], r["failed"], r["missing"])
            assert r["wall_s"] < 6, r                                # nobody waited out a deadline
        assert all(_trained(run, "pc-1", n) == 1 for n in (3, 4)), run.logs()
        # the weights each round started from are still there under their own names (never rewritten)
        versions = sorted(int(p.name[1:]) for p in next((state / "artifacts").iterdir()).glob("v*"))
        assert len(versions) >= 2 and versions == sorted(set(versions))


def _bare_agent(tmp_path: Path, broker: Mosquitto, device: str) -> subprocess.Popen:
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", np.zeros((4, 1, 28, 28), np.float32))
    np.save(data / "y.npy", np.zeros(4, np.int64))
    return subprocess.Popen([sys.executable, "-m", "edgefl.device_runtime.cli", "run", "--id", device, "--broker",
                             broker.url, "--data", str(data), "--runtime", "ort", "--cache", str(tmp_path / "cache"),
                             "--power", "3W"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _await_online(client: Client, device: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        topic, payload = client.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        if topic == topics.presence(device) and json.loads(payload).get("online"):
            return


def test_1_sigterm_ends_an_agent_stuck_in_a_fetch_within_seconds(tmp_path):
    """An instruction names an artifact nobody serves: the agent asks, backs off, asks again, and on SIGTERM
    exits at once (it used to sit in the fetch loop until its 600 s limit)."""
    from edgefl.messages import RoundInstruction
    from edgefl.protocol.envelopes import Assignment
    from edgefl.trainconfig import TrainConfig

    with Mosquitto(tmp_path / "broker") as broker:
        coordinator = Client(broker.port, None, None, client_id="coordinator")
        assert not coordinator.connect().is_failure
        coordinator.subscribe(f"{topics.ROOT}/#")
        agent = _bare_agent(tmp_path, broker, "pi-0")
        try:
            _await_online(coordinator, "pi-0")
            ins = RoundInstruction(round=1, device_id="pi-0", config=TrainConfig(num_layers=4), weights_version=1,
                                   seed=0, lr=0.05)
            nobody = hashlib.sha256(b"an artifact nobody serves").hexdigest()
            coordinator.publish(topics.instruction("pi-0"), Assignment(ins, None, {"set": nobody}).dumps())
            asks = 0
            deadline = time.monotonic() + 20
            while asks < 2 and time.monotonic() < deadline:      # it asked, and asked again after a pause
                with contextlib.suppress(Exception):
                    topic, _ = coordinator.inbox.get(timeout=1)
                    asks += topic == topics.ack("pi-0")
            assert asks == 2, "the agent did not ask for the artifact twice within 20 s"
            agent.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            agent.wait(timeout=10)
            assert time.monotonic() - sent < 5
        finally:
            if agent.poll() is None:
                agent.kill()
            coordinator.close()
        out = agent.stdout.read()
        assert "Traceback" not in out, out


# ------------------------------------------------------------------------ 2, 3: the broker dies mid-round

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_2_3_a_broker_restart_mid_round_loses_no_report(tmp_path, sig):
    """The broker dies while round 2 trains and comes back only after a device has finished round 2 into the
    void (its log says ok). SIGTERM also sends every client's will. Every device's round-2 report is still
    taken, once, and round 2 aggregates all three."""
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=3)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=1500) as run:
        serve = _serve(run, state, 3, "--round-timeout", "90")
        wait_for(lambda: any(d.get("state") == "training" for d in _status(state).get("devices", {}).values())
                 and _status(state).get("round") == 2 or serve.poll() is not None, 120, "a device training round 2")
        run.broker.proc.send_signal(sig)
        run.broker.proc.wait(timeout=10)
        wait_for(lambda: any(_trained(run, d, 2) for d in DEVICES), 60, "a device done with round 2, broker down")
        time.sleep(0.5)
        run.broker.start()                     # the same port, the same persistence folder
        _finish(serve, run)
        _all_aggregated(state, 3)
        for device in DEVICES:
            assert _trained(run, device, 2) == 1, run.logs()       # resent, not retrained


# ------------------------------------------------------------------------ 4: client-id takeover

def _takeover(out: Path, port: int, victim: str, attacker: str) -> bool:
    """Whether `mosquitto_sub` logged in as `attacker` with client id `victim` kicks the connected `victim` (its
    own login, its own id) off the broker."""
    ca = out / "tls" / "ca.crt"
    holder = Client(port, victim, credentials(out, victim)["password"], ca=ca, client_id=victim,
                    will=topics.presence(victim))
    try:
        assert not holder.connect(timeout=30).is_failure
        sub = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "--cafile", str(ca), "-u",
                              attacker, "-P", credentials(out, attacker)["password"], "-i", victim, "-t",
                              topics.instruction(attacker), "-W", "2"], capture_output=True, text=True, timeout=30)
        assert "refused" not in sub.stderr.lower(), sub.stderr       # its own login is good
        with contextlib.suppress(queue.Empty):
            holder.connack.get(timeout=1)          # a DISCONNECT (session taken over), or the reconnect after it
            return True
        return False
    finally:
        holder.close()


def test_4_a_login_cannot_take_over_another_client_id(tmp_path):
    ids = ["phone-0", "phone-1"]
    out, port = tmp_path / "deploy", free_port()
    r = subprocess.run(edgefl("broker", "config", "--devices", str(write_fleet(tmp_path, ids)), "-o", str(out),
                              "--port", str(port), "--bind", "127.0.0.1", "--host", "127.0.0.1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    conf = out / "mosquitto.conf"
    mosquitto = [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", "mosquitto.conf"]
    with running(mosquitto, out, port):
        assert not _takeover(out, port, "phone-1", "phone-0")
        assert not _takeover(out, port, "coordinator", "phone-0")
    # the positive control: without the binding the same command kicks the device and the coordinator off
    conf.write_text(conf.read_text().replace("use_username_as_clientid true", ""))
    with running(mosquitto, out, port):
        assert _takeover(out, port, "phone-1", "phone-0")


# ------------------------------------------------------------------------ 5: stray upload pieces

def test_5_stray_upload_pieces_do_not_displace_the_real_report(tmp_path):
    """As round 2's instruction reaches pc-0, broken pieces appear on its upload topics: a meta that is not
    JSON, chunks with no meta, a meta whose chunk does not match it. Its real report is still taken."""
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=2)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=192) as run:
        spy = Client(run.broker.port, None, None, client_id="spy")
        assert not spy.connect(timeout=30).is_failure
        spy.subscribe(topics.instruction("pc-0"), timeout=30)
        serve = _serve(run, state, 2, "--round-timeout", "60", "--grace", "2")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                _, payload = spy.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                if json.loads(payload)["instruction"]["round"] == 2:
                    break
            spy.publish(topics.result_meta("pc-0", 2, "0123456789abcdef"), b"{not json")
            for seq in range(3):
                spy.publish(topics.result_chunk("pc-0", 2, "fedcba9876543210", seq), os.urandom(1000))
            meta = {"schema": "edgefl.upload/2", "report": {"round": 2, "device_id": "pc-0", "status": "ok"},
                    "tensors": {"order": [], "bytes": 1000, "sha256": "0" * 64, "chunks": 1}, "download": {}}
            spy.publish(topics.result_meta("pc-0", 2, "00000000000000aa"), json.dumps(meta).encode())
            spy.publish(topics.result_chunk("pc-0", 2, "00000000000000aa", 0), os.urandom(1000))
        finally:
            spy.close()
        _finish(serve, run)
        _all_aggregated(state, 2)
        assert _trained(run, "pc-0", 2) == 1, run.logs()


# ------------------------------------------------------------------------ 6: a full disk

@contextlib.contextmanager
def _tmpfs(folder: Path, size: str):
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_6_a_full_disk_is_one_line_naming_the_folder_and_a_restart_resumes(tmp_path):
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=4)
    with _tmpfs(tmp_path / "disk", "256m") as disk, ServedRun(tmp_path, fleet, plan, train_limit=1500) as run:
        state = disk / "state"
        serve = _serve(run, state, 4, "--round-timeout", "60")
        wait_for(lambda: len(_rounds(state)) >= 1 or serve.poll() is not None, 120, "round 1 checkpointed")
        filler = fill_disk(disk)
        out, _ = serve.communicate(timeout=120)
        assert serve.returncode == 2, out[-3000:]         # the exit of a user-fixable error
        error = [line for line in out.splitlines() if "error:" in line]
        assert len(error) == 1 and "Traceback" not in out, out[-3000:]
        assert "no space left" in error[0] and str(state) in error[0] and re.search(r"\([\d.]+ [KMG]i?B needed", error[0]), error
        assert not [p for p in state.rglob("*") if ".tmp" in p.name], sorted(state.rglob("*"))
        done = len(_rounds(state))
        assert 1 <= done < 4

        filler.unlink()
        _finish(_serve(run, state, 4, "--round-timeout", "60"), run)
        _all_aggregated(state, 4)


# ------------------------------------------------------------------------ 7: corrupt state

@pytest.fixture(scope="module")
def killed_state(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A served run's state after a SIGKILL in round 3 with a report journaled: (state, plan, fleet)."""
    folder = tmp_path_factory.mktemp("killed")
    fleet, plan = write_plan(folder, FLEET, "fedavg", rounds=4)
    state = folder / "state"
    with ServedRun(folder, fleet, plan, train_limit=192) as run:
        serve = _serve(run, state, 4, "--round-timeout", "60")
        wait_for(lambda: _trained(run, "pc-2", 2) or serve.poll() is not None, 120, "pc-2 done with round 2")
        late = run.device_pids()["pc-2"]
        os.kill(late, signal.SIGSTOP)          # round 3 waits for it: the others' reports sit in the journal
        try:
            journal = state / "journal" / "3"
            wait_for(lambda: len(list(journal.glob("*.npz"))) >= 2 or serve.poll() is not None, 120,
                     "two reports of round 3 journaled")
            serve.kill()
            serve.wait()
        finally:
            os.kill(late, signal.SIGCONT)
    return state, plan, fleet


def _corrupt(case: str, state: Path) -> Path:
    """Damage the state as `case` says; the file a good error names."""
    if case == "truncated-weights":
        path = state / json.loads((state / "checkpoint.json").read_text())["weights"]
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif case == "truncated-journal":
        path = sorted((state / "journal" / "3").glob("*.npz"))[0]
        path.write_bytes(path.read_bytes()[:100])
    elif case == "checkpoint-round-edited":
        path = state / "checkpoint.json"
        path.write_text(re.sub(r'"round": \d+', '"round": 5', path.read_text()))
    elif case == "journal-copied-over-another":
        first, second = sorted((state / "journal" / "3").glob("*.npz"))[:2]
        shutil.copyfile(first, second)
        path = second
    elif case == "history-cut":
        path = state / "history.json"
        h = json.loads(path.read_text())
        h["rounds"] = h["rounds"][:1]
        path.write_text(json.dumps(h))
    return path


@pytest.mark.parametrize("case", ["truncated-weights", "truncated-journal", "checkpoint-round-edited",
                                  "journal-copied-over-another", "history-cut"])
def test_7_a_corrupt_state_is_refused_before_connecting_naming_the_file(tmp_path, killed_state, case):
    source, plan, fleet = killed_state
    state = tmp_path / "state"
    shutil.copytree(source, state)
    damaged = _corrupt(case, state)
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    nobody = f"mqtt://127.0.0.1:{free_port()}"        # a broker that is not there: the state fails first
    r = subprocess.run(edgefl("serve", "--plan", str(plan), "--broker", nobody, "--state", str(state), "--rounds",
                              "4", "--devices", str(fleet), "--wait-online", "5"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("edgefl: error: ") and str(damaged) in line and "broker" not in line.lower(), line
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before     # nothing touched


# ------------------------------------------------------------------------ 8: the device cache

def test_8_the_device_cache_stays_within_its_budget_and_says_its_size(tmp_path):
    fleet, plan = write_plan(tmp_path, FLEET.replace("count: 3", "count: 1"), "fedavg", rounds=4)
    cache = tmp_path / "fleet" / "cache" / "pc-0"
    (cache / "partial").mkdir(parents=True)
    stale = os.urandom(3 * 2**20)                        # a whole file of an old run, and a fetch given up on
    old = cache / hashlib.sha256(stale).hexdigest()
    old.write_bytes(stale)
    partial = cache / "partial" / hashlib.sha256(b"gone").hexdigest()
    partial.write_bytes(b"\0" * 2**20)
    for p in (old, partial):
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=192, cache_budget="64KiB") as run:
        _finish(_serve(run, state, 4, "--round-timeout", "60"), run)
    sizes = [r["device_metrics"]["pc-0"]["cache_bytes"] for r in _all_aggregated(state, 4, ["pc-0"])]
    assert not old.exists() and not partial.exists()
    on_disk = {(st.st_ino, st.st_size) for p in cache.rglob("*") if p.is_file() for st in [p.stat()]}
    assert sum(size for _, size in on_disk) == sizes[-1]
    # what is kept is the set just trained, plus at most the budget: it does not grow with the rounds
    assert max(sizes[1:]) <= sizes[0] + 64 * 1024, sizes


# ------------------------------------------------------------------- 9: a coordinator restart, TLS default

def test_9_a_restarted_coordinator_does_not_make_a_device_train_twice(tmp_path):
    """The coordinator is killed as round 2's instructions go out; the devices answer while it is down. The
    restarted coordinator sends round 2 again: each device answers with the report it has, not a second
    training, and that report is taken."""
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=3)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=192) as run:
        serve = _serve(run, state, 3, "--round-timeout", "60")
        wait_for(lambda: _status(state).get("round") == 2 or serve.poll() is not None, 120, "round 2 under way")
        serve.kill()
        serve.wait()
        wait_for(lambda: all(_trained(run, d, 2) for d in DEVICES), 60, "every device done with round 2")
        _finish(_serve(run, state, 3, "--round-timeout", "60"), run)
        _all_aggregated(state, 3)
        for device in DEVICES:
            assert _trained(run, device, 2) == 1, run.logs()


def test_9_broker_config_is_tls_unless_plain_text_is_asked_for(tmp_path):
    fleet = write_fleet(tmp_path, ["phone-0"])
    r = subprocess.run(edgefl("broker", "config", "--devices", str(fleet), "-o", str(tmp_path / "tls")),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    conf = (tmp_path / "tls" / "mosquitto.conf").read_text()
    assert re.search(r"^listener 8883\b", conf, re.M) and re.search(r"^certfile ", conf, re.M), conf
    r = subprocess.run(edgefl("broker", "config", "--devices", str(fleet), "-o", str(tmp_path / "plain"),
                              "--plain"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.startswith("warning: --plain"), r.stderr
    conf = (tmp_path / "plain" / "mosquitto.conf").read_text()
    assert re.search(r"^listener 1883 127\.0\.0\.1$", conf, re.M) and "certfile" not in conf, conf
