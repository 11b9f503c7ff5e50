"""Emulation end to end on real Fashion-MNIST (a seeded subset), CPU."""
import json
import os
import subprocess
import sys

import pytest
import torch

from edgefl.data import parse_partition
from edgefl.engines.local import emulate
from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import STRATEGIES, PlanContext, get_strategy
from edgefl.server.coordinator import LoopSettings
from edgefl.zoo import ModelRef

pytestmark = pytest.mark.usefixtures("one_thread")



def run(method, data, fleet_text, rounds=3, per_round=4, store=None):
    train, test = data
    fleet = parse_fleet(fleet_text)
    ref = ModelRef.of("cnn")
    strategy = get_strategy(method)
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=rounds, batch_size=32, **({"store": store} if store else {}))), fleet)
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    records, _ = emulate(fleet, plan, strategy, plan.model, train, test, shares,
                         LoopSettings(rounds=rounds, clients_per_round=per_round, lr=0.05, seed=0))
    return plan, records


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_method_runs_three_rounds(method, data, fleet_text):
    plan, records = run(method, data, fleet_text)
    assert [r.round for r in records] == [1, 2, 3]
    assert sum(sum(r.participating.values()) for r in records) > 0
    for r in records:
        assert r.accuracy is not None and 0 <= r.accuracy <= 1
        for device, peak in r.predicted_peak_bytes.items():
            group = plan.groups[r.sampled[device]]
            assert peak <= group.memory_budget_bytes


@pytest.mark.parametrize("method", ["fedavg", "slt", "fedolf"])
def test_accuracy_rises_over_ten_rounds(method, data, fleet_text):
    _, records = run(method, data, fleet_text, rounds=10, per_round=5)
    first, last = records[0].accuracy, max(r.accuracy for r in records[-3:])
    assert last > first + 0.1, [round(r.accuracy, 3) for r in records]


def test_group_that_fits_nothing_is_excluded_and_the_run_goes_on(data, fleet_text):
    fleet = fleet_text + "    brick: {count: 3, memory_budget: 5MiB, runtime: ort}\n"
    plan, records = run("fedolf", data, fleet_text=fleet, rounds=3, per_round=13)
    assert plan.groups["brick"].excluded
    for r in records:
        assert "brick" not in r.participating
        assert {d for d, g in r.sampled.items() if g == "brick"} <= set(r.skipped)
        assert sum(r.participating.values()) == 10


