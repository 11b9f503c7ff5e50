"""Faults of a served run, with real processes: the coordinator killed mid-round and restarted, a device
killed mid-round (issue: surviving faults)."""
import json
import os
import signal
import subprocess
import time

import pytest

from served_run import ServedRun, wait_for, write_plan

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
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=5)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=1600) as run:
        serve = subprocess.Popen(run.serve_command(state, 5, "--round-timeout", "120"), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        journal = state / "journal" / "3"
        wait_for(lambda: journal.exists() and any(journal.glob("*.npz")) or serve.poll() is not None, 400,
                 "a report of round 3 in the journal")
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        kept = sorted(p.stem for p in journal.glob("*.npz"))
        assert kept and len(_rounds(state)) == 2, (kept, len(_rounds(state)))

        history = run.serve(state, 5, "--round-timeout", "120")     # the same command, the same --state
        rounds = history["rounds"]
        assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
        for r in rounds:
            assert r["aggregated"] and sum(r["participating_devices"].values()) == 4, r["failed"]
        for device in kept:   # accepted before the kill: aggregated in round 3 without training round 3 again
            assert _round_lines(run, device, 3) == 1, run.logs()
        assert not any(journal.parent.iterdir()), "the journal of a checkpointed round is dropped"


def test_a_device_killed_mid_round_misses_it_and_the_run_goes_on(tmp_path):
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=3)
    state = tmp_path / "state"
    with ServedRun(tmp_path, fleet, plan, train_limit=1600) as run:
        serve = subprocess.Popen(run.serve_command(state, 3, "--round-timeout", "25", "--min-reports", "3"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: len(_rounds(state)) >= 1 or serve.poll() is not None, 400, "round 1")
        victim = run.device_pids()["laptop-0"]
        os.kill(victim, signal.SIGKILL)
        out, _ = serve.communicate(timeout=400)
        assert serve.returncode == 0, out[-3000:]
    rounds = _rounds(state)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert rounds[0]["participating_devices"] == {"pi": 3, "laptop": 1}
    second, third = rounds[1], rounds[2]
    assert "laptop-0" in second["missing"] and second["aggregated"]
    assert second["participating_devices"] == {"pi": 3}
    assert second["wall_s"] >= 20          # it waited for the dead device until the deadline
    assert third["skipped"].get("laptop-0") == "offline" and third["aggregated"]
    assert third["participating_devices"] == {"pi": 3}
