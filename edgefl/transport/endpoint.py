"""The coordinator's end of the device protocol over any Wire (MQTT or the in-process hub).

Down: each instruction goes to `down/instr` with the weights it needs as an artifact of their flat
float32 buffer (offered to that device only, replacing its previous round's), plus the ids of other
artifacts shipped to it (`ship`). Devices whose groups are known (`share_by_group`) get what their group
shares from the group's retained topics instead (`ArtifactServer`: published once per group, however many
devices fetch it; which artifacts a group shares: `edgefl.transport.group_routes`); the instruction names
those artifacts (`Assignment.shared`). What is published for a group stays retained until the group gets
something else under its name, or else until the round after the last one it was offered in has closed; the
coordinator clears it then, and when it closes (a previous run's: at the end of its first round). The round
in progress is announced on the retained `broadcast/round` (open when its first instruction goes out, closed
when it ends): devices drop work of rounds that are over.

Up: a report is its chunked tensor buffer and a meta message, named by the device (`upload`), put together
here and checked (sha256, size, tensor order) before `collect` hands it out; the bytes it took are measured
here (payload and MQTT framing) and set on the report. Each upload is answered on `down/receipt` once it is
journaled (or refused for good), and one sent again is answered again and taken once (`edgefl.transport.
answers` keeps a round's answers: a device gone offline, or whose upload was refused, is waited for a grace
before the round goes on without it). Presence: retained `presence/<id>` messages (a device's announcement, or
its last will) tell who is online with which profile. `activity` holds what this end has seen of each device
of the round in progress (`edgefl.transport.activity`).

`check_access` is a login's round trip: a probe published under `up/` where the coordinator's ACL lets it
write and read, which must come back. A broker grants every subscription and filters at delivery, so a
device's login in the coordinator's place would otherwise connect, see nobody and wait out every round.

Uploads are held only where this end asked for them: tensors for a (device, round) it sent no instruction
for (a closed round, one not started, a device not sampled) are dropped as they arrive and the upload becomes a
refused report (REJECTED, saying why), except for the round a restarted end is `resuming`: held until its
instruction goes out, up to EARLY_BYTES. An upload past its instruction's `upload_bytes` is refused at once.
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from edgefl import topics
from edgefl.errors import ArtifactError, TransportError
from edgefl.manifest import MANIFEST, PREFIX_DIR, Manifest
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import CHUNK_SIZE, WINDOW
from edgefl.protocol.envelopes import Assignment, TensorBlob
from edgefl.protocol.tensors import pack
from edgefl.protocol.wire import Wire, log
from edgefl.transport import Transport
from edgefl.transport.activity import Activity, DeviceState
from edgefl.transport.answers import Answers
from edgefl.transport.group_routes import GroupRoutes
from edgefl.transport.artifact_server import ArtifactServer
from edgefl.transport.uploads import Upload, declares_tensors, finish, rejected
from edgefl.units import format_bytes

COORDINATOR_ID = "edgefl-coordinator"
# Measured (bench/fault_soak.py): after the broker was killed or stopped (SIGTERM: every will sent) for up to
# 3 s, devices announced themselves again 3.7-4.1 s after it was back (50 of 50); paho's reconnect delay
# doubles from 1 s to 8 s, so 30 s also covers a broker that takes about 20 s to come back
GRACE_S = 30.0
EARLY_BYTES = 64 * 2**20     # tensor bytes held, at most, of uploads for rounds not instructed yet
_PROBE = "edgefl-probe-"                # check_access's probe ids: no device is called that


@dataclass(frozen=True)
class _Sent:
    upload_bytes: Optional[int]     # the most tensor bytes its upload may hold (None: no limit)
    config_hash: str
    at: float                       # time.monotonic() it was sent


class WireTransport(Transport):
    def __init__(self, wire: Wire, chunk_size: int = CHUNK_SIZE, window: int = WINDOW, grace_s: float = GRACE_S,
                 resuming: int = 0):
        """`grace_s`: how long a device whose presence went offline, or whose upload was refused, is still
        waited for; `resuming`: the round a restarted coordinator goes on with (`resuming()`), set before the
        first message of a persistent session's queue is read (module doc)."""
        self.wire = wire
        self.artifacts = ArtifactServer(wire, chunk_size, window)
        self._cond = threading.Condition()
        self._uploads: dict[tuple[str, int, str], Upload] = {}   # (device, round, upload) -> its pieces so far
        self._answers = Answers(grace_s)
        self._strays: list[DeviceReport] = []                     # refused, for no sent round: the next collect
        self._limits: dict[tuple[str, int], _Sent] = {}          # (device, round) instructed -> what was sent
        self._sent_round = self._closed_round = 0
        self._resuming = resuming
        self._presence: dict[str, dict] = {}
        self._probes: set[str] = set()                            # probe ids that came back
        self.activity = Activity()
        self.routes = GroupRoutes(self.artifacts)
        wire.on_message(self._on_message)
        wire.subscribe(topics.COORDINATOR_FILTERS)

    def check_access(self, timeout_s: float = 10.0) -> None:
        """A probe through the broker and back: TransportError with the reason when this login may not write
        under a device's `up/` or does not receive what is written there."""
        probe = f"{_PROBE}{os.urandom(4).hex()}"
        refusal = self.wire.confirm(topics.hello(probe), envelopes.dumps({"probe": probe}), timeout_s)
        if refusal is not None:
            raise TransportError(f"the broker refused its publish on {topics.hello(probe)} ({refusal}), as it "
                                 "refuses a device writing under another device's topics")
        with self._cond:
            if not self._cond.wait_for(lambda: probe in self._probes, timeout_s):
                raise TransportError(f"its probe on {topics.hello(probe)} did not come back within {timeout_s:g} s: "
                                     "this login may not read what devices send")
            self._probes.discard(probe)

    def share_by_group(self, group_of: Mapping[str, str]) -> None:
        """Device -> its group (as the fleet file and the broker's ACL have them): what a group's devices get
        alike travels once per group, on the group's topics."""
        self.routes.groups({topics.check_device_id(d): topics.check_group(g) for d, g in group_of.items()})

    def ship(self, device_id: str, data: str | Path | bytes, name: Optional[str] = None) -> str:
        """Offer an artifact (a file or bytes) to a device; returns its id (sha256) for `send(artifacts=...)`.
        The device fetches it only if its cache lacks it. `name`: what it is among what the device gets each
        round (a file's name in its set): for a device in a group, the group may share it under that name."""
        device = topics.check_device_id(device_id)
        data = Path(data) if isinstance(data, str) else data
        described = self.artifacts.describe(data)
        group = self.routes.route(device, name, described.id, self._closed_round + 1) if name is not None else None
        artifact = self.artifacts.offer(device, data, group=group, round=self._closed_round + 1, described=described)
        if group is not None:
            self.routes.shared(device, artifact, group, name)
        return artifact

    def ship_artifact(self, device_id: str, folder: str | Path) -> str:
        """Offer an exported artifact folder: manifest.json, every file it names and, for a suffix, its prefix
        (in `prefix/`). Returns the manifest file's id; the device rebuilds the folder with
        `DeviceLink.fetch_artifact`, fetching only files its cache lacks (a frozen prefix once)."""
        return self._ship_set(device_id, Path(folder), "")

    def _ship_set(self, device_id: str, folder: Path, under: str) -> str:
        manifest = Manifest.read(folder, verify=False)
        for f in manifest.files:
            if self.ship(device_id, folder / f.name, under + f.name) != f.sha256:   # hashing it to ship it checks it
                raise ArtifactError(f"{folder / f.name}: sha256 does not match {folder / MANIFEST}; re-export")
        prefix = manifest.prefix_id and self._ship_set(device_id, folder / PREFIX_DIR, f"{under}{PREFIX_DIR}/")
        if prefix != manifest.prefix_id:
            raise ArtifactError(f"{folder / PREFIX_DIR / MANIFEST}: not the prefix {folder / MANIFEST} names; re-export")
        return self.ship(device_id, folder / MANIFEST, under + MANIFEST)

    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        device = topics.check_device_id(instruction.device_id)
        artifacts = dict(artifacts or {})
        if unshipped := [role for role, a in artifacts.items() if not self.artifacts.offered(device, a)]:
            raise ValueError(f"{device}: artifacts {unshipped} were not shipped to it; ship() them first")
        blob = None
        if weights:
            buffer, order = pack(weights)
            described = self.artifacts.describe(buffer)
            group = self.routes.route(device, "weights", described.id, self._closed_round + 1)
            blob = TensorBlob(self.artifacts.offer(device, buffer, slot="weights", group=group,
                                                   round=self._closed_round + 1, described=described),
                              len(buffer), order)
            if group is not None:
                self.routes.shared(device, blob.artifact, group, "weights")
        shared = self.routes.take_shared(device)
        if instruction.round > self._sent_round:     # devices drop work of older rounds (device protocol)
            self.wire.publish(topics.BROADCAST_ROUND, envelopes.round_notice(instruction.round, True), retain=True)
        with self._cond:        # before the instruction is out: a fast device's answer must find it
            self._limits[(device, instruction.round)] = _Sent(instruction.option("upload_bytes"),
                                                              instruction.config_hash, time.monotonic())
            self._sent_round = max(self._sent_round, instruction.round)
            early = self._answers.instructed(device, instruction.round, instruction.config_hash)
        if early is not None and early.config_hash != instruction.config_hash:
            self._receipt(early, False, f"it answers config {early.config_hash}, round {instruction.round} "
                                        f"trains {instruction.config_hash}")
        self.activity.sent(device, instruction.round)
        self.wire.publish(topics.instruction(device), Assignment(instruction, blob, artifacts, shared).dumps())

    def collect(self, round: int, expected: Iterable[str], timeout_s: Optional[float],
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        expected = set(expected)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.activity.waiting(round, expected, None if timeout_s is None else time.time() + timeout_s)
        seen: set[str] = set()
        with self._cond:     # offline already when the round starts waiting
            for device in expected:
                if (device, round) in self._limits and self._offline(device):
                    self._answers.leaving(device, round, self._offline_reason(device, round))

        def wake_in() -> Optional[float]:
            ends = [t for t in (deadline, self._answers.next_grace_end(round)) if t is not None]
            return max(0.0, min(ends) - time.monotonic()) if ends else None

        while True:
            with self._cond:    # woken by news, or when a grace or the deadline ends
                if not (expected <= self._answers.answered(round) or self._answers.answers(round).keys() - seen):
                    self._cond.wait(wake_in())
                done = self._answers.answers(round)
                finished = expected <= self._answers.answered(round)
            for device in sorted(done.keys() - seen):
                seen.add(device)
                if on_report is not None:    # outside the lock: a journal write must not stall the receive thread
                    on_report(done[device])
                self._receipt(done[device], True)    # journaled: the device may forget it
            if finished or expected <= seen or (deadline is not None and time.monotonic() >= deadline):
                break
        return self._close(round, expected)

    def _close(self, round: int, expected: set[str]) -> list[DeviceReport]:
        with self._cond:
            reports, gone, further = self._answers.close(round, expected)
            for device, why in gone.items():    # not journaled: a restarted coordinator asks it again
                sent = self._limits[(device, round)]
                reports[device] = DeviceReport(round=round, device_id=device, config_hash=sent.config_hash,
                                               status=ReportStatus.OFFLINE, reason=why)
            further, self._strays = further + self._strays, []
            for late, devices in self._answers.forget_before(round):   # a round already closed: final
                log.warning("dropped late reports for closed round %d from %s", late, ", ".join(devices))
            self._uploads = {k: v for k, v in self._uploads.items() if k[1] > round}
            self._limits = {k: v for k, v in self._limits.items() if k[1] > round}
            self._closed_round = max(self._closed_round, round)
        for report in further:   # the round loop judges them; nothing is to be sent again
            self._receipt(report, True)
        if self.wire.connected:
            self.wire.publish(topics.BROADCAST_ROUND, envelopes.round_notice(round, False), retain=True)
        self.artifacts.retire(before_round=round)   # what this round no longer offered; kept: what it did
        return [reports[d] for d in sorted(reports)] + further

    def _receipt(self, report: DeviceReport, taken: bool, reason: str = "") -> None:
        """Tell a device its upload is held (or refused for good): it stops sending it again."""
        if report.upload and self.wire.connected:
            self.wire.publish(topics.receipt(report.device_id), envelopes.receipt(report.round, report.upload,
                                                                                  taken, reason))

    def reports_in(self, round: int) -> int:
        """Reports complete for `round` and not yet collected (a live view's counter)."""
        with self._cond:
            return len(self._answers.answers(round))

    def online(self) -> dict[str, dict]:
        """Devices whose presence says online -> the profile they announced."""
        with self._cond:
            return {d: p.get("profile", {}) for d, p in self._presence.items() if p.get("online")}

    def _offline(self, device: str) -> bool:
        """Whether the device's presence says it is gone (a device never heard of is not: emulated devices
        announce nothing)."""
        state = self._presence.get(device)
        return state is not None and not state.get("online")

    def _offline_reason(self, device: str, round: int) -> str:
        why = self._presence.get(device, {}).get("reason") or "its presence went offline"
        after = time.monotonic() - self._limits[(device, round)].at
        return f"offline: {why} {after:.0f} s after its round-{round} instruction; dropped from the round"

    def wait_online(self, devices: Iterable[str], timeout_s: float) -> dict[str, dict]:
        """Wait until all of `devices` are online (or the timeout passes); returns who is online."""
        wanted = set(devices)
        with self._cond:
            self._cond.wait_for(lambda: wanted <= {d for d, p in self._presence.items() if p.get("online")},
                                timeout_s)
        return self.online()

    def close(self) -> None:
        """Clear what this run published for groups, then disconnect."""
        if self.wire.connected:
            try:
                self.artifacts.retire(before_round=math.inf)
                self.wire.publish(topics.BROADCAST_ROUND, b"", retain=True)
            except TransportError as exc:
                log.warning("retained group artifacts left on the broker: %s", exc)
        self.wire.close()

    # --------------------------------------------------------------------- receive thread
    def _on_message(self, topic: str, payload: bytes, wire_bytes: int) -> None:
        t = topics.parse(topic)
        if t is None:
            return
        if t.kind == "ack":
            self.activity.acknowledged(t.device, self.artifacts.handle(t.device, payload))
        elif t.kind == "manifest" and t.group is not None:
            self.artifacts.found(t.group, t.sha, payload)
        elif t.kind == "presence":
            self._on_presence(t.device, payload)
        elif t.kind in ("result_meta", "result_chunk"):
            self._on_upload(t, payload, wire_bytes)
        elif t.kind == "metrics":
            self._on_metrics(t.device, payload)
        elif t.kind == "hello" and t.device.startswith(_PROBE):   # a device's own hello says nothing new
            with self._cond:
                self._probes.add(t.device)
                self._cond.notify_all()

    def _on_metrics(self, device: str, payload: bytes) -> None:
        try:
            said = envelopes.loads(payload, f"{device}: metrics")
        except TransportError:
            return     # free form: not every device says what it is doing
        state, nbytes = said.get("state"), said.get("bytes")
        if state == DeviceState.DOWNLOADING and isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes >= 0:
            self.activity.acknowledged(device, nbytes)      # a file it fetched from its group's topics
        elif isinstance(state, str):
            self.activity.progress(device, state)

    def _on_presence(self, device: str, payload: bytes) -> None:
        try:
            state = envelopes.loads(payload, f"{device}: presence") if payload else {"online": False}
        except TransportError as exc:
            log.warning("%s", exc)
            return
        with self._cond:
            self._presence[device] = state
            online = bool(state.get("online"))
            if online:
                self._answers.back(device)
            else:
                for key in [k for k in self._limits if k[0] == device and k[1] > self._closed_round]:
                    self._answers.leaving(device, key[1], self._offline_reason(device, key[1]))
            self._cond.notify_all()
        self.activity.presence(device, online, str(state.get("reason") or ""))

    def _on_upload(self, t: topics.Topic, payload: bytes, wire_bytes: int) -> None:
        key = (t.device, t.round, t.upload)
        receipt: Optional[tuple] = None
        with self._cond:
            unasked = (t.device, t.round) not in self._limits
            early = t.round == self._resuming > self._sent_round and self._early_bytes() + len(payload) <= EARLY_BYTES
            if unasked and not early and (t.kind == "result_chunk" or declares_tensors(payload)):
                if t.kind == "result_meta":   # its chunks were dropped as they came: nobody asked for them
                    report = self._refuse_unsent(t.device, t.round, t.upload, payload)
                    receipt = (False, report.reason)
            elif self._assemble(key, t, payload, wire_bytes):
                report, receipt = self._assembled(key, t.round)
        if receipt is not None:
            self._receipt(report, *receipt)

    def _early_bytes(self) -> int:      # bytes held of uploads for rounds not instructed (yet)
        return sum(up.held for (device, round, _), up in self._uploads.items() if (device, round) not in self._limits)

    def _assemble(self, key: tuple[str, int, str], t: topics.Topic, payload: bytes, wire_bytes: int) -> bool:
        """Add a piece to its upload; False for a piece already held (or of a refused upload)."""
        up = self._uploads.setdefault(key, Upload())
        if t.kind == "result_chunk":
            if up.refused or t.seq in up.chunks:
                return False                       # refused, or redelivered
            up.chunks[t.seq] = payload
            up.held += len(payload)
            limit = self._limit(t.device, t.round)
            if limit is not None and up.held > limit:
                up.refused = f"more than the {format_bytes(limit)} of tensors its instruction expects"
                up.chunks.clear()
        elif up.meta is None:
            up.meta = payload
        else:
            return False
        up.traffic.add(len(payload), wire_bytes)
        return True

    def _assembled(self, key: tuple[str, int, str], round: int) -> tuple[Optional[DeviceReport], Optional[tuple]]:
        """The upload at `key` taken if it is whole: (its report, the receipt to send now)."""
        up = self._uploads.get(key)
        report = None if up is None else finish(key[0], round, key[2], up, self._limit(key[0], round))
        if report is None:
            return None, None
        del self._uploads[key]
        return report, self._file(report, round)

    def _limit(self, device: str, round: int) -> Optional[int]:
        return sent.upload_bytes if (sent := self._limits.get((device, round))) else None

    def _file(self, report: DeviceReport, round: int) -> Optional[tuple]:
        """Take a complete upload; the receipt to send now, if any: (taken, reason)."""
        if self._answers.seen(report):           # sent again (a reconnect, a redelivery): answer, take nothing
            return (True,)
        if (report.device_id, round) not in self._limits and report.ok:   # the round resumed: held until sent
            if self._answers.hold_early(report, round):
                return None
            return (False, f"no instruction for round {round} has been sent yet")
        if self._answers.take(report, round):
            self.activity.reported(report.device_id, round, report.ok, report.reason)
        elif report.status is ReportStatus.REJECTED:
            log.warning("%s: refused an upload for round %d: %s", report.device_id, round, report.reason)
        else:
            log.warning("%s: a further report for round %d", report.device_id, round)
        self._cond.notify_all()
        return (False, report.reason) if report.status is ReportStatus.REJECTED else None

    def resuming(self, round: int) -> None:
        self._resuming = round

    def _refuse_unsent(self, device: str, round: int, upload: str, meta: bytes) -> DeviceReport:
        """A report with tensors for a (device, round) this end sent no instruction for: it goes to the next
        collect as a refused report, so the round it arrived in records it."""
        if round <= self._closed_round:
            why = f"round {round} is closed"
        elif round > self._sent_round:
            why = f"no instruction for round {round} has been sent yet"
        else:
            why = f"{device} was not sent an instruction for round {round}"
        log.warning("%s: refused a report: %s", device, why)
        report = rejected(device, round, upload, meta, why)
        self._strays.append(report)
        self._cond.notify_all()
        return report
