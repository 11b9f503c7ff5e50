"""A run's history: one record per round, written as history.json beside the run's config and plan."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from edgefl.coordinator import RoundRecord

SCHEMA = "edgefl.history/1"


def history_json(records: list[RoundRecord]) -> dict:
    rounds = []
    for r in records:
        d = asdict(r)
        d["participating_devices"] = d.pop("participating")
        rounds.append(d)
    return {"schema": SCHEMA, "rounds": rounds}


def write_history(records: list[RoundRecord], path: str | Path) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(history_json(records), indent=1) + "\n")
    tmp.replace(path)  # never a half-written history
