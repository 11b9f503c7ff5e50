"""The coordinator's end of the device protocol over any Wire (MQTT or the in-process hub).

Down: each instruction goes to `down/instr` with the weights it needs as an artifact of their flat
float32 buffer (offered to that device only, replacing its previous round's), plus the ids of other
artifacts shipped to it (`ship`). Devices whose groups are known (`share_by_group`) get what their group
shares from the group's retained topics instead (`ArtifactServer`: published once per group, however many
devices fetch it); the instruction names those artifacts (`Assignment.shared`). What a group shares is
decided by content, per name: the weights, and each file of an artifact set by its name in the set. Under a
name, a round's first device of the group gets its bytes through the group; as long as the group's next
devices get the same bytes they do too, and once one gets other bytes (Federated Dropout's random slices,
a TOA-shrunk prefix) the rest of the round gets theirs on their own topics, as does the next round if this
one differed. What is published for a group stays retained until the group gets something else under its
name (the next round's weights), or else until the round after the last one it was offered in has closed;
the coordinator clears it then, and when it closes (a previous run's: at the end of its first round).

Up: a report is its chunked tensor buffer and a meta message, put together here and checked (sha256,
size, tensor order) before `collect` hands it out; the bytes it took are measured here (payload and MQTT
framing) and set on the report. Presence: retained `presence/<id>`
messages (a device's announcement, or its last will) tell who is online with which profile. A device whose
presence goes offline while this end waits for its report is dropped from the round at once: the round
closes as soon as every other device has answered, and the device's answer is an OFFLINE report saying
why (a report that still comes before the round closes is taken instead). `activity` holds
what this end has seen of each device of the round in progress (`edgefl.transport.activity`).

`check_access` is a login's round trip: a probe published under `up/` where the coordinator's ACL lets it
write and read, which must come back. A broker grants every subscription and filters at delivery, so a
device's login in the coordinator's place would otherwise connect, see nobody and wait out every round.

Uploads are held only where this end asked for them: tensors for a (device, round) it sent no instruction
for (a closed round, one not started, a device not sampled) are dropped as they arrive and the upload
becomes a refused report; an upload past the instruction's `upload_bytes` is refused as soon as it is
past, before the rest arrives. A refused upload is a REJECTED report saying why. A device's first report of a round is its answer; any further one (a replay, a second
try) goes to the coordinator beside it, which judges it, instead of replacing it.
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
from edgefl.transport.artifact_server import ArtifactServer
from edgefl.transport.uploads import Upload, declares_tensors, finish, rejected
from edgefl.units import format_bytes

COORDINATOR_ID = "edgefl-coordinator"
_PROBE = "edgefl-probe-"                # check_access's probe ids: no device is called that


@dataclass(frozen=True)
class _Sent:
    upload_bytes: Optional[int]     # the most tensor bytes its upload may hold (None: no limit)
    config_hash: str
    at: float                       # time.monotonic() it was sent


@dataclass
class _Route:
    """What a group's devices got under one name in a round."""
    round: int
    first: str                   # the artifact the round's first device got
    shared: bool                 # the round's devices get it through the group's topics
    alike: bool = True           # every device so far got `first`


