"""Run by tests/integration/test_flower.py under the Flower environment: one train message for a fleet device,
answered by edgefl's ClientApp logic (edgefl.flower.client.train) three ways: from the device's share of the data
set (a simulated node), from a folder holding that same share (a deployed node's `data`), and from a folder
holding another device's share. Prints what each reply trained on and its tensors' digest, and the one-line
errors of a node whose data does not fit the model."""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from edgefl.data.shares import save_share
from edgefl.errors import ConfigError
from edgefl.flower.client import NodeData, _devices, _shares, train
from edgefl.flower.records import arrays_of, train_content
from edgefl.messages import RoundInstruction
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

folder = Path(sys.argv[1])
(folder / "fleet.yaml").write_text("fleet:\n  groups:\n    phone: {count: 2, memory_budget: 1GiB, runtime: torch}\n")
data = NodeData(str(folder / "fleet.yaml"), "fashion-mnist", train_limit=200)
ref = ModelRef.of("cnn")
train_set, devices, share_of = _shares(data)
assert devices == list(_devices(data.devices))
mine, other = devices
save_share(folder / "mine", train_set.x[share_of[mine]], train_set.y[share_of[mine]])
save_share(folder / "other", train_set.x[share_of[other]], train_set.y[share_of[other]])
instruction = RoundInstruction(round=1, device_id=mine, config=TrainConfig(num_layers=4, batch_size=16),
                               weights_version=0, seed=0, lr=0.05)
content = train_content(instruction, build(ref).state_dict(), {"group": "phone", "memory-bytes": 2**30,
                                                               "model": json.dumps(ref.to_json()),
                                                               "torch-device": "cpu", "torch-threads": 1})


def answer(node_config: dict) -> dict:
    reply = train(data, node_config, content)
    tensors = arrays_of(reply["arrays"])
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(tensors[k]).tobytes() for k in sorted(tensors)))
    return {"examples": int(reply["metrics"]["examples"]), "sha256": digest.hexdigest()}


out = {"share": answer({"device-id": mine}), "own": answer({"device-id": mine, "data": str(folder / "mine")}),
       "other": answer({"device-id": mine, "data": str(folder / "other")}), "share_examples": len(share_of[mine])}
(folder / "bad").mkdir()
np.save(folder / "bad" / "x.npy", np.zeros((4, 3, 28, 28), np.float32))
np.save(folder / "bad" / "y.npy", np.zeros(4, np.int64))
(folder / "labels").mkdir()
np.save(folder / "labels" / "x.npy", np.zeros((4, 1, 28, 28), np.float32))
np.save(folder / "labels" / "y.npy", np.array([0, 1, 2, 10]))
errors = {}
for name in ("bad", "labels", "missing"):
    try:
        train(data, {"device-id": mine, "data": str(folder / name)}, content)
    except ConfigError as exc:
        errors[name] = str(exc)
out["errors"] = errors
print(json.dumps(out))
