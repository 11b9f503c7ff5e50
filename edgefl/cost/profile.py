"""ModelProfile: what each layer of a model costs, per sample, at one width vector. No torch here.

Profiles are derived from the model itself by `edgefl.cost.profiler` (torch, hooks) and cached as JSON, so
planning needs torch only the first time a (model, widths) pair is seen.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

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
    # training (LoRA adapters, FedHM factors) changes (edgefl.cost.model)
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
