"""The export pipeline: (model, TrainConfig, global weights) -> a self-contained artifact set folder.

A straight chain: split the device model at its frozen prefix (edgefl.export.split) -> the backend writes
the prefix's inference graph and the suffix's training artifacts -> manifests describe them
(edgefl.manifest). A set folder holds the suffix artifact and, under `prefix/`, the prefix artifact it
needs; it can be copied to a device as it is.

Artifacts are keyed by (TrainConfig hash, backend): `export_plan` builds each distinct config of a plan
once. The prefix is a separate artifact keyed by what it computes (`PrefixCache`: backend, model,
frozen layers and their widths, the bytes of their weights): sets that share it reuse one export
(hard-linked where the file system allows). `refresh_weights` fills an exported set with new global
weights without re-exporting its graphs (a changed frozen prefix is exported again, a changed suffix
only has its weights rewritten by the backend).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional

import torch

from edgefl.cost.constants import DEFAULTS
from edgefl.errors import ConfigError
from edgefl.export.backend import Backend
from edgefl.export.split import Split, split
from edgefl.manifest import PREFIX_DIR, ArtifactSet, Manifest, TensorEntry
from edgefl.server.submodel import IndexSets, entries, extract, index_sets
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef


def _np_dtype(t: torch.Tensor) -> str:
    return str(t.detach().numpy().dtype)


def predicted_cost(ref: ModelRef, config: TrainConfig, runtime: str, store=None) -> dict:
    """The cost model's prediction for `config` on `runtime` (edgefl.cost.model), as JSON."""
    from edgefl.cost.model import config_cost
    from edgefl.cost.profile_store import ProfileStore

    return config_cost(store or ProfileStore(), ref, config, runtime).to_json()


def export_prefix(backend: Backend, ref: ModelRef, config: TrainConfig, parts: Split, weights_version: int,
                  out: Path, key: str) -> Manifest:
    """The frozen prefix of `parts` as an artifact in `out` (created)."""
    out.mkdir(parents=True)
    files = backend.export_prefix(parts.prefix, parts.input_example, out)
    state = parts.prefix.state_dict()
    frozen = tuple(TensorEntry(parts.names[k], k, tuple(t.shape), _np_dtype(t), _kind(parts.prefix, k, t))
                   for k, t in state.items())
    manifest = Manifest(kind="prefix", backend=backend.name, versions=backend.versions(), model=ref.to_json(),
                        config={"frozen_prefix": config.frozen_prefix,
                                "widths": list(config.widths[: config.frozen_prefix])},
                        config_hash=key, files=(), inputs=tuple(files.inputs), outputs=tuple(files.outputs),
                        frozen=frozen, batch_size=config.batch_size, weights_version=weights_version,
                        extra=files.extra).with_files(out, files.files)
    manifest.write(out)
    return manifest


def prefix_key(backend: Backend, ref: ModelRef, config: TrainConfig, state: Mapping[str, torch.Tensor]) -> str:
    """What a prefix computes: backend and versions, model, frozen layers and their widths, weight bytes."""
    h = hashlib.sha256()
    h.update(repr((backend.name, sorted(backend.versions().items()), ref.key(), config.frozen_prefix,
                   config.widths[: config.frozen_prefix])).encode())
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


class PrefixCache:
    """Exported prefixes by `prefix_key`, in `root/<key>/`; sets get linked copies under `prefix/`."""

    def __init__(self, root: Path):
        self.root = root

    def get(self, backend: Backend, ref: ModelRef, config: TrainConfig, parts: Split, weights_version: int) -> Path:
        key = prefix_key(backend, ref, config, parts.prefix.state_dict())
        folder = self.root / key
        if folder.is_dir():
            return folder
        tmp = self.root / f".{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        export_prefix(backend, ref, config, parts, weights_version, tmp, key)
        os.replace(tmp, folder)
        return folder

    def place(self, backend: Backend, ref: ModelRef, config: TrainConfig, parts: Split, weights_version: int,
              dst: Path) -> None:
        source = self.get(backend, ref, config, parts, weights_version)
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for f in source.iterdir():
            try:
                os.link(f, dst / f.name)
            except OSError:
                shutil.copy2(f, dst / f.name)


def _place_prefix(cache: Optional[PrefixCache], backend: Backend, ref: ModelRef, config: TrainConfig, parts: Split,
                  weights_version: int, dst: Path) -> Manifest:
    if cache is not None:
        cache.place(backend, ref, config, parts, weights_version, dst)
    else:
        shutil.rmtree(dst, ignore_errors=True)
        export_prefix(backend, ref, config, parts, weights_version, dst,
                      prefix_key(backend, ref, config, parts.prefix.state_dict()))
    return Manifest.read(dst)


