"""A plan is a promise: a group whose budget is within 2% of the predicted peak of the config the planner
gives it trains that config, as an operator runs it (`edgefl plan` -> `edgefl export` -> `edgefl data
export` -> `edgefl-device train` in a fresh process, default evaluation included), under that budget."""
import json
import os
import subprocess
import sys

import pytest

from edgefl.data.mnist import FASHION_MNIST_ROOT

pytestmark = pytest.mark.skipif(
    not (FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").is_file() and not os.environ.get("EDGEFL_REQUIRE_DATA"),
    reason="Fashion-MNIST absent: apt-get install -y dataset-fashion-mnist (EDGEFL_REQUIRE_DATA=1 makes this fail)")
FROZEN = 1          # the config the tight group is meant to get: the CNN's first layer frozen
SLACK = 0.01        # the budget sits 1% above that config's predicted peak


def run(*args, module="edgefl"):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=os.environ)


def predicted_peaks(runtime: str) -> dict[int, int]:
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext
    from edgefl.zoo import ModelRef
    ctx = PlanContext(parse_fleet("fleet: {groups: {g: {count: 1, memory_budget: 4GiB}}}"),
                      ModelRef.of("cnn"), batch_size=32)
    return {k: ctx.cost(ctx.config(frozen_prefix=k), runtime).peak_memory_bytes for k in (0, FROZEN)}


@pytest.mark.parametrize("runtime", ["ort", "executorch"])
def test_a_tight_group_trains_within_its_budget(runtime, native_trainer, tmp_path):
    peaks = predicted_peaks(runtime)
    budget = int(peaks[FROZEN] * (1 + SLACK))
    assert peaks[0] > budget                      # freezing nothing does not fit: the planner must freeze
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"fleet:\n  groups:\n    tight: {{count: 2, memory_budget: {budget}, runtime: {runtime}}}\n")
    r = run("plan", "--devices", fleet, "--model", "cnn", "--method", "fedolf", "--rounds", "3", "-o",
            tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    step = json.loads((tmp_path / "plan.json").read_text())["groups"]["tight"]["steps"][0]
    predicted = step["predicted"]["peak_memory_bytes"]
    assert step["config"]["frozen_prefix"] == FROZEN and budget / 1.02 <= predicted <= budget

    r = run("export", "--plan", tmp_path / "plan.json", "--backend", runtime, "-o", tmp_path / "artifacts")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "artifacts" / "index.json").read_text())
    folder = tmp_path / "artifacts" / next(s["folder"] for s in index["sets"] if "tight" in s["groups"])
    r = run("data", "export", "--dataset", "fashion-mnist", "--partition", "iid", "--clients", 100, "--client", 3,
            "-o", tmp_path / "share")
    assert r.returncode == 0, r.stderr

    r = run("train", "--artifacts", folder, "--data", tmp_path / "share", "--format", "json",
            module="edgefl.device_runtime.cli")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["loss_before"] is not None                      # the default evaluation ran
    assert report["peak_rss_bytes"] <= predicted <= budget, (report["peak_rss_bytes"], predicted, budget)
