"""TrainConfig: the one description of what a device trains.

Layers [0, frozen_prefix) run forward only and keep no activations; layers [frozen_prefix, trained_end)
train; when trained_end stops short of the last layer an auxiliary head (`aux_head`) reads the state at
that boundary and the later layers are not sent. Hidden widths: layers >= head_start are scaled by
head_width (SLT's F_H; head_start = 0 scales the whole model as in small model / HeteroFL / FedRolex).
`index_mode` says which channels a scaled layer keeps (the training half slices them).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Literal, Optional

Optimizer = Literal["sgd", "adamw"]
AuxKind = Literal["linear", "conv"]
IndexMode = Literal["prefix", "rolling", "random"]

# optimizer state kept per trained parameter: SGD momentum buffer, AdamW first and second moments
OPTIMIZER_STATE_SLOTS = {"sgd": 1, "adamw": 2}


def aux_key(boundary: int, kind: str) -> str:
    """Where the auxiliary head of `kind` at `boundary` lives in the global state (and on the wire)."""
    return f"aux.{boundary}.{kind}."


@dataclass(frozen=True)
class TrainConfig:
    num_layers: int
    frozen_prefix: int = 0
    trained_end: Optional[int] = None      # None: train to the last layer
    head_start: Optional[int] = None       # None: no scaled head
    head_width: float = 1.0
    aux_head: Optional[AuxKind] = None
    batch_size: int = 32
    optimizer: Optimizer = "sgd"
    local_epochs: int = 1
    index_mode: IndexMode = "prefix"

    def __post_init__(self):
        end = self.end
        if not 0 <= self.frozen_prefix <= end <= self.num_layers:
            raise ValueError(f"need 0 <= frozen_prefix ({self.frozen_prefix}) <= trained_end ({end}) "
                             f"<= num_layers ({self.num_layers})")
        if self.frozen_prefix == end and self.aux_head is None:
            raise ValueError("a config must train something: layers or an auxiliary head")
        if end < self.num_layers and self.aux_head is None:
            raise ValueError("training stops before the last layer: an aux_head is required")
        if not 0 < self.head_width <= 1:
            raise ValueError(f"head_width must be in (0, 1], got {self.head_width}")
        if self.head_width < 1 and self.head_start is None:
            raise ValueError("head_width < 1 needs head_start")
        if self.batch_size < 1 or self.local_epochs < 1:
            raise ValueError("batch_size and local_epochs must be >= 1")

    @property
    def end(self) -> int:
        return self.num_layers if self.trained_end is None else self.trained_end

    @property
    def trained_layers(self) -> range:
        return range(self.frozen_prefix, self.end)

    @property
    def aux_prefix(self) -> str:
        """Global key prefix of this config's auxiliary head."""
        return aux_key(self.end, self.aux_head)

    @property
    def widths(self) -> tuple[float, ...]:
        """Per-layer width scale for the layers the device runs, full width elsewhere."""
        start = self.num_layers if self.head_start is None else self.head_start
        return tuple(self.head_width if i >= start else 1.0 for i in range(self.num_layers))

    def with_(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["trained_layers"] = list(self.trained_layers)
        return d

    @classmethod
    def from_json(cls, data: dict) -> "TrainConfig":
        data = {k: v for k, v in data.items() if k != "trained_layers"}
        return cls(**data)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
