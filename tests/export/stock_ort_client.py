"""A client for edgefl's ONNX Runtime artifact sets written from docs/artifact-format.md alone: ONNX Runtime
(inference sessions and the on-device training API), numpy, json and the standard library. It never imports
edgefl or torch (tests/export/test_stock_ort_client.py checks its imports), so what it needs to know is
what the artifacts and the document say, nothing more.

    client = StockOrtClient(set_folder)           # verifies every file, opens prefix, suffix, optimizer
    loss = client.step(x, labels, lr)             # one training step
    loss, logits = client.evaluate(x, labels)     # eval mode, no update
    buffer = client.upload()                      # flat float32 buffer in manifest `trainable` order
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime
from onnxruntime.training.api import CheckpointState, Module, Optimizer


def read_manifest(folder: Path) -> tuple[dict, str]:
    """An artifact's manifest and its id (the sha256 of manifest.json's bytes), every file it names checked."""
    raw = (folder / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    if manifest["schema"] != "edgefl.manifest/1":
        raise ValueError(f"{folder}: unknown manifest schema {manifest['schema']!r}")
    for f in manifest["files"]:
        data = (folder / f["name"]).read_bytes()
        if len(data) != f["bytes"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise ValueError(f"{folder / f['name']}: size or sha256 differs from the manifest")
    return manifest, hashlib.sha256(raw).hexdigest()


def _file(manifest: dict, role: str) -> str:
    return next(f["name"] for f in manifest["files"] if f["role"] == role)


class StockOrtClient:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.manifest, self.id = read_manifest(folder)
        m = self.manifest
        if m["kind"] != "suffix" or m["backend"] != "ort":
            raise ValueError(f"{folder}: a {m['kind']} artifact for {m['backend']}, not an ORT set")
        self.prefix = None
        if m["prefix_id"] is not None:
            prefix, prefix_id = read_manifest(folder / "prefix")
            if prefix_id != m["prefix_id"]:
                raise ValueError(f"{folder / 'prefix'}: not the prefix this suffix needs")
            self.prefix = onnxruntime.InferenceSession(str(folder / "prefix" / _file(prefix, "model")),
                                                       providers=["CPUExecutionProvider"])
        self.state = CheckpointState.load_checkpoint(str(folder / _file(m, "checkpoint")))
        self.module = Module(str(folder / _file(m, "training_model")), self.state,
                             str(folder / _file(m, "eval_model")))
        # AdamW sets carry ORT's optimizer graph; SGD sets leave torch's SGD rule to the client (the document's
        # section 6.1), applied to the gradients ORT leaves in the checkpoint state
        roles = {f["role"] for f in m["files"]}
        self.optimizer = (Optimizer(str(folder / _file(m, "optimizer_model")), self.module)
                          if "optimizer_model" in roles else None)
        self.params = [t["local"] for t in m["trainable"] if t["kind"] == "parameter"]
        self.buffers: dict[str, np.ndarray] = {}
        self.outputs = list(self.module.output_names())      # loss, logits, '<statistic>.updated'...
        self.counters = {t["local"]: int(self.state.properties[t["local"]])
                         for t in m["trainable"] if t["kind"] == "counter"}

    def features(self, x: np.ndarray) -> list[np.ndarray]:
        """The suffix's feature inputs: the prefix run on `prefix_batch` samples at a time, outputs joined."""
        if self.prefix is None:
            return [x]
        chunk = self.manifest["prefix_batch"] or len(x)
        name = self.prefix.get_inputs()[0].name
        parts = [self.prefix.run(None, {name: x[i:i + chunk]}) for i in range(0, len(x), chunk)]
        return [np.concatenate(outs) for outs in zip(*parts)]

    def step(self, x: np.ndarray, labels: np.ndarray, lr: float) -> float:
        features = self.features(x)
        batch_norm = self.manifest["extra"]["batch_norm"]
        before = {bn["var"]: self.state.parameters[bn["var"]].data.copy() for bn in batch_norm}
        self.module.train()
        outs = dict(zip(self.outputs, self.module(*features, labels.astype(np.int64))))
        for bn in batch_norm:     # ORT never writes running statistics back: copy them, variance unbiased
            momentum = np.float32(bn["onnx_momentum"])
            n = len(x) * bn["per_sample"]
            factor = np.float32(n / (n - 1) if n > 1 else 1.0)
            old = before[bn["var"]]
            self.state.parameters[bn["mean"]] = outs[bn["mean_out"]]
            self.state.parameters[bn["var"]] = momentum * old + (outs[bn["var_out"]] - momentum * old) * factor
        if self.optimizer is not None:
            self.optimizer.set_learning_rate(lr)
            self.optimizer.step()
        else:
            self.sgd(lr)
        self.module.lazy_reset_grad()
        for name in self.counters:
            self.counters[name] += 1
        return float(outs["loss"])

    def sgd(self, lr: float) -> None:
        """torch.optim.SGD: d = g + wd * w; b = d on the first step, else momentum * b + d; w -= lr * b."""
        spec = self.manifest["optimizer"]
        for name in self.params:
            p = self.state.parameters[name]
            w, d = p.data, p.grad + np.float32(spec["weight_decay"]) * p.data
            if spec["momentum"]:
                b = self.buffers.get(name)
                d = self.buffers[name] = d.copy() if b is None else np.float32(spec["momentum"]) * b + d
            self.state.parameters[name] = (w - np.float32(lr) * d).astype(np.float32)

    def evaluate(self, x: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
        self.module.eval()
        loss, logits = self.module(*self.features(x), labels.astype(np.int64))
        return float(loss), logits

    def upload(self) -> np.ndarray:
        parts = []
        for t in self.manifest["trainable"]:
            if t["kind"] == "counter":
                parts.append(np.array([self.counters[t["local"]]], np.float32))
            else:
                parts.append(self.state.parameters[t["local"]].data.astype(np.float32).ravel())
        return np.concatenate(parts)
