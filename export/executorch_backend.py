"""ExecuTorch backend: the prefix as an XNNPACK `.pte`, the suffix as a joint forward/backward training
program whose weights live in a `.ptd` (edgefl.export.executorch_program describes both programs).

Files. Prefix: `prefix.pte` (eval mode, weights inside, static batch `extra["batch"]`, the runtime's
`prefix_batch`: the trainer runs it in chunks of that many rows). Suffix: `suffix.pte` (the training
program, which also evaluates), `weights.ptd` (the parameters, external mutable weights), `state.npz` (BN running statistics and batch counters by
suffix key: program inputs the trainer keeps, not weights the runtime holds).

Refreshing weights (`write_weights`) rewrites `weights.ptd` and `state.npz`, never the program: the
`.ptd` keeps its keys and layouts, only the bytes change.

`extra` (read by edgefl.device_runtime.trainers.executorch_trainer): `prefix`, the key prefix of
parameters in the program and the `.ptd`; `statistics`, the BN running statistics in input order;
`batch`, the batch the programs are planned for (training takes exactly that many rows; evaluation pads
to it).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edgefl.cost.constants import DEFAULTS
from edgefl.export.backend import Backend, PrefixFiles, SuffixFiles
from edgefl.export.executorch_program import PREFIX, prefix_program, training_program
from edgefl.manifest import IOSpec, Manifest
from edgefl.trainconfig import TrainConfig


def _io(names, tensors) -> list[IOSpec]:
    return [IOSpec(n, tuple(t.shape), str(t.detach().numpy().dtype)) for n, t in zip(names, tensors, strict=True)]


def write_ptd(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Rewrite the `.ptd` at `path` with new values for some of its tensors (same keys, shapes, dtypes).
    Every tensor gets its own buffer: the exporter shares one between tensors that were equal."""
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    serializer = FlatTensorSerializer()
    old = serializer.deserialize(Cord(path.read_bytes()))
    if unknown := sorted(tensors.keys() - old.named_data.keys()):
        raise KeyError(f"{path.name} holds no tensor {unknown[0]!r}")
    buffers, named = [], {}
    for key, entry in old.named_data.items():
        data = old.buffers[entry.buffer_index]
        if key in tensors:
            new = np.ascontiguousarray(tensors[key]).tobytes()
            if len(new) != len(data):
                raise ValueError(f"{key}: {len(new)} bytes, {path.name} holds {len(data)}")
            data = new
        named[key] = DataEntry(len(buffers), 64, entry.tensor_layout)
        buffers.append(data)
    blob = serializer.serialize(DataPayload(buffers=buffers, named_data=named))
    with open(path, "wb") as f:
        blob.write_to_file(f)


class ExecuTorchBackend(Backend):
    name = "executorch"

    def versions(self) -> dict[str, str]:
        from executorch import version
        return {"executorch": version.__version__, "torch": torch.__version__}

    def export_prefix(self, prefix, example, out: Path) -> PrefixFiles:
        # planned for the rows the trainer runs through it at once (the cost model prices that many)
        example = example[: DEFAULTS[self.name].prefix_batch or len(example)]
        with torch.no_grad():
            result = prefix.eval()(example)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        (out / "prefix.pte").write_bytes(prefix_program(prefix, example))
        return PrefixFiles({"prefix.pte": "model"}, _io(["input"], [example]),
                           _io([f"features{i}" for i in range(len(outs))], outs), extra={"batch": len(example)})

    def export_suffix(self, suffix, example, config: TrainConfig, out: Path) -> SuffixFiles:
        state = {k: v.detach().clone() for k, v in suffix.state_dict().items()}
        try:
            program = training_program(suffix, example)
        finally:
            suffix.load_state_dict(state)
            suffix.train()
        (out / "suffix.pte").write_bytes(program.program)
        (out / "weights.ptd").write_bytes(program.weights)
        buffers = dict(suffix.named_buffers())
        np.savez(out / "state.npz", **{k: v.numpy() for k, v in state.items() if k in buffers})
        features = [f"features{i}" for i in range(len(example) - 1)]
        return SuffixFiles({"suffix.pte": "program", "weights.ptd": "weights", "state.npz": "statistics"},
                           _io([*features, "labels"], example),
                           [IOSpec("loss", (), "float32"), *_io(["logits"], [program.logits])],
                           extra={"prefix": PREFIX, "statistics": program.statistics, "batch": len(example[0])})

    def write_weights(self, out: Path, manifest: Manifest, tensors: dict[str, np.ndarray]) -> list[str]:
        entries = (*manifest.trainable, *manifest.frozen)
        weights, state = manifest.file("weights"), manifest.file("statistics")
        with np.load(out / state) as old:
            buffers = dict(old)
        params = {}
        for e in entries:
            value = np.asarray(tensors[e.name], dtype=e.dtype).reshape(e.shape)
            if e.local in buffers:
                buffers[e.local] = value
            else:
                params[manifest.extra["prefix"] + e.local] = value
        write_ptd(out / weights, params)
        np.savez(out / state, **buffers)
        return [weights, state]
