"""The artifact Trainer contract: train an exported artifact set (edgefl.manifest.ArtifactSet) on numpy
batches. numpy in, numpy out; importing this module imports no runtime.

A trainer is constructed from a verified `ArtifactSet` (suffix folder + manifest, prefix folder +
manifest when layers are frozen) and implements:

* `prefix_features(x)`: the boundary state as a tuple of arrays, through the prefix's inference graph
  (x itself, as a 1-tuple, when nothing is frozen), `manifest.prefix_batch` samples at a time where it is
  set (`in_chunks`): the cost model prices the prefix's working set at that many samples;
* `train_step(x, y, lr)`: one step on one batch of model inputs x and flat int64 targets y (one per
  logit row: (N,) for a classifier, (N*T,) for a language model; -100 is ignored): prefix, then the
  suffix's forward, backward and optimizer step (manifest `optimizer`, torch.optim semantics) with BN
  statistics and batch counters updated as torch's train mode does. Returns the loss before the update;
* `eval_batch(x, y)`: (mean loss, logits) of one batch in eval mode (BN running statistics), no update;
* `trained_tensor(entry)`: one tensor of manifest `trainable`, a view of the trainer's own buffer where the
  runtime gives one (valid until the next step).

`evaluate` and `fit` are shared here. Trainers register by runtime name (the manifest's `backend`);
`open_trainer(folder)` reads, verifies and loads one.
"""
from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Optional

import numpy as np

from edgefl.errors import ArtifactError, ConfigError, MissingDependencyError
from edgefl.manifest import ArtifactSet, TensorEntry, flatten, write_flat

IGNORE_INDEX = -100

# runtime -> (module, class, pip extra, module the runtime needs)
_TRAINERS: dict[str, tuple[str, str, str, str]] = {
    "ort": ("edgefl.device_runtime.trainers.ort_trainer", "OrtTrainer", "ort", "onnxruntime"),
    "executorch": ("edgefl.device_runtime.trainers.executorch_trainer", "ExecuTorchTrainer", "executorch",
                   "executorch"),
    "torch": ("edgefl.device_runtime.trainers.torch_artifact_trainer", "TorchArtifactTrainer", "torch", "torch"),
}


def trainer_names() -> list[str]:
    return list(_TRAINERS)


def trainer_modules(runtime: str) -> tuple[str, str]:
    """(the trainer's module, the module of the runtime it needs): both importable is the trainer installed."""
    module, _, _, needs = _TRAINERS[runtime]
    return module, needs


def register_trainer(runtime: str, module: str, cls: str, extra: str, needs: str) -> None:
    _TRAINERS[runtime] = (module, cls, extra, needs)


def trainer_class(runtime: str) -> type["ArtifactTrainer"]:
    if runtime not in _TRAINERS:
        raise ConfigError(f"--runtime: unknown runtime {runtime!r}; choose one of: {', '.join(_TRAINERS)}")
    module, cls, extra, needs = _TRAINERS[runtime]
    if importlib.util.find_spec(needs) is None:   # found, not imported: the trainer imports it its own way
        raise MissingDependencyError(f"{needs} is not installed; install it with: pip install 'edgefl[{extra}]'")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ConfigError(f"--runtime {runtime}: this installation of edgefl has no {runtime} trainer ({module})") from None


def open_trainer(folder: str | Path, runtime: Optional[str] = None, threads: int = 1) -> "ArtifactTrainer":
    """Verify the artifact set in `folder` and load it into the trainer of its backend (`runtime`, if
    given, must agree with it)."""
    artifacts = ArtifactSet.open(folder)
    if runtime is not None and runtime != artifacts.runtime:
        raise ConfigError(f"--runtime {runtime}: {Path(folder) / 'manifest.json'} was exported for "
                          f"{artifacts.runtime}; train it with --runtime {artifacts.runtime} or export it again "
                          f"with --backend {runtime}")
    return trainer_class(artifacts.runtime)(artifacts, threads=threads)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an artifact's .npz (weights, statistics), or an ArtifactError naming the file: a set whose
    manifest was rewritten to match a damaged file passes verification and must still fail in one line."""
    import zipfile

    try:
        with np.load(path) as archive:
            return {k: np.array(v) for k, v in archive.items()}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ArtifactError(f"{path}: not a readable .npz ({exc}); copy the set again or export it again") from None


def in_chunks(run, x: np.ndarray, chunk: int) -> tuple[np.ndarray, ...]:
    """`run` (an inference graph: rows independent) over `x` in chunks of `chunk` rows, outputs joined:
    only one chunk's activations are alive at a time."""
    parts = [run(x[i:i + chunk]) for i in range(0, len(x), chunk)]
    return tuple(np.concatenate(outs) for outs in zip(*parts, strict=True))


