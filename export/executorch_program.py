"""ExecuTorch programs for a split model: the prefix for inference, the suffix as a training program.

The suffix becomes one `.pte` and one `.ptd` holding its weights. Its one method, `forward`, is the joint
forward/backward graph of the rewritten suffix (edgefl.export.et_rewrites):

    (*features, labels, batch_statistics, *statistics) -> (loss, logits, *updated statistics,
                                                          *gradients, *parameters)

Parameters are *external mutable weights*: the runtime copies them from the `.ptd` into memory it owns,
where the trainer reads and updates them (`Method.get_attribute`), so new global weights are a new
`.ptd`, never a new program. BN running statistics are inputs and outputs, not mutable buffers
(et_rewrites explains why). `batch_statistics` (a float32 scalar) is 1 to train, 0 to evaluate: BN then
normalises with the running statistics, and the trainer ignores the gradients and updated statistics.
Evaluating through the training program spends a backward pass, but exports and plans one program
instead of two: exporting costs time per graph node, and each method's memory plan is memory the device
holds. Parameters are named in the program and the `.ptd` by their suffix state_dict key under `PREFIX`.

Shapes are static, at the batch the artifact is exported for: a symbolic batch made exporting half again
as slow, and ExecuTorch plans memory for the largest batch anyway.

The training program's operators are aten ones and edgefl's batch norm and its backward (edgefl.export.et_ops:
one fused kernel each way). Those two, its convolutions, max pools, matrix products and the copies and
reductions around them run on edgefl's kernels (device_runtime/native/src: registered in the native trainer, and
in the Python bindings by the Python ExecuTorch trainer, which requires them: no shipped kernel serves the batch
norm, and the shipped max pool backward returns wrong gradients), the rest on ExecuTorch's; a transpose is a full
copy, so autograd's transposes are moved onto the smaller operand (`_transpose_the_smaller_operand`). Memory:
an alias autograd saves is read at its source (`_drop_aliases`), what the forward built only by moving data is
built again in the backward instead of kept (`_rematerialize_patches`), and the plan packs tensors by offset
(edgefl.export.et_memory_plan): a full ResNet-20 suffix at batch 32 plans 55 MiB where it planned 279. Handing
the transposes to XNNPACK too would cut a ResNet-20 step by about a fifth but cost about half a second of export
per delegated partition (about 75 in a suffix), and partitions must never read a parameter: a delegate copies
the program tensors it reads into its own blob, out of the optimizer's reach.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from edgefl.export.et_memory_plan import planner
from edgefl.export.et_rewrites import batch_norms, rewrite

PREFIX = "model."
STATISTICS = ("running_mean", "running_var")


class _TrainingStep(nn.Module):
    def __init__(self, model: nn.Module, statistics: Sequence[str], inputs: int):
        super().__init__()
        self.model, self.statistics, self.inputs = model, list(statistics), inputs
        self.switches = [f"{name}.batch_statistics" for name, _ in batch_norms(model)]

    def forward(self, *args):
        inputs, switch, stats = args[: self.inputs], args[self.inputs], args[self.inputs + 1:]
        state = {**dict(zip(self.statistics, stats, strict=True)), **{k: switch for k in self.switches}}
        loss, logits = torch.func.functional_call(self.model, state, inputs, strict=False)
        updates = [t for _, bn in batch_norms(self.model) for t in bn.updates]
        return (loss, logits.detach(), *updates)


def _transpose_the_smaller_operand(program: torch.export.ExportedProgram) -> None:
    """Rewrite a product X^T G (bmm, or mm) as (G^T X)^T where X is the larger: autograd's weight gradient
    of a product transposes the activation, its input gradient the weight, and a transpose is a full copy in
    ExecuTorch."""
    aten, graph = torch.ops.aten, program.graph_module.graph
    output = graph.output_node()
    swaps = {aten.bmm.default: [0, 2, 1], aten.mm.default: [1, 0]}
    for node in list(graph.nodes):
        if node.target not in swaps or node in output.all_input_nodes:
            continue
        swap, a, b = swaps[node.target], *node.args
        if a.target != aten.permute.default or list(a.args[1]) != swap:
            continue
        x = a.args[0]
        if x.meta["val"].numel() <= b.meta["val"].numel() + node.meta["val"].numel():
            continue
        with graph.inserting_before(node):
            bt = graph.call_function(aten.permute.default, (b, swap))
            bt.meta["val"] = aten.permute.default(b.meta["val"], swap)
            product = graph.call_function(node.target, (bt, x))
            product.meta["val"] = node.target(bt.meta["val"], x.meta["val"])
            result = graph.call_function(aten.permute.default, (product, swap))
            result.meta["val"] = aten.permute.default(product.meta["val"], swap)
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in node.meta:
                for new in (bt, product, result):
                    new.meta[key] = node.meta[key]
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        if not a.users:
            graph.erase_node(a)
    program.graph_module.recompile()


# ops that only move or build data (views, slices, concatenation, constant fills): recomputing them costs a
# copy, never arithmetic
_CHEAP = {"view", "_unsafe_view", "reshape", "permute", "slice", "cat", "full", "new_full", "unsqueeze",
          "squeeze", "expand", "alias", "clone", "transpose", "t", "split", "split_with_sizes"}


def _is_cheap(node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:       # one piece of a split: the split is cheap, its pieces too
        return _is_cheap(node.args[0]) and _name(node.args[0]).startswith("split")
    return _name(node).split(".")[0] in _CHEAP


def _name(node) -> str:
    return getattr(node.target, "__name__", "")


def _drop_aliases(program: torch.export.ExportedProgram) -> None:
    """Read an alias's source instead of the alias. Autograd saves a ReLU's output for its backward as an
    `alias`, which ExecuTorch makes a copy (alias_copy): every ReLU's output was kept twice. The joint graph
    is functional (nothing is written in place), so an alias and its source always hold the same values."""
    graph = program.graph_module.graph
    outputs = set(graph.output_node().all_input_nodes)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.alias.default and node not in outputs:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.lint()
    program.graph_module.recompile()


def _rematerialize_patches(program: torch.export.ExportedProgram) -> None:
    """Recompute in the backward pass what the forward built only by moving data, instead of keeping it.

    A concatenation (a DenseNet block's growing input) is the size of all its parts, and the backward needs it
    again: kept, it stays in the program's memory plan from the forward step to the backward step (max pools and
    convolutions written as stacked slices, before edgefl's kernels served them, made the plan several times what
    torch keeps). Here each forward value built by slicing and concatenation that the backward reads is built
    again right before its first backward reader, from the tensors it was built from (which the backward keeps
    anyway), so the forward copy dies with its forward use."""
    from torch.export.graph_signature import OutputKind

    graph = program.graph_module.graph
    output = graph.output_node()
    gradients = (OutputKind.GRADIENT_TO_PARAMETER, OutputKind.GRADIENT_TO_USER_INPUT)
    stack = [o for o, spec in zip(output.args[0], program.graph_signature.output_specs, strict=True)
             if spec.kind not in gradients and isinstance(o, torch.fx.Node)]
    forward = set()                                  # what the forward outputs (loss, logits, statistics) need
    while stack:
        node = stack.pop()
        if node not in forward:
            forward.add(node)
            stack.extend(node.all_input_nodes)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node not in forward or not _is_cheap(node):
            continue
        backward_users = [u for u in node.users if u not in forward and u.op != "output"]
        if not backward_users:
            continue
        chain, stack = [], [node]
        while stack:                                 # the cheap nodes node is built from
            n = stack.pop()
            if n in chain:
                continue
            chain.append(n)
            stack.extend(i for i in n.all_input_nodes if _is_cheap(i))
        if not any(getattr(n.target, "__name__", "").startswith("cat") for n in chain):
            continue                                 # views of kept tensors cost nothing to keep
        chain.sort(key=order.__getitem__)
        first = min(backward_users, key=order.__getitem__)
        env: dict = {}
        with graph.inserting_before(first):
            for n in chain:
                env[n] = graph.node_copy(n, lambda x: env.get(x, x))
        for user in backward_users:
            user.replace_input_with(node, env[node])
    graph.lint()
    program.graph_module.recompile()


@dataclass
class SuffixProgram:
    program: bytes                 # the .pte
    weights: bytes                 # the .ptd
    statistics: list[str]          # BN running statistics (suffix keys), in input order
    logits: torch.Tensor           # the suffix's logits on the example, for the IO description


def training_program(suffix: nn.Module, example: Sequence[torch.Tensor]) -> SuffixProgram:
    """The suffix's training program and its weights, at its current state. `example`: (*features,
    labels) at the artifact's batch size."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    model = rewrite(suffix).train()
    statistics = [f"{name}.{s}" for name, _ in batch_norms(model) for s in STATISTICS]
    state = model.state_dict()
    inputs = (*example, torch.ones(()), *[state[k].clone() for k in statistics])
    joint = _export_forward_backward(torch.export.export(_TrainingStep(model, statistics, len(example)), inputs,
                                                         strict=False))
    _transpose_the_smaller_operand(joint)
    _drop_aliases(joint)
    _rematerialize_patches(joint)
    with torch.no_grad():
        _, logits = model(*example)
    edge = to_edge(joint, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    # external_constants: tensors the suffix holds but never trains live in the .ptd too, so that
    # refreshing weights reaches them
    program = edge.to_executorch(ExecutorchBackendConfig(external_mutable_weights=True, external_constants=True,
                                                         memory_planning_pass=planner()))
    (weights,) = program._tensor_data.values()
    return SuffixProgram(program.buffer, bytes(weights), statistics, logits)


def prefix_program(prefix: nn.Module, example: torch.Tensor) -> bytes:
    """The frozen prefix in eval mode lowered to XNNPACK, its weights inside the program. GELU stays on
    the portable kernel: XNNPACK's put a transformer prefix 1.4e-4 away from torch (portable: 5e-7)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(prefix.eval(), (example,), strict=False)
    partitioner = XnnpackPartitioner(configs=[c for c in ALL_PARTITIONER_CONFIGS if c.__name__ != "GeluConfig"])
    return to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer
