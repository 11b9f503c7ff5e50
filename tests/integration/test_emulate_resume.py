"""`edgefl emulate --resume`: a run killed mid-way continues from its last checkpoint and ends bit-identical
to the uninterrupted run (history but for wall times, and weights); a resume that cannot be is one line."""
import json
import os
import signal
import subprocess
import sys
import time

import torch

CLI = [sys.executable, "-m", "edgefl", "emulate", "--model", "cnn", "--dataset", "fashion-mnist",
       "--method", "profl", "--clients-per-round", "4", "--train-limit", "300", "--test-limit", "200"]
ROUNDS = 6


def emulate(fleet, out, *extra, rounds=ROUNDS, **kwargs):
    return subprocess.Popen([*CLI, "--devices", str(fleet), "--rounds", str(rounds), "-o", str(out), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ, **kwargs)


def checkpointed(out) -> int:
    try:
        return json.loads((out / "checkpoint" / "checkpoint.json").read_text())["round"]
    except (OSError, ValueError):
        return 0


def history(out) -> list[dict]:
    rounds = json.loads((out / "history.json").read_text())["rounds"]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rounds]


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, fleet_text):
    """The stopped run is a real interruption: the process is SIGKILLed as soon as round 2 is checkpointed,
    wherever it is in round 3 (no --rounds 2 then more: the learning-rate schedule and ProFL's plan depend on
    the run's length, so a shorter run is another run)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    whole = emulate(fleet, tmp_path / "whole")
    killed = emulate(fleet, tmp_path / "run")
    deadline = time.monotonic() + 300
    while checkpointed(tmp_path / "run") < 2 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL, killed.stderr.read()
    stopped_at = checkpointed(tmp_path / "run")
    assert 2 <= stopped_at < ROUNDS and not (tmp_path / "run" / "weights.pt").exists()
    assert len(history(tmp_path / "run")) >= stopped_at

    resumed = emulate(fleet, tmp_path / "run", "--resume")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    assert whole.wait(timeout=600) == 0, whole.stderr.read()

    a, b = history(tmp_path / "whole"), history(tmp_path / "run")
    assert [r["round"] for r in b] == list(range(1, ROUNDS + 1))
    assert "effective_movement" in a[-1]["decisions"]          # ProFL's EM history came through the checkpoint
    assert a == b
    wa, wb = (torch.load(p / "weights.pt") for p in (tmp_path / "whole", tmp_path / "run"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_resume_that_cannot_be_is_one_line(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"

    def refused(*extra, rounds=ROUNDS) -> str:
        p = emulate(fleet, out, *extra, rounds=rounds)
        assert p.wait(timeout=300) == 2
        err = p.stderr.read().strip()
        assert "Traceback" not in err and "\n" not in err, err
        return err

    err = refused("--resume")
    assert err == (f"edgefl: error: -o {out}: no checkpoint to resume ({out}/checkpoint/checkpoint.json is missing: "
                   "it is not a run folder); run without --resume to start it afresh (--force to replace it)")
    assert emulate(fleet, out, rounds=1).wait(timeout=300) == 0
    err = refused("--resume", "--lr", "0.1", rounds=1)
    assert err == (f"edgefl: error: {out}/config.json: the run in {out} was started with lr = 0.05, not 0.1; resume "
                   "it with the options it was started with, or drop --resume and give another -o")
    assert "--force" in refused("--resume", "--force", rounds=1)
