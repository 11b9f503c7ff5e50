"""A run's history: one record per round, written as history.json beside the run's config and plan."""
from __future__ import annotations

import json
from pathlib import Path

from edgefl.coordinator import RoundRecord, record_to_json

SCHEMA = "edgefl.history/1"


def history_json(records: list[RoundRecord]) -> dict:
    return {"schema": SCHEMA, "rounds": [record_to_json(r) for r in records]}


def write_history(records: list[RoundRecord], path: str | Path) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(history_json(records), indent=1) + "\n")
    tmp.replace(path)  # never a half-written history
