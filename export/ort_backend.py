"""ONNX Runtime backend: the prefix as an ONNX inference model, the suffix as ORT training artifacts.

Files. Prefix: `prefix.onnx` (eval mode, constants folded) with its weights as external data, `prefix.weights`.
Suffix: `training_model.onnx`, `eval_model.onnx`, `checkpoint` (parameters and BN statistics, BN batch counters
as int properties under their runtime names) and, for AdamW, `optimizer_model.onnx` (ORT's AdamW in torch's mode).
Graphs come from the TorchScript exporter (opset 17; the dynamo exporter emits ops ORT cannot
differentiate and exports BN in eval mode) with the edits of edgefl.export.onnx_graph.

Optimizers, torch.optim semantics: AdamW runs ORT's optimizer graph (adam_mode 0, torch's betas, eps and
weight decay). ORT's SGD graph has neither momentum nor weight decay, so SGD is applied by the trainer
on the gradients ORT leaves in the checkpoint state (torch.optim.SGD's rule, one momentum buffer per
parameter: the optimizer state the cost model counts).

`extra` (read by edgefl.device_runtime.trainers.ort_trainer): `batch_norm`, per training-mode BN: its
running mean / variance (checkpoint names), the outputs holding their updated values, ONNX momentum, and
`per_sample`, the values per channel one sample contributes (H*W), which turns ORT's biased batch
variance into torch's unbiased one.
"""
from __future__ import annotations

import io
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from edgefl.export import onnx_graph
from edgefl.export.backend import Backend, PrefixFiles, SuffixFiles
from edgefl.manifest import IOSpec, Manifest
from edgefl.trainconfig import TrainConfig

OPSET = 17
PREFIX_WEIGHTS = "prefix.weights"     # the prefix graph's external data, named in its initializers


def _dtype(t: torch.Tensor) -> str:
    return str(t.numpy().dtype) if t.dtype != torch.bfloat16 else "bfloat16"


def _io(names: list[str], tensors, dims: dict[int, str]) -> list[IOSpec]:
    return [IOSpec(n, tuple(dims.get(i, s) if i == 0 else s for i, s in enumerate(t.shape)), _dtype(t))
            for n, t in zip(names, tensors, strict=True)]


def _gelu(g, x, approximate="none"):
    """GELU as ONNX Runtime's own op (com.microsoft FastGelu: the tanh approximation; Gelu: erf). Opset 17
    has no GELU: the exporter writes it out as ~10 elementwise nodes, each keeping a hidden-sized tensor for
    its gradient (a transformer set peaked at 853 MiB with them); FastGeluGrad keeps the input alone."""
    from torch.onnx import symbolic_helper

    mode = symbolic_helper._maybe_get_const(approximate, "s")
    return g.op("com.microsoft::FastGelu" if mode == "tanh" else "com.microsoft::Gelu", x).setType(x.type())


