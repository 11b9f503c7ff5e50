"""`edgefl flower` (edgefl inside Flower's simulation runtime) gives what `edgefl emulate` gives, and each node's
message carries only its slice and its group's config.

Flower 1.42 lives in its own environment (pyproject's `flower` extra: flwr pins typer<0.21, the broker's amqtt
typer>=0.24): $EDGEFL_FLOWER_VENV, default .venv-flower, made by
`python3 -m venv .venv-flower && .venv-flower/bin/pip install -e '.[flower,report]'` (CI makes it). Both
commands run as subprocesses, each from its own environment, the same torch in both.
"""
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from tests.emulation_inputs import small_budget

ROOT = Path(__file__).resolve().parents[2]
FLOWER_VENV = Path(os.environ.get("EDGEFL_FLOWER_VENV", ROOT / ".venv-flower"))
FLOWER_PYTHON = FLOWER_VENV / "bin" / "python"
SETUP = "python3 -m venv .venv-flower && .venv-flower/bin/pip install -e '.[flower,report]'"
RUN_S = 600
# 20 devices: a small group whose budget holds only part of the CNN (SLT freezes a prefix, HeteroFL narrows it)
FLEET = """
fleet:
  groups:
    small: {{count: 12, memory_budget: {small}, runtime: ort}}
    big: {{count: 8, memory_budget: 1GiB, runtime: torch}}
"""
ARGS = ("--model", "cnn", "--dataset", "fashion-mnist", "--rounds", "3", "--clients-per-round", "6",
        "--train-limit", "600", "--test-limit", "200", "--seed", "3")

# CI makes the environment (EDGEFL_REQUIRE_DATA set): there a missing one fails instead of skipping
needs_flower = pytest.mark.skipif(not FLOWER_PYTHON.exists() and not os.environ.get("EDGEFL_REQUIRE_DATA"),
                                  reason=f"no Flower environment; {SETUP}")


