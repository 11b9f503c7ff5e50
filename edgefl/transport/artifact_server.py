"""The coordinator's side of chunked artifact delivery.

An artifact is *offered* to a device (it may fetch only what it was offered); the device asks for it
on its `up/ack` topic with the chunks it still lacks, and gets the chunk manifest (if it has none) and
then at most `window` chunks in flight, each sent when an earlier one is acknowledged. A `bad` chunk
(sha256 mismatch) is sent again. A `want` with `resend` (a new fetch, a reconnect, a long silence)
restarts the transfer from what the device says it holds; one without (a short silence) only tops up
the window, so chunks that are merely slow on a thin link are not sent twice. Runs on the wire's
receive thread.

What a group's devices all get alike is offered with its `group`: besides the offer to the device (which
stays, so a device that misses some of it asks for the rest as above), it is published once on the group's
topics as retained messages, its chunks first and its chunk manifest last (a device that sees the manifest
finds every chunk), with a flush every `window` chunks so the wire never holds more than that. Devices of the
group read it from the broker however late they come or often they resume; nothing is sent per device.
`retire(before_round)` clears (empty retained payloads) what was last offered before that round, and what a
previous run left on the broker (`found`); `retire(..., only=(group, id))` one publication at once. After a
reconnect everything still published goes out again (in a thread of its own: the wire's thread must stay free
for the acknowledgements): a broker that was killed keeps only the retained messages it had saved to disk,
and a group's devices would otherwise wait for what it lost until their fetch gives up on the group's topics.
"""
from __future__ import annotations

import hashlib
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from edgefl import topics
from edgefl.errors import ArtifactError, TransportError
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import CHUNK_SIZE, WINDOW, ChunkManifest, Data, describe, read_range
from edgefl.protocol.wire import Wire, log
from edgefl.units import format_bytes

_TOPIC_ROOM = 1024        # bytes of a chunk packet that are not payload (topic, header), device ids included
_FLUSH_S = 60             # seconds a group publication waits for the broker to take a window of chunks


