"""A device's end of the protocol, over any Wire (MQTT: `MqttLink`; in-process: `InMemoryTransport.connect`).

    link.announce({"ram_bytes": ..., "runtime": "ort"})      # retained presence; the will says offline
    job = link.next_instruction(timeout_s=60)                # an Assignment, or None
    weights = link.weights(job)                              # {global name: array}, fetched and verified
    prefix = link.fetch(job.artifacts["prefix"])             # a verified file from the sha256 cache
    link.report(report)                                      # tensors as one flat float32 buffer, chunked

Artifacts come through `edgefl.device_runtime.fetch` (the cache, the coordinator, the group's topics). A
report is an upload named by this device and kept in its `outbox` until the coordinator's receipt: sent again
when the connection comes back and when no receipt comes in time (`edgefl.device_runtime.outbox`). The
coordinator announces the round in progress (`broadcast/round`); work of a round that is over (a newer
round began, or it closed) is dropped: a fetch for it ends at once (`FetchEnded`), `superseded` tells the
agent, and its uploads are forgotten. `stop` ends whatever waits (SIGTERM: the agent exits promptly).
Bytes are counted as they arrive: a report carries what its round downloaded (payload and MQTT framing).
One thread uses a link at a time; messages are received on the wire's thread.
"""
from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from edgefl import topics
from edgefl.device_runtime.cache import ArtifactCache
from edgefl.device_runtime.fetch import Fetcher, FetchStats
from edgefl.device_runtime.outbox import Outbox, Upload
from edgefl.errors import ArtifactError, ReportRejected, TransportError
from edgefl.manifest import TensorEntry
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import CHUNK_SIZE
from edgefl.protocol.envelopes import Assignment, Unreadable
from edgefl.protocol.tensors import pack, unpack
from edgefl.protocol.wire import Traffic, Wire, log

_CLOSED, _STOP = "closed", "stop"


