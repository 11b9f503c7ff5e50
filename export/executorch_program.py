"""ExecuTorch programs for a split model: the prefix for inference, the suffix as a training program.

The suffix becomes one `.pte` with two methods and one `.ptd` holding its weights:

* `forward` (training): `(*features, labels, *statistics) -> (loss, logits, *updated statistics,
  *gradients, *parameters)`: the joint forward/backward graph of the rewritten suffix
  (edgefl.export.et_rewrites), BN in train mode. Its parameters are *external mutable weights*: the
  runtime copies them from the `.ptd` into memory it owns, where the trainer reads and updates them
  (`Method.get_attribute`), so new global weights are a new `.ptd`, never a new program. BN running
  statistics are inputs and outputs, not mutable buffers (et_rewrites explains why).
* `evaluate`: `(*features, labels, *parameters, *statistics) -> (loss, logits)` in eval mode. It takes
  the parameters as inputs, so it always sees the training method's current values.

Parameters are named in the program and the `.ptd` by their suffix state_dict key under `PREFIX`.
Shapes are static, at the batch the artifact is exported for: a symbolic batch made exporting half again
as slow, and ExecuTorch plans memory for the largest batch anyway.

With `delegate`, matrix products, transposes, slicing, concatenation and element-wise arithmetic run in
XNNPACK, but never an op that reads a parameter directly: a delegate copies the program tensors it reads
into its own blob, where the optimizer could not reach them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from edgefl.export.et_rewrites import batch_norms, rewrite

PREFIX = "model."
STATISTICS = ("running_mean", "running_var")
# XNNPACK partitioner configs (executorch.backends.xnnpack.partition.config.generic_node_configs)
DELEGATED = ("BMMConfig", "PermuteConfig", "SliceCopyConfig", "CatConfig", "AddConfig", "SubConfig", "MulConfig",
             "ViewCopyConfig")


class _TrainingStep(nn.Module):
    def __init__(self, model: nn.Module, statistics: Sequence[str], inputs: int):
        super().__init__()
        self.model, self.statistics, self.inputs = model, list(statistics), inputs

    def forward(self, *args):
        inputs, stats = args[: self.inputs], args[self.inputs:]
        loss, logits = torch.func.functional_call(self.model, dict(zip(self.statistics, stats, strict=True)),
                                                  inputs, strict=False)
        updates = [t for _, bn in batch_norms(self.model) for t in bn.updates]
        return (loss, logits.detach(), *updates)


class _EvalStep(nn.Module):
    def __init__(self, model: nn.Module, names: Sequence[str], inputs: int):
        super().__init__()
        self.model, self.names, self.inputs = model, list(names), inputs

    def forward(self, *args):
        state = dict(zip(self.names, args[self.inputs:], strict=True))
        return torch.func.functional_call(self.model, state, args[: self.inputs], strict=False)


def _training_partitioner():
    """XNNPACK for the ops that dominate a rewritten training step, none of them reading a parameter."""
    from executorch.backends.xnnpack.partition.config import generic_node_configs as g
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torch._export.utils import is_buffer, is_lifted_tensor_constant, is_param

    def safe(config):
        def check_constraints(self, node, ep):
            held = any(n.op == "placeholder" and (is_param(ep, n) or is_buffer(ep, n) or is_lifted_tensor_constant(ep, n))
                       for n in node.all_input_nodes)
            return not held and config.check_constraints(self, node, ep)
        return type("Safe" + config.__name__, (config,), {"check_constraints": check_constraints})

    return XnnpackPartitioner(configs=[safe(getattr(g, name)) for name in DELEGATED])


@dataclass
class SuffixProgram:
    program: bytes                 # the .pte
    weights: bytes                 # the .ptd
    parameters: list[str]          # trained parameters (suffix keys), in the evaluate method's input order
    statistics: list[str]          # BN running statistics (suffix keys), in input order
    loss: torch.Tensor             # the suffix's outputs on the example, for the IO description
    logits: torch.Tensor


def training_program(suffix: nn.Module, example: Sequence[torch.Tensor], delegate: bool = True) -> SuffixProgram:
    """The suffix's training program (methods `forward`, `evaluate`) and its weights, at its current state.
    `example`: (*features, labels) at the artifact's batch size."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from torch.export.experimental import _export_forward_backward

    model = rewrite(suffix)
    statistics = [f"{name}.{s}" for name, _ in batch_norms(model) for s in STATISTICS]
    parameters = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    stats = [state[k] for k in statistics]
    n = len(example)

    model.train()
    joint = _export_forward_backward(torch.export.export(_TrainingStep(model, statistics, n), (*example, *stats),
                                                         strict=False))
    with torch.no_grad():
        loss, logits = model(*example)
    model.eval()
    evaluate = torch.export.export(_EvalStep(model, parameters + statistics, n),
                                   (*example, *[state[k] for k in parameters], *stats), strict=False)
    methods = {"forward": joint, "evaluate": evaluate}
    config = EdgeCompileConfig(_check_ir_validity=False)
    edge = (to_edge_transform_and_lower(methods, partitioner=[_training_partitioner()], compile_config=config)
            if delegate else to_edge(methods, compile_config=config))
    # external_constants: tensors the suffix holds but never trains live in the .ptd too, so that
    # refreshing weights reaches them
    program = edge.to_executorch(ExecutorchBackendConfig(external_mutable_weights=True, external_constants=True))
    (weights,) = program._tensor_data.values()
    return SuffixProgram(program.buffer, bytes(weights), parameters, statistics, loss, logits)


def prefix_program(prefix: nn.Module, example: torch.Tensor) -> bytes:
    """The frozen prefix in eval mode lowered to XNNPACK, its weights inside the program."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(prefix.eval(), (example,), strict=False)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