def _trace(module: torch.nn.Module, example: tuple, inputs: list[str], outputs: list[str],
           dynamic: dict[str, dict[int, str]], training: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    torch.onnx.register_custom_op_symbolic("aten::gelu", _gelu, OPSET)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the exporter warns about every BN counter it drops
            torch.onnx.export(module, example, f, input_names=inputs, output_names=outputs, opset_version=OPSET,
                              dynamo=False, do_constant_folding=not training, dynamic_axes=dynamic,
                              training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL)
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::gelu", OPSET)
    return onnx.load_from_string(f.getvalue())


def _differentiable(suffix: torch.nn.Module) -> torch.nn.Module:
    """A copy of `suffix` (same state_dict) with what ORT 1.19 cannot differentiate rewritten: average pools
    that tile the input become a mean over a reshape (its AveragePoolGrad dies of a floating-point
    exception)."""
    import copy

    from edgefl.export.et_rewrites import TiledAvgPool2d

    out = copy.deepcopy(suffix)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.AvgPool2d and TiledAvgPool2d.supports(child):
                setattr(parent, name, TiledAvgPool2d(child))
    return out


def _batch_norm_sizes(suffix: torch.nn.Module, example: tuple) -> dict[str, int]:
    """Per BN module (state_dict prefix): values per channel one sample contributes to its statistics."""
    sizes, hooks = {}, []
    for name, m in suffix.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            def hook(mod, args, name=name):
                x = args[0]
                sizes[name + "."] = x.numel() // (x.shape[0] * x.shape[1])
            hooks.append(m.register_forward_pre_hook(hook))
    state = {k: v.clone() for k, v in suffix.state_dict().items()}
    try:
        with torch.no_grad():
            suffix(*example)
    finally:
        for h in hooks:
            h.remove()
        suffix.load_state_dict(state)
    return sizes


@contextmanager
def _quiet():
    """generate_artifacts makes its own SessionOptions at the default log level, at which gradient
    building logs every graph transformer: hand it quiet ones."""
    from onnxruntime.training.onnxblock import _training_graph_utils as utils

    original = utils.SessionOptions

    def quiet():
        options = original()
        options.log_severity_level = 3
        return options
    utils.SessionOptions = quiet
    try:
        yield
    finally:
        utils.SessionOptions = original


class OrtBackend(Backend):
    name = "ort"

    def versions(self) -> dict[str, str]:
        import onnxruntime
        return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "torch": torch.__version__,
                "opset": str(OPSET)}

    def export_prefix(self, prefix, example, out: Path) -> PrefixFiles:
        with torch.no_grad():
            result = prefix(example)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        names = [f"features{i}" for i in range(len(outs))]
        dynamic = {n: {0: "batch"} for n in ["input", *names]}
        model = _trace(prefix.eval(), (example,), ["input"], names, dynamic, training=False)
        # weights beside the graph: ORT reads a file with embedded weights whole, parses it and builds its tensors,
        # about three copies of the weights at once while loading (VGG-11, 35 MiB prefix: 147 MiB load peak); with
        # external data the file's bytes are not held while the tensors are built (112 MiB), steady RSS the same
        onnx.save(model, out / "prefix.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                  location=PREFIX_WEIGHTS)
        files = {"prefix.onnx": "model"}
        if (out / PREFIX_WEIGHTS).exists():       # not written when no tensor is over onnx's 1 KiB threshold
            files[PREFIX_WEIGHTS] = "weights"
        return PrefixFiles(files, _io(["input"], [example], {0: "batch"}), _io(names, outs, {0: "batch"}))

    def export_suffix(self, suffix, example, config: TrainConfig, out: Path) -> SuffixFiles:
        from onnxruntime.training import artifacts

        state = {k: v.detach().clone() for k, v in suffix.state_dict().items()}
        params = [k for k, p in suffix.named_parameters() if p.requires_grad]
        stats = [k for k, v in state.items() if v.is_floating_point() and k not in params]   # and frozen weights
        counters = [k for k, v in state.items() if not v.is_floating_point()]
        features = [f"features{i}" for i in range(len(example) - 1)]
        dynamic = {n: {0: "batch"} for n in features} | {"labels": {0: "rows"}, "logits": {0: "rows"}}
        sizes = _batch_norm_sizes(suffix, example)
        suffix.train()
        with torch.no_grad():
            loss, logits = suffix(*example)
        model = _trace(_differentiable(suffix), example, [*features, "labels"], ["loss", "logits"], dynamic,
                       training=True)
        suffix.load_state_dict(state)
        onnx_graph.restore_initializers(model, {k: v.numpy() for k, v in state.items()})
        onnx_graph.read_inputs_once(model, features)
        missing = set(params + stats) - onnx_graph.initializer_names(model)
        if missing:
            raise RuntimeError(f"the ONNX export lost or renamed tensors {sorted(missing)[:4]}")
        batch_norm = onnx_graph.name_batch_norm_outputs(model)
        for bn in batch_norm:
            bn["per_sample"] = sizes[bn["mean"][: -len("running_mean")]]
        onnx_graph.expose_layer_norm_stats(model)
        updated = [name for bn in batch_norm for name in (bn["mean_out"], bn["var_out"])]
        spec = self.optimizer(config)
        with tempfile.TemporaryDirectory(dir=out) as tmp, _quiet():   # generate_artifacts writes fixed names
            artifacts.generate_artifacts(
                model, requires_grad=params, frozen_params=stats, loss=None,
                optimizer=artifacts.OptimType.AdamW if spec.name == "adamw" else None,
                artifact_directory=tmp, additional_output_names=updated or None)
            for f in Path(tmp).iterdir():
                shutil.move(str(f), out / f.name)
        onnx_graph.eval_without_statistics(out / "eval_model.onnx", set(updated))
        files = {"training_model.onnx": "training_model", "eval_model.onnx": "eval_model", "checkpoint": "checkpoint"}
        if spec.name == "adamw":
            onnx_graph.torch_adamw(out / "optimizer_model.onnx", spec.betas, spec.eps, spec.weight_decay)
            files["optimizer_model.onnx"] = "optimizer_model"
        _write_checkpoint(out / "checkpoint", {k: state[k].numpy() for k in params},
                          {k: state[k].numpy() for k in stats}, {k: state[k].numpy() for k in counters})
        inputs = _io(features, example[:-1], {0: "batch"}) + _io(["labels"], example[-1:], {0: "rows"})
        outputs = _io(["loss", "logits"], [loss, logits], {0: "rows"})
        return SuffixFiles(files, inputs, outputs, extra={"batch_norm": batch_norm})

    def write_weights(self, out: Path, manifest: Manifest, tensors: dict[str, np.ndarray]) -> list[str]:
        def pick(entries, kind):
            return {e.local: np.asarray(tensors[e.name]) for e in entries if e.kind == kind}
        held = (*manifest.trainable, *manifest.frozen)
        frozen = {**pick(manifest.frozen, "parameter"), **pick(held, "statistic")}
        name = manifest.file("checkpoint")
        _write_checkpoint(out / name, pick(manifest.trainable, "parameter"), frozen, pick(held, "counter"))
        return [name]


def _write_checkpoint(path: Path, trainable: dict[str, np.ndarray], frozen: dict[str, np.ndarray],
                      counters: dict[str, np.ndarray]) -> None:
    """A checkpoint written from scratch: trained parameters, BN statistics (frozen for ORT: it updates
    them only through the graph outputs) and BN counters as int properties. Writing through
    CheckpointState.parameters needs a training session (it crashes without one), hence onnxblock."""
    from onnxruntime.training.api import CheckpointState
    from onnxruntime.training.onnxblock import save_checkpoint

    def protos(values):
        return [numpy_helper.from_array(np.ascontiguousarray(v, dtype=np.float32), k) for k, v in values.items()]

    save_checkpoint((protos(trainable), protos(frozen)), path)
    if counters:
        state = CheckpointState.load_checkpoint(str(path))
        for name, value in counters.items():
            state.properties[name] = int(value)
        CheckpointState.save_checkpoint(state, str(path))