def test_cli_writes_a_run_folder(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "runs" / "slt"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "slt", "--rounds", "2", "--clients-per-round", "3",
                        "--train-limit", "600", "--test-limit", "300", "-o", str(out)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    history = json.loads((out / "history.json").read_text())
    assert [x["round"] for x in history["rounds"]] == [1, 2]
    for x in history["rounds"]:
        assert {"accuracy", "loss", "participating_devices", "predicted_peak_bytes", "upload_bytes",
                "download_bytes", "flops", "wall_s"} <= set(x)
    assert json.loads((out / "plan.json").read_text())["method"] == "slt"
    state = torch.load(out / "weights.pt")
    assert "layers.0.0.weight" in state or any(k.startswith("layers.0") for k in state)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_absent_is_a_clear_error(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "fedavg", "--rounds", "1", "--device", "cuda",
                        "-o", str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 2 and "--device cuda" in r.stderr and "Traceback" not in r.stderr


EXAMPLES_FLEET = ("fleet:\n  groups:\n"
                  "    small: {count: 3, memory_budget: 2GiB, runtime: torch, examples: 200}\n"
                  "    big: {count: 2, memory_budget: 2GiB, runtime: torch, examples: 90}\n")


def test_examples_means_what_each_device_trains_on(tmp_path):
    """`examples:` gives each device exactly that many examples, and the history's FLOPs per device are the
    planner's per-round FLOPs for it (edgefl.planning.plan.round_flops)."""
    from edgefl.planning.plan import Plan, round_flops

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(EXAMPLES_FLEET)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "fedavg", "--rounds", "2", "--clients-per-round",
                        "5", "--train-limit", "3000", "--test-limit", "200", "-o", str(out)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    plan = Plan.read(out / "plan.json")
    history = json.loads((out / "history.json").read_text())
    for record in history["rounds"]:
        assert len(record["flops_per_device"]) == 5
        for device, flops in record["flops_per_device"].items():
            group = plan.groups[record["sampled"][device]]
            step = group.steps[0]
            assert flops == pytest.approx(round_flops(step.predicted, group, step.config), rel=1e-12)
        assert record["flops"] == pytest.approx(sum(record["flops_per_device"].values()))


def test_a_data_set_too_small_for_examples_is_a_clear_error(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(EXAMPLES_FLEET)
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "fedavg", "--rounds", "1", "--train-limit", "500",
                        "-o", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.endswith("fleet.groups.*.examples: the groups ask for 780 examples (small 3 x 200, big 2 x 90) and "
                         "fashion-mnist has 500; lower some group's examples, or drop --train-limit"), line


def test_fleet_up_shares_hold_the_groups_examples(tmp_path):
    import numpy as np

    from edgefl.engines.agents import export_shares
    from edgefl.fleet import parse_fleet

    shares = export_shares(parse_fleet(EXAMPLES_FLEET), "fashion-mnist", "iid", 0, tmp_path, train_limit=3000)
    sizes = {d: len(np.load(folder / "y.npy")) for d, folder in shares.items()}
    assert sizes == {"small-0": 200, "small-1": 200, "small-2": 200, "big-0": 90, "big-1": 90}


def emulate_cli(fleet, out, *extra, rounds=2):
    return [sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn", "--dataset",
            "fashion-mnist", "--method", "fedavg", "--rounds", str(rounds), "--clients-per-round", "3",
            "--train-limit", "300", "--test-limit", "200", "-o", str(out), *extra]


def test_piped_emulate_prints_a_line_per_round_as_it_ends(tmp_path, fleet_text):
    """Piped (not a terminal), each round prints one timestamped line when it ends, with the values its
    history records, instead of a progress bar drawn only at the end."""
    import re
    from datetime import datetime

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    proc = subprocess.Popen(emulate_cli(fleet, out, "--eval-every", "2", rounds=3), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if " round 1/3:" in line:
                assert proc.poll() is None, "the first round's line came only when the run had ended"
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    history = json.loads((out / "history.json").read_text())["rounds"]
    pattern = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) round (\d+)/3: (.*), ([\d.]+) s$")
    printed = [m for m in map(pattern.match, lines) if m]
    assert [int(m[2]) for m in printed] == [1, 2, 3], lines
    for m, record in zip(printed, history, strict=True):
        datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S")
        trained = sum(record["participating_devices"].values())
        assert f"trained {trained}/{len(record['sampled'])} devices" in m[3]
        if record["accuracy"] is None:       # --eval-every 2: round 1 is not evaluated
            assert "accuracy" not in m[3] and "loss" not in m[3]
        else:
            assert f"accuracy {record['accuracy']:.4f}, loss {record['loss']:.4f}" in m[3]
        assert float(m[4]) == pytest.approx(record["wall_s"], abs=0.051)
    assert [r["accuracy"] is None for r in history] == [True, False, False]
    assert not any("━" in line for line in lines)   # no progress bar in a log


def test_an_existing_run_folder_is_refused_and_force_replaces_it(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    out.mkdir()
    (out / "history.json").write_text('{"rounds": []}\n')   # an earlier run
    (out / "notes.txt").write_text("from the earlier run\n")
    r = subprocess.run(emulate_cli(fleet, out), capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and str(out) in line and "choose another -o" in line and "--force" in line, line
    assert (out / "history.json").read_text() == '{"rounds": []}\n' and (out / "notes.txt").exists()

    r = subprocess.run(emulate_cli(fleet, out, "--force", rounds=1), capture_output=True, text=True, timeout=300,
                       env=os.environ)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "config.json", "history.json", "plan.json", "weights.pt"]
    assert [x["round"] for x in json.loads((out / "history.json").read_text())["rounds"]] == [1]


def test_force_never_empties_a_folder_that_is_not_a_run(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('mine')\n")
    r = subprocess.run(emulate_cli(fleet, tmp_path / "src", "--force"), capture_output=True, text=True, timeout=300,
                       env=os.environ)
    assert r.returncode == 2 and "not an edgefl run" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "src" / "main.py").read_text() == "print('mine')\n"


@pytest.mark.parametrize("model, dataset, says", [
    ("transformer", "fashion-mnist", "--dataset fashion-mnist: it holds images and the transformer reads text; use "
                                     "--dataset shakespeare with the transformer, or an image model (resnet20, "),
    ("cnn", "shakespeare", "--dataset shakespeare: it holds text and cnn reads images; use --model transformer with "
                           "it, or an image data set with cnn"),
])
def test_a_model_that_cannot_read_the_data_is_one_line_and_leaves_no_run_folder(tmp_path, fleet_text, model, dataset,
                                                                                 says):
    """Before (issue 40): the transformer planned on Fashion-MNIST, died in round 1 with a 60-line traceback and
    left a run folder that status and report refused."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", model,
                        "--dataset", dataset, "--method", "fedavg", "--rounds", "1", "--train-limit", "300",
                        "-o", str(out)], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().startswith(f"edgefl: error: {says}"), r.stderr
    assert not out.exists()


def test_status_and_report_of_a_run_that_finished_no_round_say_so(tmp_path, fleet_text):
    """A run folder with its plan but no finished round (stopped in round 1): status says so, report names why
    it has nothing to draw."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    r = subprocess.run(emulate_cli(fleet, out, rounds=1), capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    (out / "history.json").unlink()          # as it stood while round 1 ran
    (out / "weights.pt").unlink()
    r = subprocess.run([sys.executable, "-m", "edgefl", "status", str(out)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert r.returncode == 0 and r.stdout.startswith(f"{out}: no round finished yet (its plan was written at "), r
    r = subprocess.run([sys.executable, "-m", "edgefl", "report", str(out), "-o", str(tmp_path / "report")],
                       capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"edgefl: error: {out}: no round finished (it holds the plan but no history.json): the run stopped before its "
        "first round ended, or is in it; report it once a round has finished"), r.stderr
