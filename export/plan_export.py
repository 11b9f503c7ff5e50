"""Export a whole plan: each distinct TrainConfig once per backend, prefixes shared through one cache.

`export_plan` writes OUT/<config hash>-<backend>/ for every config a group trains (a FeDepth sequence
contributes each of its blocks) and OUT/index.json: per set its folder, config, the groups and rounds
that train it, its artifact id, file count and bytes, upload bytes and the predicted peak memory on the
backend's runtime. The prefix cache lives in OUT/.prefixes and is removed at the end.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch

from edgefl.cost.profile_store import ProfileStore
from edgefl.export.backend import Backend
from edgefl.export.pipeline import PrefixCache, export_set, predicted_cost
from edgefl.planning.plan import Plan
from edgefl.trainconfig import TrainConfig

INDEX_SCHEMA = "edgefl.export-index/1"


def plan_configs(plan: Plan) -> dict[TrainConfig, list[tuple[str, tuple[int, int]]]]:
    """Each distinct config a group trains, with (group, rounds) of every step that trains it."""
    out: dict[TrainConfig, list] = {}
    for name, group in plan.groups.items():
        for step in group.steps:
            for config in step.sequence or (step.config,):
                out.setdefault(config, []).append((name, step.rounds))
    return out


def export_plan(plan: Plan, global_state: Mapping[str, torch.Tensor], backend: Backend, out: Path, *,
                weights_version: int = 0, on_progress: Optional[Callable[[int, int, str], None]] = None) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    configs = plan_configs(plan)
    cache, store = PrefixCache(out / ".prefixes"), ProfileStore()
    sets, skipped = [], []
    for i, (config, uses) in enumerate(configs.items()):
        if config.exits or config.copies > 1:     # objectives beyond cross-entropy: the torch emulation's
            skipped.append({"config_hash": config.hash(), "groups": sorted({g for g, _ in uses}),
                            "reason": "exit heads / mutually distilling copies train in the torch emulation only"})
            continue
        folder = f"{config.hash()}-{backend.name}"
        if on_progress:
            on_progress(i, len(configs), folder)
        artifacts = export_set(plan.model, config, global_state, backend, out / folder, weights_version=weights_version,
                               predicted=predicted_cost(plan.model, config, backend.name, store), cache=cache)
        m = artifacts.suffix
        files = len(m.files) + (len(artifacts.prefix.files) if artifacts.prefix else 0)
        size = m.artifact_bytes + (artifacts.prefix.artifact_bytes if artifacts.prefix else 0)
        sets.append({"folder": folder, "config_hash": m.config_hash, "config": config.to_json(), "id": m.id,
                     "prefix_id": m.prefix_id, "groups": sorted({g for g, _ in uses}),
                     "rounds": [{"group": g, "rounds": list(r)} for g, r in uses], "files": files,
                     "artifact_bytes": size, "upload_bytes": m.upload_bytes,
                     "predicted_peak_bytes": m.predicted["peak_memory_bytes"]})
    shutil.rmtree(cache.root, ignore_errors=True)
    if on_progress:
        on_progress(len(configs), len(configs), "done")
    index = {"schema": INDEX_SCHEMA, "method": plan.method, "model": plan.model.to_json(), "backend": backend.name,
             "weights_version": weights_version, "sets": sets, "skipped": skipped}
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index