class ArtifactTrainer(ABC):
    runtime: ClassVar[str]

    def __init__(self, artifacts: ArtifactSet, threads: int = 1):
        if artifacts.runtime != self.runtime:
            raise ArtifactError(f"{artifacts.folder / 'manifest.json'}: exported for {artifacts.runtime}, "
                                f"not {self.runtime}")
        self.artifacts, self.manifest, self.threads = artifacts, artifacts.suffix, threads
        self.steps = 0

    @property
    def batch_size(self) -> int:
        return self.manifest.batch_size

    @abstractmethod
    def prefix_features(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        ...

    @abstractmethod
    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        ...

    @abstractmethod
    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        ...

    @abstractmethod
    def trained_tensor(self, entry: TensorEntry) -> np.ndarray:
        ...

    def trained_tensors(self) -> dict[str, np.ndarray]:
        """Every tensor of manifest `trainable` as {global name: array} in manifest order: copies, which a
        caller may keep across steps."""
        return {e.name: np.array(self.trained_tensor(e), copy=True) for e in self.manifest.trainable}

    def upload_buffer(self) -> np.ndarray:
        """The flat float32 upload buffer (manifest order) in memory, filled a tensor at a time from the trainer's
        buffers: one copy of the trained tensors, not a copy of each and then their concatenation. A round writes
        its upload with `write_upload`, which holds none."""
        return flatten(self.manifest.trainable, self.trained_tensor)

    def write_upload(self, path) -> int:
        """The upload buffer written to `path` (.npy) a tensor at a time from the trainer's buffers, never whole in
        memory (what a round's worker does); the bytes of values written."""
        return write_flat(path, self.manifest.trainable, self.trained_tensor)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> dict:
        """Mean cross-entropy over the non-ignored targets and their accuracy, in batches of the manifest's
        batch size (eval mode, no update). x and y may be arrays or local data read a batch at a time
        (edgefl.device_runtime.local_data); y holds each example's targets, or all targets flat."""
        per_example = _per_example(x, y)
        loss, correct, count = 0.0, 0, 0
        for start in range(0, len(x), self.batch_size):
            xb = x[start:start + self.batch_size]
            yb = np.asarray(per_example[start:start + len(xb)], np.int64).reshape(-1)
            mean, logits = self.eval_batch(xb, yb)
            valid = yb != IGNORE_INDEX
            n = int(valid.sum())
            loss += float(mean) * n
            correct += int((np.asarray(logits).argmax(-1)[valid] == yb[valid]).sum())
            count += n
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1), "examples": len(x)}

    def fit(self, x: np.ndarray, y: np.ndarray, lr: float, steps: int, seed: int = 0) -> list[float]:
        """`steps` training steps on batches of the manifest's batch size drawn without replacement from a
        seeded permutation (a new one each pass; a pass's remainder smaller than a batch is skipped)."""
        y = _per_example(x, y)
        rng = np.random.default_rng(seed)
        batch = min(self.batch_size, len(x))
        losses: list[float] = []
        order = rng.permutation(len(x))
        start = 0
        while len(losses) < steps:
            if start + batch > len(order):
                order, start = rng.permutation(len(x)), 0
            idx = np.sort(order[start:start + batch])
            start += batch
            losses.append(self.train_step(x[idx], np.asarray(y[idx], np.int64).reshape(-1), lr))
        return losses


def _per_example(x, y):
    """y with one entry (a classifier's target, an LM's T targets) per example of x: as it is when it
    already has one per example (local data read a batch at a time is), else the flat targets reshaped."""
    if len(y) == len(x):
        return y
    return np.asarray(y, np.int64).reshape(len(x), -1)
