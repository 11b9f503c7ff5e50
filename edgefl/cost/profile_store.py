"""Where model profiles are kept: memory, then a JSON file per (model, widths) under the cache folder, then
the torch profiler (edgefl.cost.profiler), which only a profile never made before needs."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from edgefl.cost.profile import PROFILE_VERSION, AuxProfile, ModelProfile
from edgefl.zoo import ModelRef


def cache_dir() -> Path:
    root = os.environ.get("EDGEFL_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "edgefl")
    return Path(root) / f"profiles-v{PROFILE_VERSION}"


class ProfileStore:
    """Profiles by (model, widths) and aux heads by (model, widths, boundary, kind): memory, then disk,
    then the torch profiler. One store per planning session keeps repeated lookups cheap."""

    def __init__(self, directory: Optional[Path] = None, persist: bool = True):
        self.directory = directory or cache_dir()
        self.persist = persist
        self._profiles: dict = {}
        self._aux: dict = {}

    def profile(self, model: ModelRef, widths: tuple[float, ...] | None = None) -> ModelProfile:
        key = (model, widths)
        if key not in self._profiles:
            self._profiles[key] = self._load_or_make(model, widths)
        return self._profiles[key]

    def full(self, model: ModelRef) -> ModelProfile:
        return self.profile(model, None)

    def aux(self, model: ModelRef, widths: tuple[float, ...] | None, boundary: int, kind: str) -> AuxProfile:
        key = (model, widths, boundary, kind)
        if key not in self._aux:
            name = self._name(model, widths, f"aux{boundary}{kind}")
            data = self._read(name)
            if data is None:
                from edgefl.cost.profiler import profile_aux
                data = asdict(profile_aux(model, widths, boundary, kind))
                self._write(name, data)
            self._aux[key] = AuxProfile(**data)
        return self._aux[key]

    def _load_or_make(self, model: ModelRef, widths) -> ModelProfile:
        name = self._name(model, widths, "layers")
        data = self._read(name)
        if data is not None and data.get("version") == PROFILE_VERSION:
            return ModelProfile.from_json(data)
        from edgefl.cost.profiler import profile_model  # torch is needed only here
        prof = profile_model(model, widths)
        self._write(name, prof.to_json())
        return prof

    @staticmethod
    def _name(model: ModelRef, widths, what: str) -> str:
        w = "full" if widths is None else "-".join(f"{x:.6g}" for x in widths)
        return f"{model.name}-{model.key()}-{what}-{hashlib.sha256(w.encode()).hexdigest()[:12]}.json"

    def _read(self, name: str):
        if not self.persist:
            return None
        try:
            return json.loads((self.directory / name).read_text())
        except (OSError, ValueError):
            return None

    def _write(self, name: str, data: dict) -> None:
        if not self.persist:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f".{name}.{os.getpid()}"
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.directory / name)
        except OSError:
            pass  # a read-only home only costs re-profiling next time
