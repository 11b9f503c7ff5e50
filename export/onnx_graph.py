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
* ORT's SGD graph (SGDOptimizerV2) is plain w -= lr * g. torch.optim.SGD adds the weight decay to the
  gradient and keeps a momentum buffer: `l2_gradients` makes the training model accumulate g + wd * w,
  `torch_sgd` turns the AdamW optimizer graph into the momentum step, so that ORT's own
  `Optimizer.step()` applies torch's rule.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

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


def eval_without_statistics(path: Path, statistic_outputs: set[str]) -> None:
    model = onnx.load(path)
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            del node.output[1:]
    keep = [o for o in model.graph.output if o.name not in statistic_outputs]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    onnx.save(model, path)


def _adamw_node(model: onnx.ModelProto, path: Path) -> onnx.NodeProto:
    nodes = [n for n in model.graph.node if n.op_type == "AdamWOptimizer"]
    if len(nodes) != 1:
        raise RuntimeError(f"{path.name}: expected one AdamWOptimizer node, found {len(nodes)}")
    return nodes[0]


def _set_attributes(node: onnx.NodeProto, values: Mapping[str, float]) -> None:
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in values.items())


def torch_adamw(path: Path, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    model = onnx.load(path)
    _set_attributes(_adamw_node(model, path), {"alpha": betas[0], "beta": betas[1], "epsilon": eps,
                                               "weight_decay": weight_decay, "correct_bias": 1, "adam_mode": 0})
    onnx.save(model, path)


def l2_gradients(path: Path, params: list[str], weight_decay: float) -> None:
    """Make the training model at `path` accumulate g + weight_decay * w for each of `params` (the gradient
    of loss + weight_decay / 2 * |w|^2): torch.optim.SGD's weight decay, which enters the momentum."""
    if not weight_decay:
        return
    model = onnx.load(path)
    decay = "weight_decay.coefficient"
    model.graph.initializer.append(numpy_helper.from_array(np.array(weight_decay, np.float32), decay))
    buffers = {f"{p}_grad.accumulation.buffer": p for p in params}
    nodes, done = [], set()
    for node in model.graph.node:
        param = buffers.get(node.input[0]) if node.op_type == "InPlaceAccumulatorV2" else None
        if param is not None:
            nodes += [helper.make_node("Mul", [param, decay], [f"{param}_grad.decay"]),
                      helper.make_node("Add", [node.input[1], f"{param}_grad.decay"], [f"{param}_grad.l2"])]
            node.input[1] = f"{param}_grad.l2"
            done.add(param)
        nodes.append(node)
    if missing := sorted(set(params) - done):
        raise RuntimeError(f"{path.name}: no gradient accumulator for {missing[:4]}")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)


def torch_sgd(path: Path, momentum: float) -> None:
    """Turn the AdamW optimizer graph at `path` into torch.optim.SGD's momentum step (dampening 0, no
    Nesterov) on the gradients g' the training model accumulates (weight decay included, `l2_gradients`):
    b = g' on the first step, else momentum * b + g'; w -= lr * b.

    ORT's Optimizer accepts one optimizer node, AdamWOptimizer or SGDOptimizerV2, and only those kernels
    write the checkpoint's parameters and optimizer state in place; SGDOptimizerV2 keeps no state (it is
    handed a momentum sequence it never writes). So the momentum lives in AdamW's first moment m, with the
    kernel reduced to a momentum step. Its mode 1 (mode 0 demands bias correction) without bias correction
    computes m = a*m + (1-a)*g', v = b*v + (1-b)*g'^2, w -= lr * m / (sqrt(v) + eps), w -= lr * wd * w.
    With a = momentum, b = 1 (v stays at its initial zeros), eps = 1 - a (as the kernel rounds it) and
    wd = 0: m = (1 - a) * torch's buffer, and w -= lr * m / (1 - a) is torch's step. The price: ORT also
    holds v, one zero buffer per trained parameter."""
    if not 0 <= momentum < 1:
        raise ValueError(f"SGD momentum {momentum}: ORT's optimizer graph takes 0 <= momentum < 1")
    model = onnx.load(path)
    scale = float(np.float32(1) - np.float32(momentum))      # 1 - a in float32, as the kernel computes it
    _set_attributes(_adamw_node(model, path), {"alpha": float(momentum), "beta": 1.0, "epsilon": scale,
                                               "weight_decay": 0.0, "correct_bias": 0, "adam_mode": 1})
    onnx.save(model, path)


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer}
