"""The coordinator's side of chunked artifact delivery.

An artifact is *offered* to a device (it may fetch only what it was offered); the device asks for it
on its `up/ack` topic with the chunks it still lacks, and gets the chunk manifest (if it has none) and
then at most `window` chunks in flight, each sent when an earlier one is acknowledged. A `bad` chunk
(sha256 mismatch) is sent again. A `want` with `resend` (a new fetch, a reconnect, a long silence)
restarts the transfer from what the device says it holds; one without (a short silence) only tops up
the window, so chunks that are merely slow on a thin link are not sent twice. Runs on the wire's
receive thread.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from edgefl.errors import ArtifactError, TransportError
from edgefl.transport import envelopes, topics
from edgefl.transport.chunks import CHUNK_SIZE, WINDOW, ChunkManifest, Data, describe, read_range
from edgefl.transport.wire import Wire, log
from edgefl.units import format_bytes

_TOPIC_ROOM = 1024        # bytes of a chunk packet that are not payload (topic, header), device ids included


@dataclass
class _Transfer:
    manifest: ChunkManifest
    data: Data
    queue: deque
    outstanding: set = field(default_factory=set)


class ArtifactServer:
    def __init__(self, wire: Wire, chunk_size: int = CHUNK_SIZE, window: int = WINDOW):
        if wire.max_packet_size < 4 * _TOPIC_ROOM:
            raise TransportError(f"the broker's max_packet_size ({format_bytes(wire.max_packet_size)}) is too small "
                                 f"to carry artifacts; allow at least {format_bytes(4 * _TOPIC_ROOM)}")
        self.wire, self.window = wire, window
        self.chunk_size = min(chunk_size, wire.max_packet_size - _TOPIC_ROOM)
        self.chunks_sent = self.chunks_resent = 0
        self._lock = threading.RLock()
        self._data: dict[str, Data] = {}
        self._offers: dict[str, set[str]] = {}                 # device -> artifact ids it may fetch
        self._slots: dict[tuple[str, str], str] = {}           # (device, slot) -> the artifact in it
        self._manifests: dict[tuple[str, int], ChunkManifest] = {}
        self._described: dict[tuple, ChunkManifest] = {}       # (path, size, mtime) -> manifest
        self._transfers: dict[tuple[str, str], _Transfer] = {}

    def offer(self, device: str, data: Data, slot: Optional[str] = None) -> str:
        """Let `device` fetch `data` (a file or bytes); returns its id. An offer in a `slot` replaces the
        device's previous one there (e.g. the weights of the previous round)."""
        manifest = self._describe(data)
        with self._lock:
            self._data[manifest.id] = data
            self._manifests[(manifest.id, manifest.chunk_size)] = manifest
            self._offers.setdefault(device, set()).add(manifest.id)
            if slot is not None:
                old = self._slots.get((device, slot))
                self._slots[(device, slot)] = manifest.id
                if old is not None and old != manifest.id:
                    self._withdraw(device, old)
        return manifest.id

    def _describe(self, data: Data) -> ChunkManifest:
        if not isinstance(data, Path):
            return describe(data, self.chunk_size)
        try:
            st = data.stat()
            key = (str(data.resolve()), st.st_size, st.st_mtime_ns, self.chunk_size)
            if key not in self._described:
                self._described[key] = describe(data, self.chunk_size)
        except OSError as exc:
            raise ArtifactError(f"{data}: cannot read it to ship it ({exc.strerror or exc})") from None
        return self._described[key]

    def _withdraw(self, device: str, artifact: str) -> None:
        self._offers.get(device, set()).discard(artifact)
        self._transfers.pop((device, artifact), None)
        if not any(artifact in offered for offered in self._offers.values()):
            self._data.pop(artifact, None)
            self._manifests = {k: m for k, m in self._manifests.items() if k[0] != artifact}

    def offered(self, device: str, artifact: str) -> bool:
        with self._lock:
            return artifact in self._offers.get(device, ())

    @property
    def active_transfers(self) -> int:
        return len(self._transfers)

    # ------------------------------------------------------------------------ device messages
    def handle(self, device: str, payload: bytes) -> int:
        """Act on a device's flow message; returns the bytes of the chunk it acknowledged (0 for anything else)."""
        d = envelopes.loads(payload, f"{device}: artifact flow message")
        with self._lock:
            if "want" in d:
                self._want(device, str(d["want"]), d.get("chunk_size"), d.get("missing"), d.get("resend", True))
            elif "got" in d or "bad" in d:
                artifact = str(d.get("got") or d.get("bad"))
                transfer = self._transfers.get((device, artifact))
                seq = d.get("seq")
                if transfer is None or seq not in transfer.outstanding:
                    return 0                 # a late or repeated acknowledgement
                if "got" in d:
                    transfer.outstanding.discard(seq)
                    self._pump(device, transfer)
                    start, end = transfer.manifest.bounds(seq)
                    return end - start
                self.chunks_resent += 1
                self._send_chunk(device, transfer, seq)
        return 0

    def _want(self, device: str, artifact: str, chunk_size, missing, resend: bool) -> None:
        if not topics.is_sha256(artifact):
            log.warning("%s asked for %r, which is not an artifact id", device, artifact[:80])
            return
        if artifact not in self._offers.get(device, ()):
            self.wire.publish(topics.artifact_manifest(device, artifact), envelopes.refusal(
                artifact, "not offered to this device (not part of its current round)"))
            return
        size = chunk_size if isinstance(chunk_size, int) and chunk_size > 0 else self.chunk_size
        manifest = self._manifests.get((artifact, size))
        if manifest is None:
            if size + _TOPIC_ROOM > self.wire.max_packet_size:   # the device resumes from a larger-chunked fetch
                self.wire.publish(topics.artifact_manifest(device, artifact), envelopes.refusal(
                    artifact, f"chunks of {format_bytes(size)} no longer fit the broker's packets", restart=True))
                return
            manifest = self._manifests[(artifact, size)] = describe(self._data[artifact], size)
        if missing is None:
            self.wire.publish(topics.artifact_manifest(device, artifact), envelopes.dumps(manifest.to_json()))
            missing = range(manifest.count)
        seqs = sorted({s for s in missing if isinstance(s, int) and 0 <= s < manifest.count})
        transfer = self._transfers.get((device, artifact))
        if resend or transfer is None or transfer.manifest != manifest:
            transfer = self._transfers[(device, artifact)] = _Transfer(manifest, self._data[artifact], deque(seqs))
        else:
            pending = transfer.outstanding | set(transfer.queue)
            transfer.queue.extend(s for s in seqs if s not in pending)
        self._pump(device, transfer)

    def _pump(self, device: str, transfer: _Transfer) -> None:
        while len(transfer.outstanding) < self.window and transfer.queue:
            seq = transfer.queue.popleft()
            transfer.outstanding.add(seq)
            self._send_chunk(device, transfer, seq)
        if not transfer.outstanding and not transfer.queue:
            self._transfers.pop((device, transfer.manifest.id), None)

    def _send_chunk(self, device: str, transfer: _Transfer, seq: int) -> None:
        m = transfer.manifest
        try:
            payload = read_range(transfer.data, *m.bounds(seq))
        except OSError as exc:
            log.error("artifact %s for %s: cannot read chunk %d (%s)", m.id[:12], device, seq, exc)
            self._transfers.pop((device, m.id), None)
            self.wire.publish(topics.artifact_manifest(device, m.id), envelopes.refusal(
                m.id, f"the coordinator cannot read it ({exc.strerror or exc})"))
            return
        self.wire.publish(topics.artifact_chunk(device, m.id, seq), payload)
        self.chunks_sent += 1
