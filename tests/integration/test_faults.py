"""Faults of a served run, with real processes: the coordinator killed mid-round and restarted, a device
killed mid-round (issues: surviving faults; operating a served run)."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
from served_run import ServedRun, edgefl, wait_for, write_plan

pytestmark = pytest.mark.usefixtures("one_thread")

FLEET = """fleet:
  name: faults
  groups:
    pi: {count: 3, runtime: ort, memory_budget: 1GiB}
    laptop: {count: 1, runtime: torch, memory_budget: 2GiB}
"""


def _rounds(state) -> list[dict]:
    try:
        return json.loads((state / "history.json").read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return []


def _round_lines(run: ServedRun, device: str, round: int) -> int:
    log = run.folder / "fleet" / "logs" / f"{device}.log"
    return sum(line.startswith(f"{device}: round {round}:") for line in log.read_text().splitlines())


def test_coordinator_killed_in_round_3_resumes_and_loses_no_accepted_report(tmp_path):
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=4)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=1600) as run:
        serve = subprocess.Popen(run.serve_command(state, 4, "--round-timeout", "120"), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        journal = state / "journal" / "3"
        wait_for(lambda: journal.exists() and any(journal.glob("*.npz")) or serve.poll() is not None, 400,
                 "a report of round 3 in the journal")
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        kept = sorted(p.stem for p in journal.glob("*.npz"))
        assert kept and len(_rounds(state)) == 2, (kept, len(_rounds(state)))

        history = run.serve(state, 4, "--round-timeout", "120")     # the same command, the same --state
        rounds = history["rounds"]
        assert [r["round"] for r in rounds] == [1, 2, 3, 4]
        for r in rounds:
            assert r["aggregated"] and sum(r["participating_devices"].values()) == 4, r["failed"]
        for device in kept:   # accepted before the kill: aggregated in round 3 without training round 3 again
            assert _round_lines(run, device, 3) == 1, run.logs()
        assert not any(journal.parent.iterdir()), "the journal of a checkpointed round is dropped"


def _state(state, device: str, round: int):
    """A device's state in the round in progress, as serve's status file has it (None before)."""
    try:
        status = json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status["devices"].get(device, {}).get("state") if status.get("round") == round else None


def test_a_device_killed_mid_round_is_dropped_at_once_and_the_run_goes_on(tmp_path):
    """Its presence (the broker's last will) says it is gone: the round closes without waiting out the
    300 s deadline, records it as failed, and the live output and `edgefl status` show it."""
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=3)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=1600) as run:
        serve = subprocess.Popen(run.serve_command(state, 3, "--round-timeout", "300", "--min-reports", "3"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: _state(state, "laptop-0", 2) in ("downloading", "training") or serve.poll() is not None,
                 400, "laptop-0 at work in round 2")
        shown = subprocess.run(edgefl("status", str(state)), capture_output=True, text=True, timeout=60).stdout
        os.kill(run.device_pids()["laptop-0"], signal.SIGKILL)
        killed = time.monotonic()
        out, _ = serve.communicate(timeout=400)
        assert serve.returncode == 0, out[-3000:]
        after = subprocess.run(edgefl("status", str(state)), capture_output=True, text=True, timeout=60).stdout
    rounds = _rounds(state)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert rounds[0]["participating_devices"] == {"pi": 3, "laptop": 1}
    second, third = rounds[1], rounds[2]
    assert second["failed"]["laptop-0"].startswith("offline: its connection was lost (last will)"), second
    assert not second["missing"] and second["aggregated"] and second["participating_devices"] == {"pi": 3}
    assert second["wall_s"] < 150                  # not the 300 s deadline
    assert third["skipped"].get("laptop-0") == "offline" and third["aggregated"]
    assert third["participating_devices"] == {"pi": 3}
    assert time.monotonic() - killed < 300

    # the live output: one timestamped line per change, the kill among them as it happened
    events = re.findall(r"^\d\d:\d\d:\d\d round (\d): (\S+) (\w+)", out, re.M)
    assert ("2", "laptop-0", "offline") in events, out[-3000:]
    for device in ("pi-0", "pi-1", "pi-2"):
        assert [s for r, d, s in events if r == "2" and d == device][-1] == "reported", out[-3000:]
    assert re.search(r"^\d\d:\d\d:\d\d round 2: waiting for 4 devices until \d\d:\d\d:\d\d \(\d+ s\)$", out, re.M)
    # edgefl status while round 2 ran, and after the run
    assert re.search(r"^round 2 of 3: \d/4 reported, deadline in \d+ s", shown, re.M), shown
    assert re.search(r"^  laptop-0 +laptop +(downloading|training) ", shown, re.M), shown
    assert after.startswith("run completed at ") and "round 2: 3/4 reports" in after, after
    assert "failed: laptop-0 (offline: its connection was lost" in after, after
