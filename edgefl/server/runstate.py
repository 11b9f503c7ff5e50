"""A coordinator's durable state, so a crashed `edgefl serve` resumes instead of starting over.

Layout of the state folder:

    checkpoint.json        {"schema", "round": last completed round, "weights": file, "strategy": file}
    weights-<r>.npz        global tensors after round r's aggregation
    strategy-<r>.pkl       the strategy object after round r (its online decisions: ProFL's step, ...)
    history.json           one record per completed round
    journal/<r>/<dev>.npz  reports of the round in progress, written as each is accepted

A checkpoint is complete or absent: its files are written first, then checkpoint.json is replaced
atomically to point at them, and only then are older files removed. A report is journaled before the
round folds it into its aggregate (and drops its tensors), so a coordinator killed mid-round finds on
restart every report it had accepted, folds them again one at a time and waits only for the others; the
journal of a round is dropped once that round's checkpoint exists.
"""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

import numpy as np

from edgefl.errors import ConfigError
from edgefl.messages import DeviceReport

if TYPE_CHECKING:     # the strategy is pickled whole: its module is the pickle's business
    from edgefl.planning.strategies.base import Strategy

SCHEMA = "edgefl.state/1"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _npz_bytes(tensors: Mapping[str, Any]) -> bytes:
    import io

    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in tensors.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


class RunState:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "journal").mkdir(exist_ok=True)

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, round: int, weights: Mapping[str, Any], strategy: object, history: list[dict]) -> None:
        names = {"weights": f"weights-{round}.npz", "strategy": f"strategy-{round}.pkl"}
        _atomic_write(self.folder / names["weights"], _npz_bytes(weights))
        _atomic_write(self.folder / names["strategy"], pickle.dumps(strategy))
        _atomic_write(self.folder / "history.json", json.dumps({"schema": "edgefl.history/1", "rounds": history},
                                                              indent=1).encode())
        _atomic_write(self.folder / "checkpoint.json",
                      json.dumps({"schema": SCHEMA, "round": round, **names}).encode())
        keep = set(names.values())
        for old in list(self.folder.glob("weights-*.npz")) + list(self.folder.glob("strategy-*.pkl")):
            if old.name not in keep:
                old.unlink(missing_ok=True)
        self._drop_journal(upto=round)

    def completed(self) -> int:
        """The last round checkpointed here (0 for a fresh folder), read without loading the checkpoint."""
        try:
            return int(json.loads((self.folder / "checkpoint.json").read_text())["round"])
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{self.folder}: unreadable run state ({exc}); start with an empty --state folder "
                              "or restore the folder from a backup") from None

    def records(self) -> list[dict]:
        """The completed rounds' history records, read without loading the checkpoint."""
        done = self.completed()
        if not done:
            return []
        try:
            return json.loads((self.folder / "history.json").read_text())["rounds"][:done]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{self.folder}/history.json: unreadable run state ({exc}); start with an empty "
                              "--state folder or restore the folder from a backup") from None

    def load(self) -> Optional[tuple[int, dict[str, np.ndarray], Strategy, list[dict]]]:
        """(last completed round, global tensors, strategy, history records) or None for a fresh folder."""
        pointer = self.folder / "checkpoint.json"
        if not pointer.exists():
            return None
        try:
            meta = json.loads(pointer.read_text())
            if meta.get("schema") != SCHEMA:
                raise ValueError(f"schema {meta.get('schema')!r}, expected {SCHEMA!r}")
            with np.load(self.folder / meta["weights"]) as npz:
                weights = {k: npz[k] for k in npz.files}
            strategy = pickle.loads((self.folder / meta["strategy"]).read_bytes())
            history = json.loads((self.folder / "history.json").read_text())["rounds"]
        except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError) as exc:
            raise ConfigError(f"{self.folder}: unreadable run state ({exc}); start with an empty --state folder "
                              "or restore the folder from a backup") from None
        return meta["round"], weights, strategy, history[: meta["round"]]

    # ---------------------------------------------------------------------------------- journal
    def journal(self, report: DeviceReport) -> None:
        folder = self.folder / "journal" / str(report.round)
        folder.mkdir(parents=True, exist_ok=True)
        summary = {k: v for k, v in asdict(report).items() if k != "tensors"}
        tensors = {f"t/{k}": v for k, v in report.tensors.items()}
        _atomic_write(folder / f"{report.device_id}.npz",
                      _npz_bytes({**tensors, "summary": np.frombuffer(json.dumps(summary).encode(), np.uint8)}))

    def journaled_devices(self, round: int) -> list[str]:
        """The devices whose report of `round` the journal holds, without reading the reports."""
        folder = self.folder / "journal" / str(round)
        return sorted(p.stem for p in folder.glob("*.npz")) if folder.exists() else []

    def journaled(self, round: int) -> Iterator[DeviceReport]:
        """The journaled reports of `round`, by device, each read from disk when it is reached (a restarted
        coordinator folds one before it reads the next)."""
        folder = self.folder / "journal" / str(round)
        known = {f.name for f in fields(DeviceReport)}
        for device in self.journaled_devices(round):
            with np.load(folder / f"{device}.npz") as npz:
                summary = json.loads(npz["summary"].tobytes())
                tensors = {k[2:]: npz[k] for k in npz.files if k.startswith("t/")}
            yield DeviceReport(**{k: v for k, v in summary.items() if k in known}, tensors=tensors)

    def _drop_journal(self, upto: int) -> None:
        for folder in (self.folder / "journal").iterdir():
            if folder.name.isdigit() and int(folder.name) <= upto:
                for f in folder.iterdir():
                    f.unlink(missing_ok=True)
                folder.rmdir()
