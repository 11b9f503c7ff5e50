"""torch backend: prefix and suffix as `torch.export` programs, the fallback for devices with torch.

Files. Prefix: `prefix.pt2` (eval mode). Suffix: `suffix_train.pt2` (BN in train mode: batch
statistics, running statistics and batch counters updated in the graph), `suffix_eval.pt2` (eval mode),
and `weights.npz`, the suffix's tensors by state_dict key. A program fixes BN's mode when it is traced
(`.module()` refuses train()/eval()), hence two programs. Each program also carries the weights it was
traced with; `weights.npz` is the authority the trainer loads into both, and the only file
`write_weights` rewrites. The batch dimension is dynamic (labels: batch x rows per sample).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.export import Dim

from edgefl.export.backend import Backend, PrefixFiles, SuffixFiles
from edgefl.manifest import IOSpec, Manifest
from edgefl.trainconfig import TrainConfig

MAX_BATCH = 1 << 16


def _io(names, tensors, first: str) -> list[IOSpec]:
    return [IOSpec(n, (first, *t.shape[1:]), str(t.detach().numpy().dtype)) for n, t in zip(names, tensors, strict=True)]


def _export(module: torch.nn.Module, example: tuple, rows: int = 1) -> torch.export.ExportedProgram:
    batch = Dim("batch", min=1, max=MAX_BATCH)
    shapes = [{0: batch} for _ in example]
    if len(example) > 1:                       # suffix: features..., labels (batch x rows per sample)
        shapes[-1] = {0: batch * rows} if rows > 1 else {0: batch}
        return torch.export.export(module, example, dynamic_shapes=(tuple(shapes),))
    return torch.export.export(module, example, dynamic_shapes=tuple(shapes))


class TorchBackend(Backend):
    name = "torch"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    def export_prefix(self, prefix, example, out: Path) -> PrefixFiles:
        prefix.eval()
        with torch.no_grad():
            result = prefix(example)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        torch.export.save(_export(prefix, (example,)), out / "prefix.pt2")
        return PrefixFiles({"prefix.pt2": "model"}, _io(["input"], [example], "batch"),
                           _io([f"features{i}" for i in range(len(outs))], outs, "batch"))

    def export_suffix(self, suffix, example, config: TrainConfig, out: Path) -> SuffixFiles:
        state = {k: v.detach().clone() for k, v in suffix.state_dict().items()}
        rows = example[-1].shape[0] // example[0].shape[0]
        try:
            suffix.train()
            torch.export.save(_export(suffix, example, rows), out / "suffix_train.pt2")
            suffix.eval()
            with torch.no_grad():
                loss, logits = suffix(*example)
            torch.export.save(_export(suffix, example, rows), out / "suffix_eval.pt2")
        finally:
            suffix.load_state_dict(state)
            suffix.train()
        np.savez(out / "weights.npz", **{k: v.numpy() for k, v in state.items()})
        features = [f"features{i}" for i in range(len(example) - 1)]
        return SuffixFiles({"suffix_train.pt2": "training_program", "suffix_eval.pt2": "eval_program",
                            "weights.npz": "weights"},
                           _io(features, example[:-1], "batch") + _io(["labels"], example[-1:], "rows"),
                           [IOSpec("loss", (), str(loss.numpy().dtype)), *_io(["logits"], [logits], "rows")])

    def write_weights(self, out: Path, manifest: Manifest, tensors: dict[str, np.ndarray]) -> list[str]:
        name = manifest.file("weights")
        with np.load(out / name) as old:
            values = dict(old)
        for e in (*manifest.trainable, *manifest.frozen):
            values[e.local] = np.asarray(tensors[e.name], dtype=e.dtype).reshape(e.shape)
        np.savez(out / name, **values)
        return [name]
