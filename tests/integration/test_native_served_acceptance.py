"""The memory promise per device, served on loopback as a Pi is served (issue 39's acceptance): a real mosquitto,
`edgefl fleet up` and `edgefl serve`, 2 rounds, the devices running the agent and the trainer of an unpacked
`edgefl device bundle --target linux-x86_64` (bin/edgefl-device, bin/edgefl-et-train).

One fleet per model, two ExecuTorch devices: `native` runs the bundled native agent, `python` the Python agent
(training with the bundled trainer too); `fleet up` starts each as its fleet entry says (`agent:`, no --agent).
Each group's budget sits 1% above the whole-device peak the cost model predicts for its agent at one frozen
prefix (CNN 1, ResNet-20 12, which keeps ResNet-20's rounds short), so FedOLF plans that prefix for both and
one exported set serves both. Checked per report: the whole device's measured peak (agent + training process,
as the report says) <= the plan's predicted peak <= the budget, and >= 0.85 x predicted (the prediction is
tight, not just safe); the native agent idles (VmRSS from outside, online, before the first round) in <= 8 MiB.

Both agents take their peak once the round's upload is out, so every report counts its own upload's copies (it
used to count the previous round's, and the Python agent seemed to grow over its first rounds, 0.73 of predicted
in its first). What each report measured is printed (-s) with its ratio.
"""
from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

import pytest
from export_cases import available
from served_run import FLEET, ServedRun, wait_for

pytestmark = [pytest.mark.skipif(not available("executorch"), reason="executorch is not installed"),
              pytest.mark.usefixtures("one_thread")]
