"""What each device has answered for each round, as the coordinator's end of the transport received it; no
wire, no threads (the endpoint calls it under its lock).

The rules of the device protocol it keeps (docs/device-protocol.md, "Reports"):

- an upload is named by its device (`DeviceReport.upload`) and taken once: the same upload again (a device
  resending after a reconnect, a broker redelivering) is a duplicate, answered with a receipt and nothing else;
- a device's first good upload of a round is its answer; a further, differently named one goes to the round
  loop beside it, which judges it;
- an upload the endpoint refused (malformed, not asked for, over its size) is the device's answer only if no
  good one comes within `grace_s`: a device's own stray or broken pieces never displace its real report;
- a device whose presence says offline while the round waits for it is dropped from the round only after
  `grace_s` without its report or its coming back: a broker that restarts sends every client's will, and the
  devices reconnect and deliver within seconds;
- an upload for a round not instructed yet (a restarted coordinator still resuming) is held, and becomes the
  device's answer when that round's instruction goes out with the config it answers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from edgefl.messages import DeviceReport, ReportStatus

EARLY_LIMIT = 64          # uploads held for rounds not instructed yet, at most: a flood of them must not grow memory
TAKEN_ROUNDS = 8          # rounds a taken upload's name is remembered after its round closed (late resends)


@dataclass
class _Round:
    answers: dict[str, DeviceReport] = field(default_factory=dict)       # device -> its first good upload
    further: list[DeviceReport] = field(default_factory=list)
    refused: dict[str, tuple[DeviceReport, float]] = field(default_factory=dict)   # device -> (upload, when)
    leaving: dict[str, tuple[float, str]] = field(default_factory=dict)   # device -> (offline since, why)


class Answers:
    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic):
        self.grace_s, self.clock = grace_s, clock
        self._rounds: dict[int, _Round] = {}
        self._taken: dict[tuple[str, str], int] = {}        # (device, upload) -> its round
        self._early: dict[tuple[str, int], DeviceReport] = {}
        self.closed = 0                                     # the last round closed

    def _round(self, round: int) -> _Round:
        return self._rounds.setdefault(round, _Round())

    def seen(self, report: DeviceReport) -> bool:
        """Whether this upload was taken already (a duplicate: receipt it again, nothing more)."""
        return bool(report.upload) and (report.device_id, report.upload) in self._taken

    def take(self, report: DeviceReport, round: int) -> bool:
        """File a complete upload of an instructed round; True when it is the device's answer (news for the
        round loop now), False when it is a further one (handed over when the round closes)."""
        if report.upload:
            self._taken[(report.device_id, report.upload)] = round
        r = self._round(round)
        device = report.device_id
        if report.status is ReportStatus.REJECTED:
            if device in r.answers or device in r.refused:
                r.further.append(report)
            else:
                r.refused[device] = (report, self.clock())
            return False
        r.leaving.pop(device, None)
        if device in r.answers:
            r.further.append(report)
            return False
        r.answers[device] = report
        if (late := r.refused.pop(device, None)) is not None:   # its refused upload goes on the record beside it
            r.further.append(late[0])
        return True

    def hold_early(self, report: DeviceReport, round: int) -> bool:
        """Hold an upload for a round not instructed yet; False when too many are held already."""
        if len(self._early) >= EARLY_LIMIT and (report.device_id, round) not in self._early:
            return False
        self._early[(report.device_id, round)] = report
        return True

    def instructed(self, device: str, round: int, config_hash: str) -> Optional[DeviceReport]:
        """The round's instruction went out: an upload held for it that answers its config becomes the
        device's answer (returned); one for another config is returned to be refused."""
        early = self._early.pop((device, round), None)
        if early is not None and early.config_hash == config_hash:
            self.take(early, round)
        return early

    def leaving(self, device: str, round: int, why: str) -> None:
        r = self._round(round)
        if device not in r.answers:
            r.leaving.setdefault(device, (self.clock(), why))

    def back(self, device: str) -> None:
        """Its presence says online again: whatever it was doing, it may still deliver."""
        for r in self._rounds.values():
            r.leaving.pop(device, None)

    def answered(self, round: int, now: Optional[float] = None) -> set[str]:
        """Devices that need not be waited for: a good upload, or a refused upload or an offline presence
        older than the grace."""
        now = self.clock() if now is None else now
        r = self._rounds.get(round)
        if r is None:
            return set()
        late = {d for d, (_, at) in r.refused.items() if now - at >= self.grace_s}
        gone = {d for d, (at, _) in r.leaving.items() if now - at >= self.grace_s}
        return set(r.answers) | late | gone

    def answers(self, round: int) -> dict[str, DeviceReport]:
        r = self._rounds.get(round)
        return dict(r.answers) if r else {}

    def next_grace_end(self, round: int) -> Optional[float]:
        """When the next refused upload or offline presence of the round outlasts the grace (monotonic)."""
        r = self._rounds.get(round)
        if r is None:
            return None
        starts = [at for _, at in r.refused.values()] + [at for at, _ in r.leaving.values()]
        return min(starts) + self.grace_s if starts else None

    def close(self, round: int, expected: Iterable[str]) -> tuple[dict[str, DeviceReport], dict[str, str], list]:
        """End `round`: (each device's answer, why each expected device without one went offline, the further
        uploads). A refused upload with no good one after it is its device's answer."""
        r = self._rounds.pop(round, _Round())
        answers = dict(r.answers)
        for device, (report, _) in r.refused.items():
            answers.setdefault(device, report)
        gone = {d: why for d, (_, why) in r.leaving.items() if d in set(expected) and d not in answers}
        self.closed = max(self.closed, round)
        self._taken = {k: v for k, v in self._taken.items() if v > round - TAKEN_ROUNDS}
        self._early = {k: v for k, v in self._early.items() if k[1] > round}
        return answers, gone, r.further

    def forget_before(self, round: int) -> list[tuple[int, list[str]]]:
        """Drop the rounds before `round` that nobody closed (reports that came too late); what was dropped."""
        old = sorted(k for k in self._rounds if k < round)
        return [(k, sorted(self._rounds.pop(k).answers)) for k in old]