def edgefl(python: Path, command: str, out: Path, *args: str, threads: int = 1) -> str:
    # `edgefl emulate` at one intra-op thread: the count Flower nodes train with, whatever the server's
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RAY_DISABLE_USAGE_STATS": "1"}
    r = subprocess.run([str(python), "-m", "edgefl", command, *args, "-o", str(out)], capture_output=True,
                       text=True, timeout=RUN_S, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def history(run: Path) -> list[dict]:
    """history.json's rounds without the wall-clock times, the one thing two runs may not share."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in json.loads((run / "history.json").read_text())["rounds"]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_text(FLEET.format(small=small_budget()))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fleet):
    """(emulated, in Flower) run folders of `method`, each made once for the module."""
    made = {}

    def of(method: str, *extra: str) -> tuple[Path, Path]:
        if method not in made:
            folder = tmp_path_factory.mktemp(method)
            args = ("--devices", str(fleet), "--method", method, *ARGS, *extra)
            edgefl(Path(sys.executable), "emulate", folder / "emulated", *args)
            said = edgefl(FLOWER_PYTHON, "flower", folder / "flower", *args, threads=2)
            assert "Flower simulation: 20 supernodes, one per device" in said
            made[method] = folder / "emulated", folder / "flower"
        return made[method]
    return of


@needs_flower
# heterofl (narrowed slices, measured memory) runs by default and shares its runs with the slice test; the other
# two methods, the README section and `flwr run` (each a Ray start, minutes on 2 cores) run with -m slow
@pytest.mark.parametrize("method, extra", [pytest.param("fedavg", (), marks=pytest.mark.slow),
                                           pytest.param("slt", (), marks=pytest.mark.slow),
                                           ("heterofl", ("--measure-memory",))])
def test_flower_gives_the_histories_and_weights_of_emulate(runs, method, extra):
    emulated, flower = runs(method, *extra)
    a, b = history(emulated), history(flower)
    assert len(a) == len(b) == 3
    assert sum(sum(r["participating_devices"].values()) for r in b) >= 6
    if method == "fedavg":   # the whole CNN breaks the small group's budget: its sampled devices are refused
        refused = {d: why for r in b for d, why in r["skipped"].items()}
        assert refused and all(d.startswith("small") for d in refused) and "small" not in b[-1]["participating_devices"]
    for x, y in zip(a, b):
        assert abs(x["accuracy"] - y["accuracy"]) <= 1e-6 and x["accuracy"] is not None
    assert a == b      # and everything else the round recorded: sampled, skipped, bytes, losses, measured activations
    if extra:
        assert all(r["measured_activation_bytes"] for r in b)     # each node measured what autograd kept
    wa, wb = torch.load(emulated / "weights.pt"), torch.load(flower / "weights.pt")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])]
    config = json.loads((flower / "config.json").read_text())
    assert config["engine"] == "flower" and config["method"] == method


@needs_flower
def test_a_node_is_sent_only_its_slice_and_its_groups_config(runs):
    emulated, flower = runs("heterofl", "--measure-memory")
    plan = json.loads((flower / "plan.json").read_text())
    full = torch.load(flower / "weights.pt")
    full_bytes = sum(t.numel() * t.element_size() for t in full.values())
    messages = json.loads((flower / "flower_messages.json").read_text())["messages"]
    rounds = history(emulated)
    assert len(messages) == sum(len(r["sampled"]) - len(r["skipped"]) for r in rounds)
    widths = {}
    for m in messages:
        record = rounds[m["round"] - 1]
        group = record["sampled"][m["device"]]
        assert m["config"]["group"] == group
        assert m["config"]["torch-threads"] == 1        # the CPU Flower reserves a client, not the server's 2
        assert m["config"]["memory-bytes"] == plan["groups"][group]["budget"]["memory_bytes"]
        (step,) = [s for s in plan["groups"][group]["steps"] if m["round"] in range(s["rounds"][0], s["rounds"][1] + 1)]
        assert {k: m["config"][f"train.{k}"] for k in ("head_width", "frozen_prefix", "num_layers")} == \
            {k: step["config"][k] for k in ("head_width", "frozen_prefix", "num_layers")}
        # the slice: a tensor of the global model's names, no wider than the global one
        assert set(m["arrays"]) <= set(full)
        assert all(s <= g for k, shape in m["arrays"].items() for s, g in zip(shape, full[k].shape))
        assert m["record_bytes"] >= m["array_bytes"]
        widths.setdefault(group, set()).add((m["config"]["train.head_width"], m["array_bytes"]))
    assert widths["big"] == {(1.0, full_bytes)}                  # the whole model to a device that holds it
    ((width, nbytes),) = widths["small"]
    assert width < 1.0 and nbytes < 0.8 * full_bytes               # a narrowed one (0.875: 77% of the bytes)
    # the bytes sent are the bytes the devices downloaded, as in the emulation
    for r in rounds:
        assert sum(m["array_bytes"] for m in messages if m["round"] == r["round"]) == r["download_bytes"]


@needs_flower
def test_a_deployed_node_trains_on_its_own_data(tmp_path):
    """A node config's `data` (a deployed supernode's own examples) trains as the simulation's share does when it
    holds the same examples, on other examples otherwise, and data that does not fit the model is one line."""
    r = subprocess.run([str(FLOWER_PYTHON), str(Path(__file__).with_name("flower_node_data.py")), str(tmp_path)],
                       capture_output=True, text=True, timeout=RUN_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])
    assert said["own"] == said["share"] and said["own"]["examples"] == said["share_examples"] > 0
    assert said["other"]["sha256"] != said["share"]["sha256"]
    errors = said["errors"]
    assert errors["bad"].startswith(f"node config data={str(tmp_path / 'bad')!r}: examples of shape (3, 28, 28), "
                                    "the model takes (1, 28, 28)"), errors
    assert errors["labels"].startswith(f"node config data={str(tmp_path / 'labels')!r}: ") and "10" in errors["labels"]
    assert errors["missing"].startswith(f"node config data={str(tmp_path / 'missing')!r}: ") and \
        "edgefl data export" in errors["missing"], errors


@pytest.mark.skipif(importlib.util.find_spec("flwr") is not None, reason="Flower is installed here")
def test_without_flower_edgefl_flower_says_how_to_install_it(tmp_path, fleet):
    r = subprocess.run([sys.executable, "-m", "edgefl", "flower", "--devices", str(fleet), "--method", "fedavg", *ARGS,
                        "-o", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == ("edgefl: error: flwr is not installed; install it with: "
                                                      "pip install 'edgefl[flower]'"), r.stderr
    assert not (tmp_path / "run").exists()       # refused before anything is written

def readme_block() -> str:
    """The bash block of the README's "Use edgefl from Flower" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use edgefl from Flower\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"^```bash\n(.*?)^```", section, re.M | re.S)[1]


