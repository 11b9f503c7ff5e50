"""A malicious device in a served run (issue: report validation), with real processes: a real mosquitto,
`edgefl fleet up` for the honest devices, `edgefl serve`, and `malicious_device.py` speaking the device
protocol. Every kind of bad upload is refused with its reason, every round still aggregates, and the
global model ends bit for bit where the same plan ends without the malicious device."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from served_run import ServedRun, edgefl, write_plan

from edgefl.transport.mqtt import MqttTransport
from edgefl.units import format_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

MALICIOUS = Path(__file__).resolve().parents[1] / "malicious_device.py"
ROUNDS = 5
HONEST = ["pi-0", "pi-1"]
HONEST_FLEET = "fleet:\n  name: attacked\n  groups:\n    pi: {count: 2, runtime: ort, memory_budget: 1GiB}\n"
FLEET = HONEST_FLEET + "    evil: {count: 1, runtime: ort, memory_budget: 1GiB}\n"


def _serve(run: ServedRun, fleet: Path, state: Path, wait_online: float) -> list[dict]:
    """`edgefl serve` of every device of `fleet` each round, the same seeds every time."""
    r = subprocess.run(edgefl("serve", "--plan", str(run.plan), "--broker", run.broker.url, "--state", str(state),
                              "--rounds", str(ROUNDS), "--devices", str(fleet), "--clients-per-round", "3",
                              "--seed", "0", "--round-timeout", "120", "--wait-online", str(wait_online)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{run.logs()}"
    return json.loads((state / "history.json").read_text())["rounds"]


def _upload_bytes(state: Path) -> int:
    """What an honest upload holds: the set's trained tensors as one float32 buffer."""
    manifest = next((state / "artifacts").glob("*/v*/manifest.json"))     # every weights version alike
    return sum(4 * int(np.prod(t["shape"])) for t in json.loads(manifest.read_text())["trainable"])


def test_every_bad_report_is_refused_and_the_model_ends_as_without_the_attacker(tmp_path):
    fleet, plan = write_plan(tmp_path, FLEET, "fedavg", rounds=ROUNDS)
    honest_fleet = tmp_path / "honest.yaml"
    honest_fleet.write_text(HONEST_FLEET)       # fleet up: the honest devices get the same data shares both times
    with ServedRun(tmp_path, honest_fleet, plan, train_limit=256) as run:
        observer = MqttTransport(run.broker.url, client_id="test-observer")
        online = observer.wait_online(HONEST, timeout_s=120)
        observer.close()
        assert set(HONEST) <= set(online), run.logs()
        clean = _serve(run, fleet, tmp_path / "clean", wait_online=3)

        evil = subprocess.Popen([sys.executable, str(MALICIOUS), "--id", "evil-0", "--broker", run.broker.url,
                                 "--cache", str(tmp_path / "evil-cache"), "--watch", ",".join(HONEST),
                                 "--rounds", str(ROUNDS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            attacked = _serve(run, fleet, tmp_path / "attacked", wait_online=60)
            out, _ = evil.communicate(timeout=60)
        finally:
            if evil.poll() is None:
                evil.kill()
                evil.wait()
        assert evil.returncode == 0, out

    for r in clean:
        assert r["skipped"] == {"evil-0": "offline"} and not r["rejected"] and not r["failed"], r
    expected_bytes = _upload_bytes(tmp_path / "attacked")
    refused = {                 # round -> device -> what its rejection must say (every reason of the round)
        1: {"evil-0": ["uploaded tensors it was not asked to train: layers.0.0.weight.renamed",
                       "upload rejected: no instruction for round 2 has been sent yet"],
            "intruder": ["upload rejected: intruder was not sent an instruction for round 1"]},
        # round 2's replay of pi-0's accepted upload byte for byte is that same upload (its name): taken once;
        # under another name it is a second report of pi-0
        2: {"evil-0": ["tensor layers.0.0.weight has shape (25, 32), expected (32, 1, 5, 5)",
                       "upload rejected: round 1 is closed"],
            "pi-0": ["pi-0: duplicate report for round 2"]},
        3: {"evil-0": ["tensor layers.0.0.weight has dtype float64, expected float32"]},
        4: {"evil-0": ["tensor layers.0.0.weight contains NaN or Inf"]},
        5: {"evil-0": [f"upload rejected: more than the {format_bytes(expected_bytes)} of tensors its instruction "
                       "expects"]},
    }
    assert [r["round"] for r in attacked] == list(range(1, ROUNDS + 1))
    for r, reference in zip(attacked, clean, strict=True):
        # the round went on: both honest reports aggregated, nobody waited for, nothing filed as a device failure
        assert r["aggregated"] and r["participating_devices"] == {"pi": 2}, r
        assert not r["failed"] and not r["missing"] and not r["skipped"], r
        assert sorted(r["rejected"]) == sorted(refused[r["round"]]), r["rejected"]
        for device, reasons in refused[r["round"]].items():
            got = r["rejected"][device].split(" | ")
            assert len(got) == len(reasons), got
            for reason in reasons:
                assert any(reason in g for g in got), (reason, got)
        assert r["upload_bytes"] == reference["upload_bytes"] == 2 * expected_bytes

    clean_weights, attacked_weights = (torch.load(tmp_path / name / "weights.pt") for name in ("clean", "attacked"))
    assert clean_weights.keys() == attacked_weights.keys()
    for key, value in clean_weights.items():
        assert torch.equal(attacked_weights[key], value), key
    initial = _initial_state()
    assert any(not torch.equal(clean_weights[k], initial[k]) for k in initial)     # and the runs did train


def _initial_state() -> dict:
    """The global model before round 1, as serve seeds it (TorchServerModel)."""
    from edgefl.zoo import ModelRef, build

    torch.manual_seed(0)
    return build(ModelRef.of("cnn")).state_dict()
