"""What the coordinator's end sees of each device in the round in progress: one state per device, derived
from the messages that reach it, for a live view and a status file.

    sent         its instruction is out; nothing heard from it since
    downloading  it acknowledges artifact chunks (up/ack), or says it has a file of its group's (up/metrics);
                 `bytes` counts what it has acknowledged
    training     it has every file of its set (it says so on up/metrics) and trains
    reported     its report is in
    failed       its report says it failed, was refused, or it went offline during the round
    offline      its presence (the retained last will) says it is gone

A device keeps its state until a later message moves it on; a device that reports after going offline
ends as reported. Listeners hear every change of state (not every chunk) and the start of each round's
wait for reports, on the wire's thread or the round loop's: they must only take note.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Optional

from edgefl.messages import StrEnum


class DeviceState(StrEnum):
    """A device's state in the round in progress (above); WAITING marks a round's start of waiting for reports."""
    SENT = "sent"
    DOWNLOADING = "downloading"
    TRAINING = "training"
    REPORTED = "reported"
    FAILED = "failed"
    OFFLINE = "offline"
    WAITING = "waiting"


S = DeviceState
_FINAL = (S.REPORTED, S.FAILED)


@dataclass
class DeviceActivity:
    state: DeviceState
    since: float               # time.time() it entered the state
    bytes: int = 0             # artifact bytes it acknowledged this round
    detail: str = ""           # why it failed or went offline


@dataclass(frozen=True)
class Change:
    at: float
    round: int
    device: str
    state: DeviceState
    detail: str = ""
    deadline: Optional[float] = None     # of the round, in a "waiting" change


class Activity:
    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.round = 0
        self.deadline: Optional[float] = None      # time.time() the round in progress stops waiting
        self._devices: dict[str, DeviceActivity] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Change], None]] = []

    def listen(self, callback: Callable[[Change], None]) -> None:
        self._listeners.append(callback)

    # ------------------------------------------------------------------------- what the transport saw
    def sent(self, device: str, round: int) -> None:
        with self._lock:
            if round > self.round:        # a new round: the table starts over
                self.round, self.deadline, self._devices = round, None, {}
        self._set(device, S.SENT, round=round)

    def waiting(self, round: int, devices: Iterable[str], deadline: Optional[float]) -> None:
        """The round collects reports from `devices` until `deadline` (None: no deadline). Listeners hear it
        as a change of device "" to state WAITING."""
        devices = list(devices)
        with self._lock:
            if round < self.round:
                return
            self.round, self.deadline = round, deadline
            change = Change(self.clock(), round, "", S.WAITING, f"{len(devices)} devices", deadline)
        for listener in self._listeners:
            listener(change)
        for device in devices:
            if self._state(device) is None:   # instructed before a restart: the journal holds no report yet
                self._set(device, S.SENT, round=round)

    def acknowledged(self, device: str, nbytes: int) -> None:
        with self._lock:
            entry = self._devices.get(device)
            if entry is None or entry.state in _FINAL:
                return
            entry.bytes += nbytes
        if entry.state in (S.SENT, S.OFFLINE):
            self._set(device, S.DOWNLOADING)

    def progress(self, device: str, state: str) -> None:
        """A device's own word on up/metrics: 'training' once its set is complete."""
        if state == S.TRAINING and self._state(device) in (S.SENT, S.DOWNLOADING, S.OFFLINE):
            self._set(device, S.TRAINING)

    def reported(self, device: str, round: int, ok: bool, reason: str = "") -> None:
        if round == self.round:
            self._set(device, S.REPORTED if ok else S.FAILED, detail=reason)

    def presence(self, device: str, online: bool, why: str = "") -> None:
        state = self._state(device)
        if state is None or state in _FINAL:
            return
        if not online:
            self._set(device, S.OFFLINE, detail=why)
        elif state == S.OFFLINE:     # back: its instruction waits in its session, or it answers nothing
            self._set(device, S.SENT)

    # ------------------------------------------------------------------------------------ reading
    def snapshot(self) -> dict:
        """The round, its deadline and each device's state, as the status file stores them."""
        with self._lock:
            return {"round": self.round, "deadline": self.deadline,
                    "devices": {d: asdict(a) for d, a in sorted(self._devices.items())}}

    def _state(self, device: str) -> Optional[DeviceState]:
        with self._lock:
            entry = self._devices.get(device)
            return entry.state if entry else None

    def _set(self, device: str, state: DeviceState, detail: str = "", round: Optional[int] = None) -> None:
        with self._lock:
            if round is not None and round != self.round:
                return
            entry = self._devices.get(device)
            if entry is not None and entry.state == state and entry.detail == detail:
                return
            now = self.clock()
            kept = entry.bytes if entry is not None and state != S.SENT else 0
            self._devices[device] = DeviceActivity(state, now, kept, detail)
            change = Change(now, self.round, device, state, detail)
        for listener in self._listeners:
            listener(change)
