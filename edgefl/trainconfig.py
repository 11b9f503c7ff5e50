"""TrainConfig: the one description of what a device trains.

Layers [0, frozen_prefix) run forward only and keep no activations; layers [frozen_prefix, trained_end)
train; when trained_end stops short of the last layer an auxiliary head (`aux_head`) reads the state at
that boundary and the later layers are not sent. Hidden widths: layers >= head_start are scaled by
head_width (SLT's F_H; head_start = 0 scales the whole model as in small model / HeteroFL / FedRolex).
`index_mode` says which channels a scaled layer keeps (the training half slices them).

Method extensions, left out of the JSON and the hash when unset (so existing configs keep their hash):
`rank` trains the linear weights of the hidden trained layers [frozen_prefix, num_layers - 1) at low
rank (`rank_mode` 'lora': frozen base weights plus trained adapters B A, Heterogeneous LoRA; 'factor': the
weights replaced by factors U V, FedHM), the output layer always in full; `exits` are extra linear exit
heads at those boundaries (DepthFL); `copies` > 1 trains that many copies of the trained part that learn
from each other (m-FeDepth).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Literal, Optional

Optimizer = Literal["sgd", "adamw"]
AuxKind = Literal["linear", "conv"]
IndexMode = Literal["prefix", "rolling", "random"]
RankMode = Literal["lora", "factor"]

# optimizer state kept per trained parameter: SGD momentum buffer, AdamW first and second moments
OPTIMIZER_STATE_SLOTS = {"sgd": 1, "adamw": 2}


def pass_batches(examples: int, batch_size: int) -> range:
    """Where each batch of one pass over `examples` starts. The remainder trains as a smaller batch, except a
    remainder of one example, which is skipped: batch norm cannot normalise one example over a 1x1 map (VGG-11's
    last block): torch raises, and where it does not, the example's variance is 0 and its normalised features all
    0, nothing to train on. As a data loader's drop_last, for that one case only."""
    whole = examples - 1 if batch_size > 1 and examples % batch_size == 1 else examples
    return range(0, whole, batch_size)


def output_layer(names, prefix: str = "aux.") -> list[str]:
    """ProFL's output layer (sec. 4.1): of the tensors a step trains, those of its auxiliary head's last module,
    the head's tensors being named `prefix` + module index + ... (`aux.` in a device's model; a config's
    `aux_prefix` in the global state and on the wire). The device trains and uploads these alone, and the
    server expects these alone: one rule for both sides."""
    head = [n for n in names if n.startswith(prefix)]
    last = max((int(n[len(prefix):].split(".")[0]) for n in head), default=None)
    return [n for n in head if n.startswith(f"{prefix}{last}.")]


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
    rank: Optional[int] = None             # None: full rank
    rank_mode: RankMode = "lora"
    exits: tuple[int, ...] = ()
    copies: int = 1

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
        self._check_extensions()

    def _check_extensions(self) -> None:
        object.__setattr__(self, "exits", tuple(int(b) for b in self.exits))   # JSON gives a list
        if self.rank is not None:
            if self.rank < 1 or self.rank_mode not in ("lora", "factor"):
                raise ValueError(f"rank must be >= 1 with rank_mode lora or factor, got {self.rank}, {self.rank_mode!r}")
            if self.head_width < 1 or self.aux_head is not None:
                raise ValueError("a low-rank config trains full-width layers up to the model's own head")
            if not self.rank_layers:
                raise ValueError("a rank needs a trained layer before the output layer")
        elif self.rank_mode != "lora":
            raise ValueError("rank_mode needs a rank")
        if list(self.exits) != sorted(set(self.exits)) or any(not self.frozen_prefix < b < self.end for b in self.exits):
            raise ValueError(f"exits must be increasing boundaries strictly inside the trained layers "
                             f"({self.frozen_prefix}, {self.end}), got {self.exits}")
        if self.copies < 1:
            raise ValueError(f"copies must be >= 1, got {self.copies}")

    @property
    def end(self) -> int:
        return self.num_layers if self.trained_end is None else self.trained_end

    @property
    def trained_layers(self) -> range:
        return range(self.frozen_prefix, self.end)

    @property
    def rank_layers(self) -> range:
        """The layers whose linear weights train at low rank: the trained ones but the output layer."""
        if self.rank is None:
            return range(0)
        return range(self.frozen_prefix, min(self.end, self.num_layers - 1))

    @property
    def aux_prefix(self) -> str:
        """Global key prefix of this config's auxiliary head."""
        return aux_key(self.end, str(self.aux_head))

    @property
    def widths(self) -> tuple[float, ...]:
        """Per-layer width scale for the layers the device runs, full width elsewhere."""
        start = self.num_layers if self.head_start is None else self.head_start
        return tuple(self.head_width if i >= start else 1.0 for i in range(self.num_layers))

    def with_(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def _fields(self) -> dict:
        d = asdict(self)
        unset = {"rank": None, "rank_mode": "lora", "exits": (), "copies": 1}
        return {k: v for k, v in d.items() if k not in unset or v != unset[k]}

    def to_json(self) -> dict:
        d = self._fields()
        d["trained_layers"] = list(self.trained_layers)
        return d

    @classmethod
    def from_json(cls, data: dict) -> "TrainConfig":
        data = {k: v for k, v in data.items() if k != "trained_layers"}
        return cls(**data)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self._fields(), sort_keys=True).encode()).hexdigest()[:16]