def _kind(module: torch.nn.Module, key: str, t: torch.Tensor) -> str:
    if not t.is_floating_point():
        return "counter"
    return "parameter" if key in dict(module.named_parameters()) else "statistic"


def export_set(ref: ModelRef, config: TrainConfig, global_state: Mapping[str, torch.Tensor], backend: Backend,
               folder: Path, *, indices: Optional[IndexSets] = None, weights_version: int = 0,
               predicted: Optional[dict] = None, cache: Optional[PrefixCache] = None) -> ArtifactSet:
    """Export one config's artifact set into `folder` (replaced if it exists)."""
    if config.exits or config.copies > 1:
        raise ConfigError(f"config {config.hash()}: artifacts train one model on cross-entropy; exit heads and "
                          "mutually distilling copies are trained by the torch emulation ('edgefl emulate')")
    indices = indices or index_sets(ref, config)
    parts = split(ref, config, global_state, indices)
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prefix_manifest = None
    if parts.prefix is not None:
        prefix_manifest = _place_prefix(cache, backend, ref, config, parts, weights_version, folder / PREFIX_DIR)
    files = backend.export_suffix(parts.suffix, parts.suffix_example, config, folder)
    state = parts.suffix.state_dict()
    held = [TensorEntry(e.key, files.names.get(e.device_key, e.device_key), tuple(state[e.device_key].shape),
                        _np_dtype(state[e.device_key]), _kind(parts.suffix, e.device_key, state[e.device_key]))
            for e in entries(ref, config) if e.layer >= config.frozen_prefix]
    never = {e.key for e in entries(ref, config) if e.frozen}
    trainable = tuple(t for t in held if t.name not in never)
    if predicted is None:
        predicted = predicted_cost(ref, config, backend.name)
    manifest = Manifest(kind="suffix", backend=backend.name, versions=backend.versions(), model=ref.to_json(),
                        config=config.to_json(), config_hash=config.hash(), files=(), inputs=tuple(files.inputs),
                        outputs=tuple(files.outputs), trainable=trainable,
                        frozen=tuple(t for t in held if t.name in never), batch_size=config.batch_size,
                        prefix_batch=DEFAULTS[backend.name].prefix_batch if backend.name in DEFAULTS else 0,
                        predicted=predicted, prefix_id=prefix_manifest.id if prefix_manifest else None,
                        weights_version=weights_version, optimizer=backend.optimizer(config),
                        extra=files.extra).with_files(folder, files.files)
    manifest.write(folder)
    return ArtifactSet.open(folder)


def device_tensors(ref: ModelRef, config: TrainConfig, global_state: Mapping[str, torch.Tensor],
                   indices: Optional[IndexSets] = None) -> dict[str, torch.Tensor]:
    """The device's slice of the global state under global names (what a set's weights are filled with)."""
    indices = indices or index_sets(ref, config)
    sliced = extract(global_state, ref, config, indices)
    return {e.key: sliced[e.device_key] for e in entries(ref, config)}


def refresh_weights(folder: Path, global_state: Mapping[str, torch.Tensor], backend: Backend, *,
                    indices: Optional[IndexSets] = None, weights_version: Optional[int] = None,
                    cache: Optional[PrefixCache] = None) -> ArtifactSet:
    """Fill an exported set with new global weights: the suffix's through `backend.write_weights` (graphs
    untouched); the prefix is exported again only if its weights changed."""
    artifacts = ArtifactSet.open(folder)
    m = artifacts.suffix
    ref, config = ModelRef.from_json(m.model), TrainConfig.from_json(dict(m.config))
    tensors = device_tensors(ref, config, global_state, indices)
    version = m.weights_version + 1 if weights_version is None else weights_version
    prefix_id = m.prefix_id
    if artifacts.prefix is not None:
        parts = split(ref, config, global_state, indices or index_sets(ref, config))
        if prefix_key(backend, ref, config, parts.prefix.state_dict()) != artifacts.prefix.config_hash:
            prefix_id = _place_prefix(cache, backend, ref, config, parts, version, folder / PREFIX_DIR).id
    arrays = {e.name: tensors[e.name].detach().numpy() for e in (*m.trainable, *m.frozen)}
    changed = set(backend.write_weights(folder, m, arrays))
    roles = {f.name: f.role for f in m.files}
    unchanged = [f for f in m.files if f.name not in changed]
    updated = replace(m, weights_version=version, prefix_id=prefix_id).with_files(folder, roles)
    assert all(f in updated.files for f in unchanged), "write_weights changed files it did not report"
    updated.write(folder)
    return ArtifactSet.open(folder)
