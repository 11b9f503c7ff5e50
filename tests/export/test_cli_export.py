"""`edgefl export`, `edgefl data export` and `edgefl-device train` as an operator runs them, in real
subprocesses: plan -> artifacts -> one client's data -> training on the device with no coordinator."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from edgefl.data.mnist import FASHION_MNIST_ROOT

REQUIRE_DATA = bool(os.environ.get("EDGEFL_REQUIRE_DATA"))
needs_fashion_mnist = pytest.mark.skipif(
    not (FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").is_file() and not REQUIRE_DATA,
    reason="Fashion-MNIST absent: apt-get install -y dataset-fashion-mnist (EDGEFL_REQUIRE_DATA=1 makes this fail)")

FLEET = """
fleet:
  groups:
    tight: {{count: 3, memory_budget: {tight}, runtime: ort}}
    roomy: {{count: 2, memory_budget: 1GiB, runtime: ort}}
"""


def tight_budget() -> int:
    """Where FedOLF trains the CNN's last two layers and no more (from the cost model, so the fleet keeps
    its shape when the runtime's constants move)."""
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext
    from edgefl.zoo import ModelRef
    ctx = PlanContext(parse_fleet(FLEET.format(tight="1GiB")), ModelRef.of("cnn"), batch_size=32)
    two, three = (ctx.cost(ctx.config(frozen_prefix=k), "ort").peak_memory_bytes for k in (2, 1))
    return two + (three - two) // 2


def run(*args, module="edgefl"):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    (folder / "fleet.yaml").write_text(FLEET.format(tight=tight_budget()))
    r = run("plan", "--devices", folder / "fleet.yaml", "--model", "cnn", "--method", "fedolf", "--rounds", "5",
            "-o", folder / "plan.json")
    assert r.returncode == 0, r.stderr
    return folder / "plan.json"


@pytest.fixture(scope="module")
def artifacts(plan, tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    r = run("export", "--plan", plan, "--backend", "ort", "-o", out)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@needs_fashion_mnist
def test_plan_to_artifacts_to_device_training(plan, artifacts, tmp_path):
    out, table = artifacts
    index = json.loads((out / "index.json").read_text())
    configs = {g: s["config"] for s in index["sets"] for g in s["groups"]}
    groups = json.loads(plan.read_text())["groups"]
    assert {g: s["steps"][0]["config"] for g, s in groups.items()} == configs   # one set per distinct config
    assert configs["tight"]["frozen_prefix"] == 2 and configs["roomy"]["frozen_prefix"] == 0
    for s in index["sets"]:
        assert s["folder"] in table and (out / s["folder"] / "manifest.json").is_file()
        assert s["artifact_bytes"] == sum(f.stat().st_size for f in (out / s["folder"]).rglob("*")
                                          if f.is_file() and f.name != "manifest.json")
    tight = next(s for s in index["sets"] if "tight" in s["groups"])
    assert (out / tight["folder"] / "prefix" / "manifest.json").is_file()

    share = tmp_path / "client3"
    r = run("data", "export", "--dataset", "fashion-mnist", "--partition", "iid", "--clients", 200, "--client", 3,
            "-o", share)
    assert r.returncode == 0, r.stderr
    meta = json.loads((share / "share.json").read_text())
    x, y = np.load(share / "x.npy"), np.load(share / "y.npy")
    assert meta["examples"] == len(x) == len(y) == 300 and x.shape[1:] == (1, 28, 28)

    r = run("train", "--artifacts", out / tight["folder"], "--data", share, "--steps", 10, "--lr", 0.05,
            "--format", "json", module="edgefl.device_runtime.cli")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["config_hash"] == tight["config_hash"] and report["examples"] == 300
    assert report["trained_tensor_bytes"] == tight["upload_bytes"] and report["torch_loaded"] is False
    assert report["loss_after"] < report["loss_before"]


def test_export_refuses_bad_input_in_one_line(plan, tmp_path):
    one_line_error(run("export", "--plan", tmp_path / "none.json", "--backend", "ort", "-o", tmp_path / "o"),
                   "none.json")
    one_line_error(run("export", "--plan", plan, "--backend", "tflite", "-o", tmp_path / "o"), "unknown backend")
    np.savez(tmp_path / "w.npz", **{"layers.0.0.weight": np.zeros((3, 3), np.float32)})
    one_line_error(run("export", "--plan", plan, "--backend", "ort", "--weights", tmp_path / "w.npz", "-o",
                       tmp_path / "o"), "w.npz", "layers.0.0.weight")


@needs_fashion_mnist
def test_data_export_names_a_client_that_is_not_there(tmp_path):
    one_line_error(run("data", "export", "--dataset", "fashion-mnist", "--clients", 4, "--client", 4, "-o", tmp_path),
                   "--client 4", "0..3")