MiB = 2**20
IDLE_RSS_LIMIT = 8 * MiB
TIGHT = 0.85                      # measured / predicted, whole device: the prediction is close, not just above
SLACK = 0.01                      # each budget 1% above its group's predicted peak at the chosen prefix
ROUNDS, EXAMPLES = 2, 64
FROZEN = {"cnn": 1, "resnet20": 12}
SHAPE = {"cnn": (), "resnet20": ("--input-shape", "1,28,28")}     # Fashion-MNIST's images (the CNN's default)
AGENT_OF = {"native": "native", "python": "python"}     # group name -> its fleet entry's agent


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> Path:
    """The unpacked linux-x86_64 bundle's edgefl-device/ folder."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("x86-bundle")
    tarball = folder / "edgefl-linux-x86_64.tar.gz"
    r = subprocess.run([str(Path(sys.executable).parent / "edgefl"), "device", "bundle", "--target", "linux-x86_64",
                        "-o", str(tarball)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    with tarfile.open(tarball) as tar:
        tar.extractall(folder, filter="data")
    root = folder / "edgefl-device"
    assert os.access(root / "bin" / "edgefl-device", os.X_OK) and os.access(root / "bin" / "edgefl-et-train", os.X_OK)
    return root


def budgets(model: str) -> dict[str, int]:
    """Group -> its memory budget: SLACK above the whole-device peak predicted for its agent at FROZEN[model]."""
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext
    from edgefl.zoo import ModelRef

    out = {}
    for group, agent in AGENT_OF.items():
        fleet = parse_fleet(f"fleet: {{groups: {{g: {{count: 1, memory_budget: 4GiB, runtime: executorch, "
                            f"agent: {agent}}}}}}}")
        shape = tuple(int(n) for n in SHAPE[model][1].split(",")) if SHAPE[model] else None
        ctx = PlanContext(fleet, ModelRef.of(model, input_shape=shape), batch_size=32)
        peaks = [ctx.cost(ctx.config(frozen_prefix=k), fleet.group("g")).peak_memory_bytes
                 for k in (FROZEN[model] - 1, FROZEN[model])]
        out[group] = int(peaks[1] * (1 + SLACK))
        assert peaks[0] > out[group], (model, agent, peaks)    # one layer less frozen does not fit: FedOLF freezes it
    return out


def vm(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def serve(model: str, root: Path, folder: Path) -> dict:
    from served_run import write_plan

    limits = budgets(model)
    groups = "".join(f"    {g}: {{count: 1, runtime: executorch, agent: {a}, memory_budget: {limits[g]}, "
                     f"examples: {EXAMPLES}}}\n" for g, a in AGENT_OF.items())
    fleet, plan = write_plan(folder, f"fleet:\n  name: {model}\n  groups:\n{groups}", "fedolf", ROUNDS, model,
                             *SHAPE[model])
    steps = {g: json.loads(plan.read_text())["groups"][g]["steps"] for g in AGENT_OF}
    for g, s in steps.items():
        assert {step["config"]["frozen_prefix"] for step in s} == {FROZEN[model]}, (g, s)
    env = {**os.environ, "EDGEFL_DEVICE_NATIVE": str(root / "bin" / "edgefl-device"),
           "EDGEFL_ET_TRAIN": str(root / "bin" / "edgefl-et-train")}
    with ServedRun(folder, fleet, plan, train_limit=2 * EXAMPLES, agent=FLEET, env=env) as run:
        wait_for(lambda: len(run.device_pids()) == 2, 120, f"two agents\n{run.logs()}")
        pids = {d.rsplit("-", 1)[0]: p for d, p in run.device_pids().items()}
        logs = folder / "fleet" / "logs"
        wait_for(lambda: all("online at" in (logs / f"{g}-0.log").read_text() for g in pids), 60, "the agents online")
        time.sleep(1.0)                               # online, nothing sent yet: idle
        idle = {g: vm(p, "VmRSS") for g, p in pids.items()}
        exe = {g: os.readlink(f"/proc/{p}/exe") for g, p in pids.items()}
        history = run.serve(folder / "state", ROUNDS, "--round-timeout", "600")
    return {"history": history, "idle": idle, "exe": exe, "budgets": limits}


# the CNN's run (~3 min on 2 idle cores) is in the default run; ResNet-20's (an export and 2 rounds of a deeper
# net: 6-11 min at load ~10) with -m slow
@pytest.fixture(scope="module", params=["cnn", pytest.param("resnet20", marks=pytest.mark.slow)])
def served(request, bundled, native_trainer, tmp_path_factory):
    t0 = time.monotonic()
    out = serve(request.param, bundled, tmp_path_factory.mktemp(f"served-{request.param}"))
    out["model"], out["wall_s"] = request.param, time.monotonic() - t0
    return out


def test_the_bundled_native_agent_runs_and_idles_in_8_mib(served, bundled):
    assert served["exe"]["native"] == str((bundled / "bin" / "edgefl-device").resolve()), served["exe"]
    assert "python" in Path(served["exe"]["python"]).name, served["exe"]
    print(f"{served['model']}: idle VmRSS native {served['idle']['native'] / MiB:.1f} MiB, python "
          f"{served['idle']['python'] / MiB:.1f} MiB ({served['wall_s']:.0f} s served)")
    assert 0 < served["idle"]["native"] <= IDLE_RSS_LIMIT, served["idle"]


def reports(served, group: str) -> list[tuple[dict, int, int]]:
    """Per round: the device's metrics, its measured whole-device peak and the plan's predicted one; printed."""
    device, out, seen = f"{group}-0", [], []
    rounds = served["history"]["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    for r in rounds:
        metrics = r["device_metrics"][device]
        measured, predicted = r["measured_peak_bytes"][device], r["predicted_peak_bytes"][device]
        out.append((metrics, measured, predicted))
        seen.append(f"round {r['round']}: agent {metrics['agent_peak_bytes'] / MiB:.1f} + child "
                    f"{metrics['child_peak_bytes'] / MiB:.1f} = {measured / MiB:.1f} MiB of predicted "
                    f"{predicted / MiB:.1f} ({measured / predicted:.3f}), budget {served['budgets'][group] / MiB:.1f}")
    print(f"\n{served['model']} {group}: " + "; ".join(seen))
    return out


@pytest.mark.parametrize("group", sorted(AGENT_OF))
def test_every_report_holds_the_whole_device_promise(served, group):
    for metrics, measured, predicted in reports(served, group):
        assert metrics.get("agent", "python") == AGENT_OF[group] and metrics["trainer"] == "native", metrics
        assert measured == metrics["child_peak_bytes"] + metrics["agent_peak_bytes"], metrics
        assert metrics["child_peak_bytes"] > 0 and metrics["agent_peak_bytes"] > 0, metrics
        assert measured <= predicted <= served["budgets"][group], (measured, predicted)


@pytest.mark.parametrize("group", sorted(AGENT_OF))
def test_every_report_is_within_15_percent_of_the_prediction(served, group):
    for _, measured, predicted in reports(served, group):
        assert measured >= TIGHT * predicted, (measured, predicted, measured / predicted)
