"""`edgefl serve` driving real device processes over a real mosquitto (issue: real devices over MQTT)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from served_run import ServedRun, edgefl, write_plan

from edgefl.fleet import parse_fleet
from edgefl.planning.strategies import PlanContext
from edgefl.zoo import ModelRef

pytestmark = pytest.mark.usefixtures("one_thread", "native_trainer")   # the phone trains natively
CNN = ModelRef.of("cnn")


def one_frozen_layer_budget(runtime: str) -> int:
    """A memory budget under which FedOLF freezes exactly the CNN's first layer on `runtime` with the Python
    agent beside it (fleet up runs it): between the predicted peaks of training layers 1.. and training
    everything."""
    fleet = parse_fleet(f"fleet: {{groups: {{g: {{count: 1, memory_budget: 4GiB, runtime: {runtime}, agent: python}}}}}}")
    ctx = PlanContext(fleet, CNN, batch_size=32)
    one, none = (ctx.cost(ctx.config(frozen_prefix=k), fleet.groups[0]).peak_memory_bytes for k in (1, 0))
    assert one < none
    return one + min(2**20, (none - one) // 2)


def mixed_fleet() -> str:
    groups = {"pi": ("ort", 2), "phone": ("executorch", 1), "laptop": ("torch", 1)}
    lines = [f"    {name}: {{count: {n}, runtime: {rt}, agent: python, memory_budget: {one_frozen_layer_budget(rt)}}}"
             for name, (rt, n) in groups.items()]
    return "fleet:\n  name: mixed\n  groups:\n" + "\n".join(lines) + "\n"


def initial_accuracy(test_limit: int, seed: int) -> float:
    """The global model before round 1, as serve builds it (same seed), on the same test subset."""
    from edgefl.data import load_dataset, subset
    from edgefl.engines.local import torch_trainer
    from edgefl.server.global_model import TorchServerModel

    test = subset(load_dataset("fashion-mnist", split="test"), test_limit, seed + 1)
    return TorchServerModel(CNN, test, torch_trainer(CNN), seed).evaluate()["accuracy"]


def test_four_devices_three_runtimes_two_rounds(tmp_path):
    fleet, plan = write_plan(tmp_path, mixed_fleet(), "fedolf", rounds=2)
    for g in json.loads(plan.read_text())["groups"].values():
        assert g["steps"][0]["config"]["frozen_prefix"] == 1, g   # every device keeps layer 0 frozen
    with ServedRun(tmp_path, fleet, plan) as run:
        history = run.serve(tmp_path / "state", 2, "--dataset", "fashion-mnist", "--test-limit", "500",
                            "--round-timeout", "300")
    rounds = history["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    budgets = {g.name: g.memory_budget_bytes for g in parse_fleet(fleet.read_text()).groups}
    for r in rounds:
        assert r["aggregated"] and sum(r["participating_devices"].values()) == 4, (r["failed"], r["missing"])
        for device, metrics in r["device_metrics"].items():
            # the plan's promise, per report and runtime: what the device measured (its training process's peak
            # RSS and its agent's) is within what the plan predicted, which is within its group's budget
            measured, predicted = r["measured_peak_bytes"][device], r["predicted_peak_bytes"][device]
            assert 0 < measured <= predicted <= budgets[r["sampled"][device]], (device, metrics["runtime"], measured,
                                                                                predicted)
            energy = metrics["energy"]
            assert energy["source"] in ("rapl", "ina219", "battery", "profile") and energy["joules"] > 0
            assert energy["estimated"] == (energy["source"] == "profile")
            assert metrics["runtime"] == {"pi": "ort", "phone": "executorch", "laptop": "torch"}[r["sampled"][device]]
            # ORT and ExecuTorch devices train without torch: ExecuTorch through the native trainer
            assert metrics["torch_loaded"] == (metrics["runtime"] == "torch")
            assert metrics["trainer"] == ("native" if metrics["runtime"] == "executorch" else "python")
    assert rounds[-1]["accuracy"] > initial_accuracy(500, 0)

    # upload: exactly the trained tensors as one float32 buffer, plus the protocol's framing
    trained_bytes = _trained_tensor_bytes(tmp_path / "state" / "artifacts")
    for r in rounds:
        assert r["upload_bytes"] == 4 * trained_bytes
        for device, metrics in r["device_metrics"].items():
            up = metrics["transport"]["upload"]     # tensor buffer + the report's JSON, then MQTT framing
            assert trained_bytes < up["payload_bytes"] <= trained_bytes + 64 * 1024
            assert up["payload_bytes"] < up["wire_bytes"] <= up["payload_bytes"] + 64 * up["messages"]

    # the frozen prefix travels once per device: later rounds download less than round 1 by at least its size
    prefix_bytes = _prefix_bytes(tmp_path / "state" / "artifacts")
    for device in rounds[0]["device_metrics"]:
        first = rounds[0]["device_metrics"][device]["transport"]["download"]["payload_bytes"]
        for r in rounds[1:]:
            later = r["device_metrics"][device]["transport"]["download"]["payload_bytes"]
            assert later + prefix_bytes[rounds[0]["sampled"][device]] <= first, (device, first, later)


def _trained_tensor_bytes(artifacts: Path) -> int:
    sizes = set()
    for manifest in artifacts.glob("*/v*/manifest.json"):     # <set>/v<weights version>/
        m = json.loads(manifest.read_text())
        sizes.add(sum(4 * int(np.prod(t["shape"])) for t in m["trainable"]))
    assert len(sizes) == 1, sizes       # every group trains layers 1..3 of the same CNN
    return sizes.pop()


def _prefix_bytes(artifacts: Path) -> dict[str, int]:
    runtime_of_group = {"pi": "ort", "phone": "executorch", "laptop": "torch"}
    out = {}
    for group, runtime in runtime_of_group.items():
        folder = next(artifacts.glob(f"*-{runtime}-*/v*"))
        m = json.loads((folder / "prefix" / "manifest.json").read_text())
        out[group] = sum(f["bytes"] for f in m["files"])
    return out


def test_emulation_and_mqtt_reach_the_same_weights(tmp_path):
    fleet_text = "fleet:\n  name: pair\n  groups:\n    pc: {count: 2, runtime: torch, memory_budget: 2GiB}\n"
    fleet, plan = write_plan(tmp_path, fleet_text, "fedavg", rounds=2)
    with ServedRun(tmp_path, fleet, plan, train_limit=600) as run:
        run.serve(tmp_path / "served", 2, "--round-timeout", "300")
    r = __import__("subprocess").run(
        edgefl("emulate", "--devices", str(fleet), "--model", "cnn", "--dataset", "fashion-mnist", "--method",
               "fedavg", "--rounds", "2", "--clients-per-round", "2", "--train-limit", "600", "--test-limit", "100",
               "--seed", "0", "-o", str(tmp_path / "emulated")), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    served = torch.load(tmp_path / "served" / "weights.pt")
    emulated = torch.load(tmp_path / "emulated" / "weights.pt")
    assert served.keys() == emulated.keys()
    for key, value in emulated.items():
        if value.is_floating_point():
            err = (served[key] - value).norm() / max(value.norm(), 1e-12)
            assert err <= 1e-5, (key, float(err))
        else:
            assert torch.equal(served[key], value), key


class ArtifactCounter:
    """A subscriber on fl/v1/# counting the artifact bytes (chunk manifests and chunks) the coordinator publishes,
    per round (bytes count towards the round of the next instruction: a round's artifacts go out before or
    beside its instructions), and where they went: a group's topics or a device's own."""

    def __init__(self, url: str):
        import paho.mqtt.client as mqtt

        from edgefl import topics

        self.bytes: dict[tuple[int, str], int] = {}
        self._pending = {"group": 0, "device": 0}
        host, port = url.removeprefix("mqtt://").split(":")
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="counter", protocol=mqtt.MQTTv5)

        def count(client, userdata, msg):
            t = topics.parse(msg.topic)
            if t is not None and t.kind in ("manifest", "chunk"):
                self._pending["group" if t.group is not None else "device"] += len(msg.payload)
            elif t is not None and t.kind == "instr":
                r = json.loads(msg.payload)["instruction"]["round"]
                for where, n in self._pending.items():
                    self.bytes[(r, where)] = self.bytes.get((r, where), 0) + n
                self._pending = {"group": 0, "device": 0}
        self.c.on_message = count
        self.c.connect(host, int(port))
        self.c.subscribe("fl/v1/#", qos=1)
        self.c.loop_start()

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def test_two_groups_get_their_sets_once_per_group(tmp_path):
    """2 groups x 2 devices, 2 rounds: each round the coordinator publishes each group's set once, on the
    group's topics (what changed: round 2 only the new weights and the manifest naming them), and no artifact
    byte goes to a device's own topics."""
    fleet_text = ("fleet:\n  name: pairs\n  groups:\n    east: {count: 2, runtime: ort, memory_budget: 2GiB}\n"
                  "    west: {count: 2, runtime: ort, memory_budget: 2GiB}\n")
    fleet, plan = write_plan(tmp_path, fleet_text, "fedavg", rounds=2)
    with ServedRun(tmp_path, fleet, plan, train_limit=300) as run:
        counter = ArtifactCounter(run.broker.url)
        try:
            history = run.serve(tmp_path / "state", 2, "--round-timeout", "300")
        finally:
            counter.close()
    rounds = history["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["aggregated"] and r["participating_devices"] == {"east": 2, "west": 2}, (r["failed"], r["missing"])
    [set_folder] = (tmp_path / "state" / "artifacts").glob("*-ort-*")     # one config: both groups train it
    folder = max(set_folder.glob("v*"), key=lambda p: int(p.name[1:]))     # the last weights version
    files = {p.relative_to(folder): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    whole = sum(files.values())
    manifest = json.loads((folder / "manifest.json").read_text())
    changed = files[Path("manifest.json")] + sum(files[Path(f["name"])] for f in manifest["files"]
                                                 if f["role"] == "checkpoint")     # ORT's weights
    overhead = 2 * 1024 * len(files)               # each group's chunk manifests beside the files
    assert counter.bytes.get((1, "device"), 0) == counter.bytes.get((2, "device"), 0) == 0
    assert 2 * whole <= counter.bytes[(1, "group")] <= 2 * whole + overhead < 4 * whole, (counter.bytes, files)
    assert 2 * changed <= counter.bytes[(2, "group")] <= 2 * changed + overhead, (counter.bytes, files)