@needs_flower
@pytest.mark.slow
def test_the_readme_section_runs_as_written(tmp_path):
    """Its commands, in a folder holding a copy of examples/, with the Flower environment's commands first on
    PATH: what its first two lines (make that environment, activate it) give."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    lines = readme_block().replace("\\\n", "").splitlines()
    assert lines[0].startswith("python3 -m venv .venv-flower") and lines[1] == "source .venv-flower/bin/activate"
    env = {**os.environ, "PATH": f"{FLOWER_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "RAY_DISABLE_USAGE_STATS": "1", "COLUMNS": "200"}
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines[2:])], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=RUN_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert (tmp_path / "report-flower" / "index.html").is_file()
    # what the section says of the run: the phones at 0.5625 width, sent under a third of the model's bytes
    run = tmp_path / "runs" / "flower-heterofl"
    full = sum(t.numel() * t.element_size() for t in torch.load(run / "weights.pt").values())
    messages = json.loads((run / "flower_messages.json").read_text())["messages"]
    phones = [m for m in messages if m["config"]["group"] == "phones"]
    assert phones and {m["config"]["train.head_width"] for m in phones} == {0.5625}
    assert all(m["array_bytes"] < full / 3 for m in phones)
    assert {m["array_bytes"] for m in messages if m["config"]["group"] == "pi5"} == {full}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_flower(home: Path) -> None:
    """Stop the local SuperLink (and its simulation) `flwr run` started detached for this FLWR_HOME, and no other."""
    for p in psutil.process_iter():
        try:
            if p.environ().get("FLWR_HOME") == str(home):
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


@needs_flower
@pytest.mark.slow
def test_the_example_app_runs_with_flwr_run_as_emulate_runs_it(tmp_path):
    """examples/flower under `flwr run` (Flower's local SuperLink in simulation mode, its own FLWR_HOME and
    ports) writes the run `edgefl emulate` writes for the same options."""
    app, home, out = tmp_path / "app", tmp_path / "flwr-home", tmp_path / "flower"
    shutil.copytree(ROOT / "examples" / "flower", app)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "PATH": f"{FLOWER_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    try:
        r = subprocess.run(["flwr", "run", str(app), "local", "--stream", "--federation-config", "num-supernodes=20",
                            "-c", f'output="{out}" num-server-rounds=2'], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=RUN_S)
    finally:
        stop_flower(home)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    edgefl(Path(sys.executable), "emulate", tmp_path / "emulated", "--devices", str(app / "fleet.yaml"), "--model",
           "cnn", "--dataset", "fashion-mnist", "--method", "heterofl", "--rounds", "2", "--clients-per-round", "6",
           "--train-limit", "600", "--test-limit", "200", "--seed", "0", "--measure-memory")
    assert history(out) == history(tmp_path / "emulated")
    wa, wb = torch.load(out / "weights.pt"), torch.load(tmp_path / "emulated" / "weights.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
