"""A run's history: one record per round, written as history.json beside the run's config and plan."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from edgefl.outdir import write_atomic

SCHEMA = "edgefl.history/1"


@dataclass
class RoundRecord:
    round: int
    sampled: dict[str, str]                       # device -> group
    participating: dict[str, int]                 # group -> devices that reported
    skipped: dict[str, str] = field(default_factory=dict)     # device -> why it did not train
    rejected: dict[str, str] = field(default_factory=dict)    # device -> why its reports were dropped (' | ')
    failed: dict[str, str] = field(default_factory=dict)      # device -> why it failed the round (e.g. out of memory)
    predicted_peak_bytes: dict[str, int] = field(default_factory=dict)
    measured_peak_bytes: dict[str, int] = field(default_factory=dict)   # peak RSS the device measured
    examples: dict[str, int] = field(default_factory=dict)              # examples per pass the device trained
    measured_activation_bytes: dict[str, int] = field(default_factory=dict)
    upload_bytes: int = 0
    download_bytes: int = 0
    download_saved_bytes: int = 0                 # spared by shrinking frozen layers (FedOLF TOA)
    flops: float = 0.0
    flops_per_device: dict[str, float] = field(default_factory=dict)   # device -> FLOPs its instruction allows
    train_loss: Optional[float] = None
    accuracy: Optional[float] = None
    loss: Optional[float] = None
    group_accuracy: dict[str, float] = field(default_factory=dict)   # global model on each group's local data
    device_metrics: dict[str, dict] = field(default_factory=dict)    # device -> what its trainer reported
    decisions: dict[str, Any] = field(default_factory=dict)          # the strategy's online decisions
    missing: list[str] = field(default_factory=list)                 # sent an instruction, no report by the deadline
    aggregated: bool = True                                          # False: below quorum, the model is unchanged
    wall_s: float = 0.0


def record_to_json(record: RoundRecord) -> dict:
    """A RoundRecord as history.json stores it."""
    d = asdict(record)
    d["participating_devices"] = d.pop("participating")
    return d


def record_from_json(d: dict) -> RoundRecord:
    d = dict(d)
    d["participating"] = d.pop("participating_devices", d.get("participating", {}))
    return RoundRecord(**{k: v for k, v in d.items() if k in RoundRecord.__dataclass_fields__})


def history_json(records: list[RoundRecord]) -> dict:
    return {"schema": SCHEMA, "rounds": [record_to_json(r) for r in records]}


def write_history(records: list[RoundRecord], path: str | Path) -> None:
    write_atomic(Path(path), (json.dumps(history_json(records), indent=1) + "\n").encode(), durable=False)
