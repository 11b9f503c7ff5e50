"""A device's uploads kept until the coordinator's receipt (device protocol, "Reports"): delivered at least
once, taken once.

An upload is the messages of one report (its chunks, then its meta) under one name (`DeviceReport.upload`,
16 hex digits). It is sent again, whole and under the same name, when the connection comes back (a broker
that restarted may have lost it, and a persistent session does not keep what the device had not got
acknowledged yet) and when no receipt came within `receipt_s`, then twice that, up to `retry_max_s`, at most
`attempts` times. It is forgotten on its receipt (the coordinator journaled it, or refused it for good), when
its round is announced closed (nothing can take it any more), or when uploads of `keep_rounds` later rounds are
waiting (a coordinator gone for that long restarts the rounds it needs anyway).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from edgefl.protocol.wire import log


@dataclass
class Upload:
    round: int
    name: str
    config_hash: str
    messages: list[tuple[str, bytes]]      # (topic, payload): chunks, then the meta
    sent_at: float = 0.0
    attempts: int = 0
    wait_s: float = 0.0
    status: str = field(default="")         # the report's status, for the log


class Outbox:
    def __init__(self, device: str, send: Callable[[list[tuple[str, bytes]]], None], *, receipt_s: float = 30.0,
                 retry_max_s: float = 300.0, attempts: int = 10, keep_rounds: int = 4,
                 clock: Callable[[], float] = time.monotonic):
        self.device, self._send = device, send
        self.receipt_s, self.retry_max_s, self.attempts, self.keep_rounds = receipt_s, retry_max_s, attempts, keep_rounds
        self.clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[str, Upload] = {}       # name -> upload
        self.resent = 0

    def post(self, upload: Upload) -> None:
        """Send an upload and keep it until its receipt."""
        with self._lock:
            self._waiting[upload.name] = upload
            for old in sorted({u.round for u in self._waiting.values()})[:-self.keep_rounds]:
                for name in [n for n, u in self._waiting.items() if u.round == old]:
                    log.warning("%s: gave up the round-%d upload %s: no receipt while %d later rounds came",
                                self.device, old, name, self.keep_rounds)
                    del self._waiting[name]
        self._deliver(upload)

    def _deliver(self, upload: Upload) -> None:
        upload.attempts += 1
        upload.sent_at = self.clock()
        upload.wait_s = min(self.receipt_s * 2 ** (upload.attempts - 1), self.retry_max_s)
        self._send(upload.messages)

    def receipt(self, name: str, taken: bool, reason: str = "") -> Optional[Upload]:
        """The coordinator's answer for an upload: forget it. The upload it names, if still waiting."""
        with self._lock:
            upload = self._waiting.pop(name, None)
        if upload is not None and not taken:
            log.warning("%s: the coordinator refused the round-%d upload %s: %s", self.device, upload.round, name,
                        reason or "no reason given")
        return upload

    def closed(self, round: int) -> None:
        """Round `round` (and so every earlier one) is over: no upload of it can be taken any more."""
        with self._lock:
            for name in [n for n, u in self._waiting.items() if u.round <= round]:
                del self._waiting[name]

    def for_round(self, round: int, config_hash: str) -> Optional[Upload]:
        """The upload waiting for `round` that answers `config_hash` (an instruction sent again after the
        coordinator restarted: the answer is the one already made, not a second training)."""
        with self._lock:
            return next((u for u in self._waiting.values() if u.round == round and u.config_hash == config_hash),
                        None)

    def resend(self, due_only: bool = True) -> int:
        """Send again what waits for a receipt: all of it (the connection came back), or what waited past its
        time; an upload out of attempts is dropped. How many were sent."""
        now = self.clock()
        with self._lock:
            due = [u for u in self._waiting.values() if not due_only or now - u.sent_at >= u.wait_s]
            for u in [u for u in due if u.attempts >= self.attempts]:
                log.warning("%s: gave up the round-%d upload %s after %d sends without a receipt", self.device,
                            u.round, u.name, u.attempts)
                del self._waiting[u.name]
            due = [u for u in due if u.name in self._waiting]
        for upload in sorted(due, key=lambda u: (u.round, u.sent_at)):
            self._deliver(upload)
        self.resent += len(due)
        return len(due)

    def waiting(self) -> list[Upload]:
        with self._lock:
            return sorted(self._waiting.values(), key=lambda u: (u.round, u.sent_at))
