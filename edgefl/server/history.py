"""A run's history: one record per round, written as history.json beside the run's config and plan.

history.json is `{"schema": ..., "rounds": [...]}` with one record per line, so a run grows it one round
at a time (`HistoryFile.append`: the record and the list's closing are written over the old closing) and
every reader keeps reading it as one JSON document (`read_history`). A round costs its own record, not the
whole history: a run of R rounds writes O(R) bytes, where rewriting the file each round wrote O(R^2).

API for whatever writes or reads a run's history:
    HistoryFile(path, records=())   start (or restart, from a checkpoint) the file with these records
    HistoryFile.append(record)      add one round (a dict: `record_to_json(RoundRecord)`)
    write_history(records, path)    the whole history at once (RoundRecords)
    read_history(path)              the records as dicts
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from edgefl.outdir import storage_error, write_atomic

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


_HEAD = ('{"schema": "%s", "rounds": [' % SCHEMA).encode()
_FOOT = b"\n]}\n"


class HistoryFile:
    """history.json kept up to date a round at a time; valid JSON after every append."""

    def __init__(self, path: str | Path, records: Sequence[dict] = ()):
        self.path = Path(path)
        body = b"".join(self._line(r, i) for i, r in enumerate(records))
        write_atomic(self.path, _HEAD + body + _FOOT, durable=False)
        self.count = len(records)

    @staticmethod
    def _line(record: dict, index: int) -> bytes:
        return (b"," if index else b"") + b"\n" + json.dumps(record).encode()

    def append(self, record: dict) -> None:
        data = self._line(record, self.count) + _FOOT
        try:
            with open(self.path, "r+b") as f:
                f.seek(-len(_FOOT), os.SEEK_END)
                f.write(data)
        except OSError as exc:
            raise storage_error(self.path, exc, len(data)) from None
        self.count += 1


def write_history(records: list[RoundRecord], path: str | Path) -> None:
    HistoryFile(path, [record_to_json(r) for r in records])


def read_history(path: str | Path, tries: int = 3) -> list[dict]:
    """The records of a history.json (OSError, ValueError or KeyError when it is missing or not one). A
    reader that meets the file while a round is appended to it (its last bytes being rewritten) reads again."""
    for attempt in range(tries):
        try:
            return json.loads(Path(path).read_text())["rounds"]
        except ValueError:
            if attempt == tries - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")