@dataclass
class _Publication:
    manifest: ChunkManifest
    round: int                   # the last round it was offered in


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
        self._holders: dict[str, int] = {}                     # artifact id -> devices it is offered to
        self._slots: dict[tuple[str, str], str] = {}           # (device, slot) -> the artifact in it
        self._manifests: dict[tuple[str, int], ChunkManifest] = {}
        self._described: dict[tuple, ChunkManifest] = {}       # (path, size, mtime) -> manifest
        self._transfers: dict[tuple[str, str], _Transfer] = {}
        wire.on_reconnect(lambda: threading.Thread(target=self._republish, name="republish", daemon=True).start())
        self._published: dict[tuple[str, str], _Publication] = {}   # (group, id) -> retained on the broker
        self._left: dict[tuple[str, str], int] = {}                 # (group, id) -> chunks: a previous run's
        self._told: set[str] = set()                                # devices that asked for a group's artifact
        self.group_chunks_published = 0

    def offer(self, device: str, data: Data, slot: Optional[str] = None, group: Optional[str] = None,
              round: int = 0, described: Optional[ChunkManifest] = None) -> str:
        """Let `device` fetch `data` (a file or bytes); returns its id. An offer in a `slot` replaces the
        device's previous one there (e.g. the weights of the previous round). With a `group`, the data is
        also published on the group's topics (once: an offer of what is there only notes the `round`).
        `described`: `describe(data)`, when the caller has it."""
        manifest = described if described is not None and described.chunk_size == self.chunk_size \
            else self.describe(data)
        with self._lock:
            self._data[manifest.id] = data
            self._manifests[(manifest.id, manifest.chunk_size)] = manifest
            offered = self._offers.setdefault(device, set())
            if manifest.id not in offered:
                offered.add(manifest.id)
                self._holders[manifest.id] = self._holders.get(manifest.id, 0) + 1
            if slot is not None:
                old = self._slots.get((device, slot))
                self._slots[(device, slot)] = manifest.id
                if old is not None and old != manifest.id:
                    self._withdraw(device, old)
        if group is not None:
            self._publish(group, manifest, data, round)
        return manifest.id

    def describe(self, data: Data) -> ChunkManifest:
        """The chunk manifest of `data` in this server's chunks (a file's is kept while it is unchanged)."""
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
        offered = self._offers.get(device, set())
        self._transfers.pop((device, artifact), None)
        if artifact not in offered:
            return
        offered.discard(artifact)
        self._holders[artifact] -= 1
        if not self._holders[artifact]:      # offered to nobody now
            del self._holders[artifact]
            self._data.pop(artifact, None)
            self._manifests = {k: m for k, m in self._manifests.items() if k[0] != artifact}

    # ------------------------------------------------------------------------- group publications
    def _publish(self, group: str, manifest: ChunkManifest, data: Data, round: int) -> None:
        key = (group, manifest.id)
        with self._lock:
            if (pub := self._published.get(key)) is not None:
                pub.round = max(pub.round, round)
                return
            self._published[key] = _Publication(manifest, round)
            self._left.pop(key, None)
        self._send_publication(group, manifest, data)

    def _republish(self) -> None:
        with self._lock:
            again = [(group, pub.manifest, self._data[a]) for (group, a), pub in self._published.items()
                     if a in self._data]
        for group, manifest, data in again:
            try:
                self._send_publication(group, manifest, data)
            except (ArtifactError, TransportError) as exc:     # the next round's offers publish anew
                log.warning("group %s: artifact %s not published again after a reconnect: %s", group,
                            manifest.id[:12], exc)

    def _send_publication(self, group: str, manifest: ChunkManifest, data: Data) -> None:
        key = (group, manifest.id)
        # not under the lock: a flush waits for acknowledgements that the receive thread may be holding up
        for seq in range(manifest.count):
            try:
                payload = read_range(data, *manifest.bounds(seq))
            except OSError as exc:
                with self._lock:
                    self._published.pop(key, None)
                raise ArtifactError(f"artifact {manifest.id[:12]}: cannot read it to publish it for group {group} "
                                    f"({exc.strerror or exc})") from None
            self.wire.publish(topics.group_chunk(group, manifest.id, seq), payload, retain=True)
            self.group_chunks_published += 1
            if (seq + 1) % self.window == 0 and not self.wire.flush(_FLUSH_S):
                log.warning("group %s: the broker has not acknowledged artifact %s's chunks within %d s", group,
                            manifest.id[:12], _FLUSH_S)
        self.wire.publish(topics.group_manifest(group, manifest.id), envelopes.dumps(manifest.to_json()), retain=True)

    def published(self, group: str, artifact: str) -> bool:
        with self._lock:
            return (group, artifact) in self._published

    def found(self, group: str, artifact: str, payload: bytes) -> None:
        """A retained group manifest on the broker (the coordinator reads them when it connects): one this
        run did not publish is a previous run's, cleared by the next `retire`."""
        if not payload:
            return                       # a cleared one
        try:
            count = len(envelopes.loads(payload, "group manifest")["chunks"])
        except (TransportError, KeyError, TypeError):
            count = 0
        with self._lock:
            if (group, artifact) not in self._published:
                self._left[(group, artifact)] = count

    def retire(self, before_round: float, only: Optional[tuple[str, str]] = None) -> int:
        """Clear the group publications last offered before `before_round` and those a previous run left
        (`only`: just that (group, id), whenever it was offered); returns how many."""
        with self._lock:
            old = [k for k, p in self._published.items() if (p.round < before_round if only is None else k == only)]
            gone = {k: self._published.pop(k).manifest.count for k in old}
            if only is None:
                gone.update(self._left)
                self._left.clear()
        for (group, artifact), count in gone.items():
            self.wire.publish(topics.group_manifest(group, artifact), b"", retain=True)   # the manifest first
            for seq in range(count):
                self.wire.publish(topics.group_chunk(group, artifact, seq), b"", retain=True)
        return len(gone)

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
        if missing is None and device not in self._told and any(a == artifact for _, a in self._published):
            self._told.add(device)       # it asks for the whole of what its group's topics hold
            log.warning("%s fetches its group's artifacts from the coordinator, one device at a time: the broker "
                        "may not let it read its group's topics (regenerate the ACL with 'edgefl broker config "
                        "--devices FLEET' and reload the broker), or its edgefl predates them", device)
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
            if hashlib.sha256(payload).hexdigest() != m.chunks[seq]:
                # an artifact is immutable once named: a file rewritten since it was offered is not it any more,
                # and sending its new bytes would only have the device ask again, without end
                raise OSError(f"chunk {seq} changed since it was offered: the file was rewritten in place")
        except OSError as exc:
            log.error("artifact %s for %s: cannot read chunk %d (%s)", m.id[:12], device, seq, exc)
            self._transfers.pop((device, m.id), None)
            self.wire.publish(topics.artifact_manifest(device, m.id), envelopes.refusal(
                m.id, f"the coordinator cannot read it ({exc.strerror or exc})"))
            return
        self.wire.publish(topics.artifact_chunk(device, m.id, seq), payload)
        self.chunks_sent += 1