class DeviceLink:
    def __init__(self, wire: Wire, device_id: str, cache_dir: str | Path, *, stall_s: float = 5.0,
                 resend_after_s: float = 60.0, group_wait_s: Optional[float] = None, receipt_s: float = 30.0,
                 cache_budget_bytes: Optional[int] = None):
        """`stall_s`, `resend_after_s`, `group_wait_s`: a fetch's patience (edgefl.device_runtime.fetch);
        `receipt_s`: how long an upload waits for its receipt before it is sent again (doubling after);
        `cache_budget_bytes`: what the artifact cache may hold beyond the current round's set."""
        self.device_id = topics.check_device_id(device_id)
        self.wire, self.cache = wire, ArtifactCache(cache_dir, cache_budget_bytes)
        self.fetcher = Fetcher(wire, self.device_id, self.cache, self._why_stop, stall_s=stall_s,
                               resend_after_s=resend_after_s, group_wait_s=group_wait_s)
        self.outbox = Outbox(self.device_id, self._send, receipt_s=receipt_s)
        self.round: Optional[tuple[int, bool]] = None        # the coordinator's last word: (round, open)
        self._assignments: queue.Queue = queue.Queue()
        self._marks: dict[int, Traffic] = {}          # round -> bytes received before its instruction
        self._working = 0                             # the round of the instruction being worked on
        self._newest = 0                              # the newest round begun: its notice or instruction
        self._profile: Optional[dict] = None
        self._closed = self._stopping = False
        self._lock = threading.Lock()
        wire.on_message(self._on_message)
        wire.on_reconnect(self._on_reconnect)
        wire.subscribe(topics.device_filters(device_id))

    @property
    def stats(self) -> FetchStats:
        return self.fetcher.stats

    # ------------------------------------------------------------------------------ presence
    def announce(self, profile: Mapping[str, Any]) -> None:
        """Tell the coordinator this device is online and what it offers (retained; renewed on reconnect)."""
        self._profile = dict(profile)
        self.wire.publish(topics.presence(self.device_id), envelopes.presence(True, self.device_id, self._profile),
                          retain=True)

    def _on_reconnect(self) -> None:
        if self._profile is not None:   # the will marked this device offline meanwhile
            self.announce(self._profile)
        self.outbox.resend(due_only=False)  # a restarted broker may have lost them
        self.fetcher.wake(reconnected=True)

    # ---------------------------------------------------------------------------- instructions
    def next_instruction(self, timeout_s: Optional[float] = None) -> Optional[Assignment | Unreadable]:
        """The next instruction (in arrival order), or None if none comes within `timeout_s` (or the link
        stops). Uploads waiting past their time for a receipt are sent again first."""
        self._check_open()
        self.outbox.resend()
        try:
            item = self._assignments.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if item == _CLOSED:
            raise TransportError(f"{self.device_id}: the link was closed")
        if item == _STOP:
            return None
        if isinstance(item, Assignment):
            self._working = item.instruction.round
            self.fetcher.assign(item.shared)
        return item

    def superseded(self, round: Optional[int] = None) -> Optional[str]:
        """Why work on `round` (default: the current instruction's) is over, or None while it is not (or no
        instruction is being worked on)."""
        round = self._working if round is None else round
        if not round:
            return None
        if self._newest > round:
            return f"round {self._newest} began; round {round} is over"
        if self.round is not None and (self.round[0] > round or (self.round[0] == round and not self.round[1])):
            return f"the coordinator closed round {round}"
        return None

    def answered(self, instruction: RoundInstruction) -> bool:
        """Whether this device answered `instruction` already (the coordinator, restarted, sent it again before
        the answer's receipt): then that answer goes again instead of a second training."""
        upload = self.outbox.for_round(instruction.round, instruction.config_hash)
        if upload is None:
            return False
        log.info("%s: round %d was answered already (upload %s): sending the answer again", self.device_id,
                 instruction.round, upload.name)
        self._send(upload.messages)
        return True

    def weights(self, assignment: Assignment, timeout_s: Optional[float] = None) -> dict[str, np.ndarray]:
        """The tensors the instruction starts from, by global name, each in its own dtype."""
        blob = assignment.weights
        if blob is None:
            return {}
        path = self.fetch(blob.artifact, timeout_s)
        buffer = path.read_bytes()
        path.unlink()                    # weights are used once; the cache keeps what is reused
        try:
            if len(buffer) != blob.bytes:
                raise ReportRejected(f"{len(buffer)} bytes, the instruction says {blob.bytes}")
            return unpack(buffer, blob.order)
        except ReportRejected as exc:
            raise ArtifactError(f"weights of round {assignment.instruction.round}: {exc}") from None

    def fetch(self, artifact: str, timeout_s: Optional[float] = None,
              progress: Optional[Callable[[int, int], None]] = None) -> Path:
        """The verified file of `artifact` (edgefl.device_runtime.fetch.Fetcher.fetch)."""
        self._check_open()
        return self.fetcher.fetch(artifact, timeout_s, progress)

    def fetch_artifact(self, artifact: str, timeout_s: Optional[float] = None, into: Optional[Path] = None) -> Path:
        """An exported artifact folder from its manifest's id (edgefl.device_runtime.fetch.Fetcher.fetch_artifact)."""
        self._check_open()
        return self.fetcher.fetch_artifact(artifact, timeout_s, into)

    def _why_stop(self) -> Optional[str]:
        if self._closed:
            return "the link was closed"
        if self._stopping:
            return "the device is stopping"
        return self.superseded()

    # --------------------------------------------------------------------------------- report
    def report(self, report: DeviceReport, order: Optional[Sequence[TensorEntry]] = None,
               timeout_s: float = 60.0, flat: Optional[np.ndarray] = None,
               settle: Optional[Callable[[DeviceReport], None]] = None) -> Traffic:
        """Upload a report under a name of its own: its tensors as one flat float32 buffer in `order` (the
        suffix manifest's trainable order; the mapping's order when None), in chunks, then the meta message.
        It stays in the outbox until the coordinator's receipt. Returns once the broker has acknowledged all
        of it, with what was sent.

        `flat`: the tensors already as that buffer (a device's upload file, in `order`), chunked as it is: the
        chunks are the only other copy. `settle(report)` runs once the chunks are out and acknowledged, before
        the meta is written: a device records its peak memory there, which so counts the upload's copies."""
        self._check_open()
        report.upload = report.upload or os.urandom(8).hex()
        packed = b""
        if flat is None:
            packed, order = pack(report.tensors, order)
            view = memoryview(packed)
        else:
            if order is None:
                raise ValueError("a flat upload buffer needs the order of its tensors")
            order = tuple(order)
            view = memoryview(np.ascontiguousarray(flat, "<f4")).cast("B")
        size = min(CHUNK_SIZE, self.wire.max_packet_size - 1024)
        nbytes, digest = len(view), hashlib.sha256(view).hexdigest()
        chunks = [(topics.result_chunk(self.device_id, report.round, report.upload, seq), bytes(view[start:start + size]))
                  for seq, start in enumerate(range(0, nbytes, size))]
        del view, packed        # the chunks are the copy that travels
        mark = self._marks.pop(report.round, None)
        download = self.wire.received.since(mark) if mark is not None else Traffic()
        meta_topic = topics.result_meta(self.device_id, report.round, report.upload)

        def meta() -> bytes:
            return envelopes.upload_meta(report, order, nbytes, digest, len(chunks), download.to_json())

        self.wire.check(meta_topic, len(meta()))       # refuse before any part of it is out
        before = self.wire.sent.copy()
        upload = Upload(report.round, report.upload, report.config_hash, chunks, status=str(report.status))
        self.outbox.post(upload)
        sent = self.wire.flush(timeout_s)
        if settle is not None:
            settle(report)
        upload.messages = [*chunks, (meta_topic, meta())]     # what the outbox sends again until the receipt
        self._send(upload.messages[-1:])
        if not (self.wire.flush(timeout_s) and sent):
            raise TransportError(f"{self.device_id}: the broker did not acknowledge the round-{report.round} report "
                                 f"within {timeout_s:g} s; it is sent again when the connection is back")
        return self.wire.sent.since(before)

    def _send(self, messages: list[tuple[str, bytes]]) -> None:
        if not self.wire.connected:
            return            # sent again when the connection is back (the outbox keeps it)
        try:
            for topic, payload in messages:
                self.wire.publish(topic, payload)
        except TransportError as exc:
            log.warning("%s: %s; sent again later", self.device_id, exc)

    # ----------------------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        """End what waits (an instruction, a fetch) at once; the link stays open for a clean close."""
        self._stopping = True
        self._assignments.put(_STOP)
        self.fetcher.wake()

    def close(self) -> None:
        """Say offline (if announced) and disconnect cleanly; the session stays for the next connection."""
        if self._closed:
            return
        if self._profile is not None and self.wire.connected:
            self.wire.publish(topics.presence(self.device_id),
                              envelopes.presence(False, self.device_id, reason="it stopped"), retain=True)
        self._end(self.wire.close)

    def abort(self) -> None:
        """Drop the connection as a crash would (the broker publishes the will)."""
        self._end(self.wire.abort)

    def _end(self, how: Callable[[], None]) -> None:
        self._closed = True
        how()
        self._assignments.put(_CLOSED)
        self.fetcher.wake()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"{self.device_id}: the link is closed; open a new one")

    # --------------------------------------------------------------------- receive thread
    def _on_message(self, topic: str, payload: bytes, wire_bytes: int) -> None:
        t = topics.parse(topic)
        if t is None:
            return
        if t.kind == "instr":
            self._on_instruction(payload, wire_bytes)
        elif t.kind in ("manifest", "chunk"):
            self.fetcher.deliver(t.kind, t.sha, t.seq, payload, t.group)
        elif t.kind == "receipt":
            try:
                d = envelopes.loads(payload, "receipt")
                self.outbox.receipt(str(d["upload"]), bool(d.get("taken")), str(d.get("reason", "")))
            except (TransportError, KeyError):
                log.warning("%s: an unreadable receipt: %r", self.device_id, payload[:200])
        elif topic == topics.BROADCAST_ROUND and payload:
            self._on_round(payload)

    def _on_instruction(self, payload: bytes, wire_bytes: int) -> None:
        try:
            assignment = Assignment.loads(payload)
        except TransportError as exc:
            log.warning("%s: refused an instruction: %s", self.device_id, exc)
            if (refusal := Unreadable.of(payload, str(exc))) is not None:
                self._assignments.put(refusal)   # the agent answers it with a failed report and the reason
            return
        ins = assignment.instruction
        if ins.device_id != self.device_id:
            log.warning("%s: dropped an instruction addressed to %s", self.device_id, ins.device_id)
            return
        self._marks[ins.round] = self.wire.received.since(Traffic(1, len(payload), wire_bytes))
        with self._lock:
            self._newest = max(self._newest, ins.round)
        self._assignments.put(assignment)
        self.fetcher.wake()              # a fetch of an older round's ends

    def _on_round(self, payload: bytes) -> None:
        try:
            d = envelopes.loads(payload, "round notice")
            self.round = (int(d["round"]), bool(d["open"]))
        except (TransportError, KeyError, TypeError, ValueError):
            return
        with self._lock:     # the coordinator's word counts: a new run starts its rounds again at 1
            self._newest = self.round[0]
        if not self.round[1]:
            self.outbox.closed(self.round[0])
        self.fetcher.wake()
