"""A coordinator's durable state, so a crashed `edgefl serve` resumes instead of starting over.

Layout of the state folder:

    checkpoint.json        {"schema", "round": last completed round, "weights": file, "strategy": file,
                            "sha256": {file: its sha256}}
    weights-<r>.npz        global tensors after round r's aggregation
    strategy-<r>.pkl       the strategy object after round r (its online decisions: ProFL's step, ...)
    history.json           one record per completed round, appended as each completes (it may sit in another
                           folder: an emulated run keeps its checkpoint in <run>/checkpoint/ and its history
                           in the run folder)
    journal/<r>/<dev>.npz  reports of the round in progress, written as each is accepted (its summary names
                           its device and round)

A checkpoint is complete or absent: its files are written first, then checkpoint.json is replaced
atomically to point at them, and only then are older files removed. A report is journaled before the
round folds it into its aggregate (and drops its tensors), so a coordinator killed mid-round finds on
restart every report it had accepted, folds them again one at a time and waits only for the others; the
journal of a round is dropped once that round's checkpoint exists.

Every write is whole or absent (edgefl.outdir.write_atomic; a full disk is one line naming the folder). A
resumed run reads its state only after checking it: the checkpoint's files against their sha256, the
history's rounds against the checkpoint's round, each journal file's device and round against its name. A
state that fails is refused with the file to look at, never resumed from silently wrong. A run that
replays a lost round exactly (emulation: every random draw is seeded by run and round) needs no journal
(`journal=False`).
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from edgefl.errors import StorageError
from edgefl.messages import DeviceReport
from edgefl.outdir import write_atomic
from edgefl.server.history import HistoryFile, read_history

if TYPE_CHECKING:     # the strategy is pickled whole: its module is the pickle's business
    from edgefl.planning.strategies.base import Strategy

SCHEMA = "edgefl.state/1"
FIX = "restore the folder from a backup, or start with an empty --state folder"


def _npz_bytes(tensors: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in tensors.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise StorageError(f"{path}: unreadable ({type(exc).__name__}: {exc}); it is truncated or not the file the "
                           f"run wrote: {FIX}") from None


class RunState:
    def __init__(self, folder: str | Path, history: Optional[str | Path] = None, journal: bool = True):
        self.folder = Path(folder)
        self.history_path = Path(history) if history is not None else self.folder / "history.json"
        self.keeps_journal = journal
        self.folder.mkdir(parents=True, exist_ok=True)
        if journal:
            (self.folder / "journal").mkdir(exist_ok=True)
        self._history_file: Optional[HistoryFile] = None    # opened by `load` or the first `save`

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, round: int, weights: Mapping[str, Any], strategy: object, history: Sequence[dict]) -> None:
        """Checkpoint round `round`; `history`: the run's records so far, of which those the history file
        lacks are appended (a round costs its own record)."""
        names = {"weights": f"weights-{round}.npz", "strategy": f"strategy-{round}.pkl"}
        files = {names["weights"]: _npz_bytes(weights), names["strategy"]: pickle.dumps(strategy)}
        for name, data in files.items():
            write_atomic(self.folder / name, data)
        if self._history_file is None:
            self._history_file = HistoryFile(self.history_path)
        for record in history[self._history_file.count:]:
            self._history_file.append(record)
        sums = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
        write_atomic(self.folder / "checkpoint.json",
                     json.dumps({"schema": SCHEMA, "round": round, **names, "sha256": sums}).encode())
        keep = set(names.values())
        for old in list(self.folder.glob("weights-*.npz")) + list(self.folder.glob("strategy-*.pkl")):
            if old.name not in keep:
                old.unlink(missing_ok=True)
        self._drop_journal(upto=round)

    def completed(self) -> int:
        """The last round checkpointed here (0 for a fresh folder), read without loading or checking the
        checkpoint (`load` checks it)."""
        try:
            return int(json.loads((self.folder / "checkpoint.json").read_text())["round"])
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{self.folder / 'checkpoint.json'}: unreadable ({exc}): {FIX}") from None

    def load(self) -> Optional[tuple[int, dict[str, np.ndarray], Strategy, list[dict]]]:
        """(last completed round, global tensors, strategy, history records) or None for a fresh folder;
        StorageError naming the file when the state is damaged or inconsistent."""
        pointer = self.folder / "checkpoint.json"
        if not pointer.exists():
            self.check_journal()
            return None
        meta = self._checkpoint(pointer)
        round = meta["round"]
        for name in (meta["weights"], meta["strategy"]):
            path = self.folder / name
            if not path.is_file():
                raise StorageError(f"{path}: missing, though {pointer} names it: {FIX}")
            if name in meta.get("sha256", {}) and hashlib.sha256(path.read_bytes()).hexdigest() != meta["sha256"][name]:
                raise StorageError(f"{path}: does not match its sha256 in {pointer} (truncated or changed): {FIX}")
        weights = _read_npz(self.folder / meta["weights"])
        try:
            strategy = pickle.loads((self.folder / meta["strategy"]).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise StorageError(f"{self.folder / meta['strategy']}: unreadable ({exc}): {FIX}") from None
        history = self._history(round)
        self._history_file = HistoryFile(self.history_path, history)   # drops rounds after the checkpoint
        self.check_journal(after=round)
        return round, weights, strategy, history

    def _checkpoint(self, pointer: Path) -> dict:
        try:
            meta = json.loads(pointer.read_text())
            if meta.get("schema") != SCHEMA:
                raise ValueError(f"schema {meta.get('schema')!r}, expected {SCHEMA!r}")
            round = meta["round"]
            if not isinstance(round, int) or round < 1 or meta["weights"] != f"weights-{round}.npz" or \
                    meta["strategy"] != f"strategy-{round}.pkl":
                raise ValueError(f"round {round!r} and its files {meta['weights']!r}, {meta['strategy']!r} disagree")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(f"{pointer}: not a checkpoint this run wrote ({exc}): {FIX}") from None
        return meta

    def _history(self, round: int) -> list[dict]:
        """The history's records of rounds 1..round, which it must hold in order."""
        path = self.history_path
        try:
            history = read_history(path)
            numbers = [r["round"] for r in history]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{path}: unreadable ({exc}): {FIX}") from None
        if numbers[:round] != list(range(1, round + 1)):
            raise StorageError(f"{path}: holds rounds {numbers[:12]}{' ...' if len(numbers) > 12 else ''}, but "
                               f"{self.folder / 'checkpoint.json'} says rounds 1-{round} are done: the two do not "
                               f"belong together: {FIX}")
        return history[:round]

    # ---------------------------------------------------------------------------------- journal
    def journal(self, report: DeviceReport) -> None:
        if not self.keeps_journal:
            return
        folder = self.folder / "journal" / str(report.round)
        folder.mkdir(parents=True, exist_ok=True)
        summary = {k: v for k, v in asdict(report).items() if k != "tensors"}
        tensors = {f"t/{k}": v for k, v in report.tensors.items()}
        write_atomic(folder / f"{report.device_id}.npz",
                     _npz_bytes({**tensors, "summary": np.frombuffer(json.dumps(summary).encode(), np.uint8)}))

    def journaled_devices(self, round: int) -> list[str]:
        """The devices whose report of `round` the journal holds, without reading the reports."""
        folder = self.folder / "journal" / str(round)
        return sorted(p.stem for p in folder.glob("*.npz")) if self.keeps_journal and folder.exists() else []

    def journaled(self, round: int) -> Iterator[DeviceReport]:
        """The journaled reports of `round`, by device, each read from disk when it is reached (a restarted
        coordinator folds one before it reads the next)."""
        for device in self.journaled_devices(round):
            yield self._journaled(round, device)

    def _journaled(self, round: int, device: str, tensors: bool = True) -> DeviceReport:
        path = self.folder / "journal" / str(round) / f"{device}.npz"
        arrays = _read_npz(path)
        try:
            summary = json.loads(arrays["summary"].tobytes())
            known = {f.name for f in fields(DeviceReport)}
            report = DeviceReport(**{k: v for k, v in summary.items() if k in known},
                                  tensors={k[2:]: v for k, v in arrays.items() if k.startswith("t/")} if tensors else {})
        except (KeyError, ValueError, TypeError) as exc:
            raise StorageError(f"{path}: not a journaled report ({exc}): {FIX}") from None
        if (report.device_id, report.round) != (device, round):
            raise StorageError(f"{path}: holds {report.device_id}'s report of round {report.round}, not {device}'s of "
                               f"round {round}: {FIX}")
        return report

    def check_journal(self, after: int = 0) -> None:
        """Every journal file readable and under its own device and round (StorageError naming the first that
        is not); a journal of a round the checkpoint already holds is stale and dropped."""
        if not self.keeps_journal:
            return
        for folder in sorted((self.folder / "journal").iterdir()):
            if not folder.name.isdigit():
                continue
            if int(folder.name) <= after:
                continue
            for device in self.journaled_devices(int(folder.name)):
                self._journaled(int(folder.name), device, tensors=False)
        self._drop_journal(upto=after)

    def _drop_journal(self, upto: int) -> None:
        if not self.keeps_journal:
            return
        for folder in (self.folder / "journal").iterdir():
            if folder.name.isdigit() and int(folder.name) <= upto:
                for f in folder.iterdir():
                    f.unlink(missing_ok=True)
                folder.rmdir()
