"""`edgefl emulate --engine ray` on a two-node Ray cluster on this machine gives the bits `--engine local` gives.

The cluster (bench/ray_cluster.py): `ray start --head` and a second `ray start --address`, one CPU each,
own temp dir and ports, both children of this process, so that stopping their process trees stops exactly
this cluster (`ray stop --force` would stop every Ray on the machine, other runs' included).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgefl[ray]')")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from ray_cluster import ray_cluster  # noqa: E402

FLEET = "fleet:\n  groups:\n    phones: {count: 20, memory_budget: 1GiB, runtime: torch}\n"
RUN_S = 420      # bound on each emulate run (a node must join within ray_cluster's 180 s)


@pytest.fixture(scope="module")
def cluster():
    """(HOST:PORT, the environment a driver connects with) of a two-node Ray cluster (head + one worker node,
    one CPU each), stopped after the module."""
    with ray_cluster([1, 1]) as found:
        yield found


def emulate(folder: Path, fleet: str, method: str, per_round: int, *engine: str,
            env: dict = os.environ) -> tuple[Path, str]:
    (folder / "fleet.yaml").write_text(fleet)
    out = folder / engine[1]
    # one intra-op thread: both engines then train alike, and each one-CPU node holds one device actor
    env = {**env, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(folder / "fleet.yaml"),
                        "--model", "cnn", "--dataset", "fashion-mnist", "--method", method, "--rounds", "3",
                        "--clients-per-round", str(per_round), "--train-limit", "600", "--test-limit", "200",
                        "--seed", "3", "-o", str(out), *engine], capture_output=True, text=True, timeout=RUN_S, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out, r.stdout


def history(run: Path) -> list[dict]:
    """history.json's rounds without the wall-clock times, the one thing two runs may not share."""
    rounds = json.loads((run / "history.json").read_text())["rounds"]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rounds]


@pytest.mark.parametrize("method, per_round", [
    ("fedavg", 10),     # every device gets the same weights: one object per round, shared
    ("fd", 10),         # the two-group fleet: the small group trains random slices, other weights per device
])
def test_ray_engine_on_two_nodes_matches_the_local_engine(cluster, tmp_path, fleet_text, method, per_round):
    fleet = FLEET if method == "fedavg" else fleet_text
    local, _ = emulate(tmp_path, fleet, method, per_round, "--engine", "local")
    address, env = cluster
    on_ray, said = emulate(tmp_path, fleet, method, per_round, "--engine", "ray", "--address", address, env=env)

    assert "Ray: 2 device actors (CPU, 1 torch thread(s) each) on 2 node(s)" in said   # one on each node
    assert json.loads((on_ray / "config.json").read_text())["engine"] == "ray"
    assert [sum(r["participating_devices"].values()) for r in history(on_ray)] == [per_round] * 3
    assert history(on_ray) == history(local)
    a, b = torch.load(local / "weights.pt"), torch.load(on_ray / "weights.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
