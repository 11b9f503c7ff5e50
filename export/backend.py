"""The contract between the export pipeline and a runtime backend (ort, executorch, torch).

The pipeline (edgefl.export.pipeline) splits a device model at its frozen prefix and hands a backend
two torch modules:

* `export_prefix(prefix, example, out)`: `prefix(x)` runs the frozen layers in eval mode and returns the
  boundary state (a tensor or a tuple of tensors). Write an inference graph into `out`.
* `export_suffix(suffix, example, config, out)`: `suffix(*features, labels)` returns `(loss, logits)`,
  loss FIRST (mean cross-entropy, ignore_index -100). `example` is `(*features, labels)` at the config's
  batch size. Its state_dict names are *suffix-local* (the device model's: 'layers.<i>.*', 'aux.*'); the
  pipeline maps them to global names (manifest `trainable`). Parameters train by gradient with
  `SuffixFiles.optimizer` (torch.optim semantics, lr given per step); float buffers are BN running
  statistics, updated in train mode as torch does; integer buffers are BN batch counters
  (num_batches_tracked: +1 per training step). Write training artifacts with the suffix's current
  weights into `out`.
* `write_weights(out, manifest, tensors)`: refresh an exported suffix's weights (`tensors`: global name
  -> array, every entry of `manifest.trainable` and `manifest.frozen`) without re-exporting its graphs;
  return the names of the files it rewrote (the pipeline rehashes them into the manifest).

Parameters with requires_grad off (a low-rank config's base weights) are held but never trained: the
manifest lists them under `frozen`.

Each returns which files it wrote (name -> role) and the graph's inputs and outputs as `IOSpec`s (numpy
dtype names; a symbolic dimension is a string such as 'batch'). `names` maps a suffix state_dict key to
the runtime's own name for that tensor where they differ; `extra` is recorded in the manifest for the
backend's trainer (document its keys in the backend's module).

Backends are found by name through `edgefl.export.backends.get_backend`; the device side loads the
matching trainer (edgefl.device_runtime.trainers.base) by the manifest's `backend`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from edgefl.manifest import IOSpec, Manifest, OptimizerSpec
from edgefl.trainconfig import TrainConfig

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclass
class PrefixFiles:
    files: dict[str, str]                        # file name (relative to out) -> role
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SuffixFiles:
    files: dict[str, str]
    inputs: list[IOSpec]                         # features..., labels
    outputs: list[IOSpec]                        # loss, logits, then anything else the runtime needs
    names: dict[str, str] = field(default_factory=dict)   # suffix state_dict key -> runtime name, where different
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    name: ClassVar[str]

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Runtime and exporter versions the artifacts are written for (recorded in the manifest)."""

    @abstractmethod
    def export_prefix(self, prefix: "nn.Module", example: "Tensor", out: Path) -> PrefixFiles:
        ...

    @abstractmethod
    def export_suffix(self, suffix: "nn.Module", example: tuple["Tensor", ...], config: TrainConfig,
                      out: Path) -> SuffixFiles:
        ...

    @abstractmethod
    def write_weights(self, out: Path, manifest: Manifest, tensors: dict[str, np.ndarray]) -> list[str]:
        ...

    @staticmethod
    def optimizer(config: TrainConfig) -> OptimizerSpec:
        """The optimizer (and its torch-matching hyperparameters) a suffix for `config` trains with."""
        return OptimizerSpec.for_optimizer(config.optimizer)
