"""ModelProfile: what each layer of a model costs, per sample, at one width vector. No torch here.

Profiles are derived from the model itself by `edgefl.profiler` (torch, hooks) and cached as JSON, so
planning needs torch only the first time a (model, widths) pair is seen.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from edgefl.zoo import ModelRef

PROFILE_VERSION = 5


@dataclass(frozen=True)
class LayerProfile:
    kind: str                 # class name of the layer module
    params: int
    param_bytes: int
    buffer_bytes: int         # e.g. BN running statistics
    output_shape: tuple       # per sample, of the first tensor of the state
    output_bytes: int         # per sample, every tensor of the state
    forward_flops: float      # per sample; multiply-add = 2 FLOPs; conv/matmul only
    activation_bytes: int     # per sample: storages kept for backward whose last saver is this layer
    carried_bytes: int        # per sample: storages this layer keeps that a later layer keeps too
    output_saved_bytes: int   # per sample: bytes of this layer's own output that it keeps
    activation_fixed_bytes: int = 0  # per batch, whatever its size: kept storages that do not grow with it
    forward_peak_bytes: int = 0  # per sample: most bytes alive at once in its forward, input state included
    # (out_features, in_features, rows per sample, has bias) of each nn.Linear the layer runs: what low-rank
    # training (LoRA adapters, FedHM factors) changes (edgefl.cost)
    linears: tuple = ()


@dataclass(frozen=True)
class AuxProfile:
    """An auxiliary head at one boundary (ProFL output module, FeDepth/DepthFL classifier)."""
    boundary: int
    kind: str
    params: int
    param_bytes: int
    buffer_bytes: int
    forward_flops: float
    activation_bytes: int     # kept storages other than the head's input
    input_saved_bytes: int    # the boundary state, if the head keeps it
    activation_fixed_bytes: int = 0  # per batch: kept storages that do not grow with it (BN statistics)


@dataclass(frozen=True)
class ModelProfile:
    model: ModelRef
    widths: tuple[float, ...]
    input_shape: tuple
    input_bytes: int          # per sample
    num_classes: int
    cut_points: tuple[int, ...]
    stages: tuple[int, ...]
    layers: tuple[LayerProfile, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_json(self) -> dict:
        d = asdict(self)
        d["model"] = self.model.to_json()
        d["version"] = PROFILE_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ModelProfile":
        return cls(model=ModelRef.from_json(d["model"]), widths=tuple(d["widths"]),
                   input_shape=tuple(d["input_shape"]), input_bytes=d["input_bytes"],
                   num_classes=d["num_classes"], cut_points=tuple(d["cut_points"]), stages=tuple(d["stages"]),
                   layers=tuple(LayerProfile(**{**l, "output_shape": tuple(l["output_shape"]),
                                                "linears": tuple(tuple(x) for x in l.get("linears", ()))})
                                for l in d["layers"]))


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
                from edgefl.profiler import profile_aux
                data = asdict(profile_aux(model, widths, boundary, kind))
                self._write(name, data)
            self._aux[key] = AuxProfile(**data)
        return self._aux[key]

    def _load_or_make(self, model: ModelRef, widths) -> ModelProfile:
        name = self._name(model, widths, "layers")
        data = self._read(name)
        if data is not None and data.get("version") == PROFILE_VERSION:
            return ModelProfile.from_json(data)
        from edgefl.profiler import profile_model  # torch is needed only here
        prof = profile_model(model, widths)
        self._write(name, prof.to_json())
        return prof

    @staticmethod
    def _name(model: ModelRef, widths, what: str) -> str:
        w = "full" if widths is None else "-".join(f"{x:.6g}" for x in widths)
        import hashlib
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