class WireTransport(Transport):
    def __init__(self, wire: Wire, chunk_size: int = CHUNK_SIZE, window: int = WINDOW):
        self.wire = wire
        self.artifacts = ArtifactServer(wire, chunk_size, window)
        self._cond = threading.Condition()
        self._uploads: dict[tuple[str, int], Upload] = {}
        self._done: dict[int, dict[str, DeviceReport]] = {}      # round -> device -> its first report
        self._further: dict[int, list[DeviceReport]] = {}         # round -> later reports of the same devices
        self._strays: list[DeviceReport] = []                     # refused, for no sent round: the next collect
        self._limits: dict[tuple[str, int], _Sent] = {}          # (device, round) instructed -> what was sent
        self._gone: dict[tuple[str, int], str] = {}               # (device, round) -> why it is offline
        self._sent_round = self._closed_round = 0
        self._presence: dict[str, dict] = {}
        self._probes: set[str] = set()                            # probe ids that came back
        self.activity = Activity()
        self._group_of: dict[str, str] = {}                       # device -> group (share_by_group)
        self._routes: dict[tuple[str, str], _Route] = {}          # (group, name) -> what its devices get
        self._shared: dict[str, dict[str, str]] = {}              # device -> artifact -> group, until its send
        self._named: dict[tuple[str, str], str] = {}              # (group, name) -> what the group gets now
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

    # ------------------------------------------------------------------------------ down
    def share_by_group(self, group_of: Mapping[str, str]) -> None:
        """Device -> its group (as the fleet file and the broker's ACL have them): what a group's devices get
        alike travels once per group, on the group's topics."""
        self._group_of = {topics.check_device_id(d): topics.check_group(g) for d, g in group_of.items()}

    def ship(self, device_id: str, data: str | Path | bytes, name: Optional[str] = None) -> str:
        """Offer an artifact (a file or bytes) to a device; returns its id (sha256) for `send(artifacts=...)`.
        The device fetches it only if its cache lacks it. `name`: what it is among what the device gets each
        round (a file's name in its set): for a device in a group, the group may share it under that name."""
        device = topics.check_device_id(device_id)
        data = Path(data) if isinstance(data, str) else data
        described = self.artifacts.describe(data)
        group = self._route(device, name, described.id) if name is not None else None
        artifact = self.artifacts.offer(device, data, group=group, round=self._closed_round + 1, described=described)
        if group is not None:
            self._shared.setdefault(device, {})[artifact] = group
            self._replace(group, name, artifact)
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

    def _replace(self, group: str, name: str, artifact: str) -> None:
        """`artifact` is what the group's devices now get under `name`: what they got before under that name
        (an earlier round's weights) is cleared from the broker at once, unless another name still has it."""
        old, self._named[(group, name)] = self._named.get((group, name)), artifact
        if old is not None and old != artifact and (group, old) not in {(g, a) for (g, _), a in self._named.items()}:
            self.artifacts.retire(math.inf, only=(group, old))

    def _route(self, device: str, name: str, artifact: str) -> Optional[str]:
        """The group whose topics carry `artifact` to `device` under `name`, or None: its own topics."""
        group = self._group_of.get(device)
        if group is None:
            return None
        round, key = self._closed_round + 1, (group, name)
        route = self._routes.get(key)
        if route is None or route.round != round:   # a round starts shared unless the last one differed
            route = self._routes[key] = _Route(round, artifact, shared=route is None or route.alike)
        elif artifact != route.first:
            route.alike = route.shared = False
        return group if route.shared else None

    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        device = topics.check_device_id(instruction.device_id)
        artifacts = dict(artifacts or {})
        if unshipped := [role for role, a in artifacts.items() if not self.artifacts.offered(device, a)]:
            raise ValueError(f"{device}: artifacts {unshipped} were not shipped to it; ship() them first")
        shared = self._shared.pop(device, {})
        blob = None
        if weights:
            buffer, order = pack(weights)
            described = self.artifacts.describe(buffer)
            group = self._route(device, "weights", described.id)
            blob = TensorBlob(self.artifacts.offer(device, buffer, slot="weights", group=group,
                                                   round=self._closed_round + 1, described=described),
                              len(buffer), order)
            if group is not None:
                shared[blob.artifact] = group
                self._replace(group, "weights", blob.artifact)
        with self._cond:        # before the instruction is out: a fast device's answer must find it
            self._limits[(device, instruction.round)] = _Sent(instruction.option("upload_bytes"),
                                                              instruction.config_hash, time.monotonic())
            self._gone.pop((device, instruction.round), None)
            self._sent_round = max(self._sent_round, instruction.round)
        self.activity.sent(device, instruction.round)
        self.wire.publish(topics.instruction(device), Assignment(instruction, blob, artifacts, shared).dumps())

    # -------------------------------------------------------------------------------- up
    def collect(self, round: int, expected: Iterable[str], timeout_s: Optional[float],
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        expected = set(expected)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.activity.waiting(round, expected, None if timeout_s is None else time.time() + timeout_s)
        seen: set[str] = set()
        with self._cond:     # offline already when the round starts waiting
            for device in expected:
                if (device, round) in self._limits and self._offline(device):
                    self._gone.setdefault((device, round), self._offline_reason(device, round))

        def answered() -> set[str]:
            return set(self._done.get(round, {})) | {d for d in expected if (d, round) in self._gone}

        def news() -> bool:
            done = self._done.get(round, {}).keys()
            return expected <= answered() or bool(done - seen)

        while True:
            with self._cond:
                self._cond.wait_for(news, None if deadline is None else max(0.0, deadline - time.monotonic()))
                done = dict(self._done.get(round, {}))
                finished = expected <= answered()
            for device in sorted(done.keys() - seen):
                seen.add(device)
                if on_report is not None:    # outside the lock: a journal write must not stall the receive thread
                    on_report(done[device])
            if finished or expected <= seen or (deadline is not None and time.monotonic() >= deadline):
                break
        with self._cond:
            reports = self._done.pop(round, {})
            for device in sorted(expected - reports.keys()):
                if (device, round) in self._gone:    # not journaled: a restarted coordinator asks it again
                    sent = self._limits[(device, round)]
                    reports[device] = DeviceReport(round=round, device_id=device, config_hash=sent.config_hash,
                                                   status=ReportStatus.OFFLINE, reason=self._gone[(device, round)])
            further, self._strays = self._further.pop(round, []) + self._strays, []
            for late, devices in self._done.items():
                if late < round:    # a round already closed: its aggregate is final
                    log.warning("dropped late reports for closed round %d from %s", late, ", ".join(sorted(devices)))
            self._done = {r: v for r, v in self._done.items() if r > round}
            self._further = {r: v for r, v in self._further.items() if r > round}
            self._uploads = {k: v for k, v in self._uploads.items() if k[1] > round}
            self._limits = {k: v for k, v in self._limits.items() if k[1] > round}
            self._gone = {k: v for k, v in self._gone.items() if k[1] > round}
            self._closed_round = max(self._closed_round, round)
        self.artifacts.retire(before_round=round)   # what this round no longer offered; kept: what it did
        return [reports[d] for d in sorted(reports)] + further

    def reports_in(self, round: int) -> int:
        """Reports complete for `round` and not yet collected (a live view's counter)."""
        with self._cond:
            return len(self._done.get(round, {}))

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
            if not online:
                for key in [k for k in self._limits if k[0] == device and k[1] > self._closed_round
                            and device not in self._done.get(k[1], {})]:
                    self._gone.setdefault(key, self._offline_reason(device, key[1]))
            self._cond.notify_all()
        self.activity.presence(device, online, str(state.get("reason") or ""))

    def _on_upload(self, t: topics.Topic, payload: bytes, wire_bytes: int) -> None:
        key = (t.device, t.round)
        with self._cond:
            if key not in self._limits and (t.kind == "result_chunk" or declares_tensors(payload)):
                if t.kind == "result_meta":   # its chunks were dropped as they came: nobody asked for them
                    self._refuse_unsent(t.device, t.round, payload)
                return
            up = self._uploads.setdefault(key, Upload())
            if t.kind == "result_chunk":
                if up.refused or t.seq in up.chunks:
                    return                       # refused, or redelivered
                up.chunks[t.seq] = payload
                up.held += len(payload)
                limit = self._limits[key].upload_bytes
                if limit is not None and up.held > limit:
                    up.refused = f"more than the {format_bytes(limit)} of tensors its instruction expects"
                    up.chunks.clear()
            elif up.meta is None:
                up.meta = payload
            else:
                return
            up.traffic.add(len(payload), wire_bytes)
            sent = self._limits.get(key)
            report = finish(t.device, t.round, up, sent.upload_bytes if sent else None)
            if report is not None:
                del self._uploads[key]
                self._file(report, t.round)

    def _file(self, report: DeviceReport, round: int) -> None:
        answers = self._done.setdefault(round, {})
        if report.device_id in answers:   # never replaces the first: the coordinator judges both
            log.warning("%s: a further report for round %d", report.device_id, round)
            self._further.setdefault(round, []).append(report)
        else:
            answers[report.device_id] = report
            self.activity.reported(report.device_id, round, report.ok, report.reason)
        self._cond.notify_all()

    def _refuse_unsent(self, device: str, round: int, meta: bytes) -> None:
        """A report with tensors for a (device, round) this end sent no instruction for: it goes to the next
        collect as a refused report, so the round it arrived in records it."""
        if round <= self._closed_round:
            why = f"round {round} is closed"
        elif round > self._sent_round:
            why = f"no instruction for round {round} has been sent yet"
        else:
            why = f"{device} was not sent an instruction for round {round}"
        log.warning("%s: refused a report: %s", device, why)
        self._strays.append(rejected(device, round, meta, why))
        self._cond.notify_all()
