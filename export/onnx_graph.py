"""ONNX graph edits that make a torch-exported suffix trainable by ONNX Runtime 1.19 (RUNTIME_NOTES).

* The export trace runs the suffix once in train mode, so the initializers of BN running statistics
  hold the statistics *after* a dummy batch: `restore_initializers` writes the real ones back.
* BN in training mode outputs its updated running statistics under generated names:
  `name_batch_norm_outputs` renames them '<running stat>.updated' so they can be graph outputs the
  trainer copies back (ORT never writes them into the checkpoint state itself).
* LayerNormalization's gradient needs the node's mean and inverse-std outputs: `expose_layer_norm_stats`.
* The eval model generate_artifacts derives keeps BN's extra outputs with training_mode 0, which ORT
  refuses to load: `eval_without_statistics` drops them.
* ORT's AdamW defaults to the HuggingFace variant (adam_mode 1): `torch_adamw` switches the optimizer
  graph to torch.optim.AdamW's rule (adam_mode 0) with the given hyperparameters.
* ORT's gradient builder names the gradient of a graph input once per node reading it ("Duplicate
  definition of name (features0_grad)": a DenseNet layer's input feeds its BN and its concatenation):
  `read_inputs_once` gives every reader but one its own Identity of the input.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

UPDATED = ".updated"


def restore_initializers(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(np.asarray(values[init.name]), init.name))


def name_batch_norm_outputs(model: onnx.ModelProto) -> list[dict]:
    """Rename each training-mode BN's running-statistic outputs; returns, per BN, its running mean and
    variance (graph inputs) and the names of their updated values."""
    out = []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) < 3:
            continue
        renamed = {node.output[1]: node.input[3] + UPDATED, node.output[2]: node.input[4] + UPDATED}
        for other in model.graph.node:
            for i, name in enumerate(other.input):
                if name in renamed:
                    other.input[i] = renamed[name]
        node.output[1], node.output[2] = renamed[node.output[1]], renamed[node.output[2]]
        momentum = next((a.f for a in node.attribute if a.name == "momentum"), 0.9)
        out.append({"mean": node.input[3], "var": node.input[4], "mean_out": node.output[1],
                    "var_out": node.output[2], "onnx_momentum": float(momentum)})
    return out


def expose_layer_norm_stats(model: onnx.ModelProto) -> None:
    for i, node in enumerate(model.graph.node):
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            base = node.name or f"LayerNormalization_{i}"
            node.output.extend([f"{base}.mean", f"{base}.inv_std"])


def read_inputs_once(model: onnx.ModelProto, names: list[str]) -> None:
    """Each graph input in `names` read by more than one node: every reader but the first reads it through
    an Identity of its own, so that no two gradient nodes write the input's gradient."""
    for name in names:
        readers = [n for n in model.graph.node if name in n.input]
        for k, node in enumerate(readers[1:], 1):
            copy = f"{name}.read{k}"
            for i, x in enumerate(node.input):
                if x == name:
                    node.input[i] = copy
            model.graph.node.insert(0, onnx.helper.make_node("Identity", [name], [copy], name=f"{name}/read{k}"))


def eval_without_statistics(path: Path, statistic_outputs: set[str]) -> None:
    model = onnx.load(path)
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            del node.output[1:]
    keep = [o for o in model.graph.output if o.name not in statistic_outputs]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    onnx.save(model, path)


def torch_adamw(path: Path, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    model = onnx.load(path)
    nodes = [n for n in model.graph.node if n.op_type == "AdamWOptimizer"]
    if len(nodes) != 1:
        raise RuntimeError(f"{path.name}: expected one AdamWOptimizer node, found {len(nodes)}")
    values = {"alpha": betas[0], "beta": betas[1], "epsilon": eps, "weight_decay": weight_decay,
              "correct_bias": 1, "adam_mode": 0}
    del nodes[0].attribute[:]
    nodes[0].attribute.extend(onnx.helper.make_attribute(k, v) for k, v in values.items())
    onnx.save(model, path)


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer}
