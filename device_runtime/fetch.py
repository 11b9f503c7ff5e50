"""Artifacts by sha256, for a device: from its cache, or fetched (and resumed) from the coordinator, or from
its group's retained topics (device protocol, "Artifacts").

`fetch` asks the coordinator for what the cache lacks (the chunks a previous, interrupted fetch did not
get), checks every chunk's sha256 as it lands, acknowledges it (the coordinator keeps a window of
chunks in flight), ignores duplicates, reports bad chunks so they are sent again, and checks the whole
file's sha256 at the end. When nothing arrives for `stall_s` it asks again without a resend (chunks may
just be slow on a thin link: QoS 1 and the session keep them coming), each silence waiting twice as long
as the one before; after `resend_after_s` of silence, or when the connection comes back, it asks for
everything missing to be sent again. A fetch ends early, with the reason, when the link says its work is
over (`cancelled`: the link closes or stops, a newer round began) or when its chunks keep failing their
sha256 (the coordinator no longer has those bytes), and at `timeout_s` in any case: a later fetch resumes.
An artifact the instruction names as its group's (`shared`: the coordinator published it once for the
whole group) is read from the group's retained topics instead: the chunk manifest, then every chunk, each
checked as above and none acknowledged (nothing travels per device); what they do not bring within
`group_wait_s` of silence (a broker that lost them, an ACL without the group) is asked of the coordinator
as above. A complete `fetch_artifact` says so on `up/metrics` (`{"state": "training"}`); a file fetched from
the group's topics, which nothing acknowledges, is told there too (`{"state": "downloading", "bytes": n}`).
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from edgefl import topics
from edgefl.device_runtime.cache import ArtifactCache
from edgefl.errors import ArtifactError, TransportError
from edgefl.manifest import MANIFEST, PREFIX_DIR, Manifest
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import WINDOW, ChunkManifest
from edgefl.protocol.wire import Wire, log

WAKE, _RECONNECTED = "wake", "reconnected"


class FetchEnded(TransportError):
    """A fetch the device no longer needs (its round is over, the link stops or closed); a later one resumes."""


@dataclass
class FetchStats:
    chunks_accepted: int = 0
    duplicate_chunks: int = 0      # already held: ignored
    corrupt_chunks: int = 0        # sha256 mismatch: asked for again
    stale_chunks: int = 0          # arrived while no fetch wanted them (e.g. redelivered after a restart)
    wants: int = 0                 # requests sent (first ask, stalls, reconnects, whole-file mismatches)
    resend_wants: int = 0          # of which asked to send again what was in flight


class Fetcher:
    def __init__(self, wire: Wire, device_id: str, cache: ArtifactCache, cancelled: Callable[[], Optional[str]], *,
                 stall_s: float = 5.0, resend_after_s: float = 60.0, group_wait_s: Optional[float] = None):
        """`cancelled()`: why the device's fetches must end now, or None; `group_wait_s`: how long a fetch from
        the group's topics waits on silence before it asks the coordinator (default 3 x `stall_s`: a crowded
        broker answers a subscription slowly)."""
        self.wire, self.device_id, self.cache, self.cancelled = wire, device_id, cache, cancelled
        self.stall_s, self.resend_after_s = stall_s, resend_after_s
        self.group_wait_s = 3 * stall_s if group_wait_s is None else group_wait_s
        self.stats = FetchStats()
        self.shared: dict[str, str] = {}             # artifact -> its group: the current instruction's
        self.silent: set[str] = set()                # groups whose topics held nothing for this instruction
        self._lock = threading.Lock()
        self._fetching: Optional[str] = None
        self._inbox: queue.Queue = queue.Queue()

    def assign(self, shared: Mapping[str, str]) -> None:
        """A new instruction: what its group shares."""
        self.shared, self.silent = dict(shared), set()

    def deliver(self, kind: str, sha: str, seq: Optional[int], payload: bytes, group: Optional[str]) -> None:
        """A manifest or chunk message (the wire's receive thread)."""
        with self._lock:
            wanted = self._fetching == sha
            if wanted:
                self._inbox.put((kind, seq, payload, group))
        if not wanted:
            self.stats.stale_chunks += kind == "chunk"

    def wake(self, reconnected: bool = False) -> None:
        """The link has news for a fetch in progress (it came back, it stops, a round began or ended)."""
        self._inbox.put((_RECONNECTED if reconnected else WAKE, None, None, None))

    def _check(self) -> None:
        if (why := self.cancelled()) is not None:
            raise FetchEnded(f"{self.device_id}: {why}; a later fetch resumes")

    def fetch(self, artifact: str, timeout_s: Optional[float] = None,
              progress: Optional[Callable[[int, int], None]] = None) -> Path:
        """The verified file of `artifact` (its sha256), from the cache or fetched (and resumed) from the
        coordinator, or from its group's topics where the current instruction says so. `progress(chunks
        held, chunk count)` is called after each new chunk."""
        self._check()
        if (path := self.cache.get(artifact)) is not None:
            return path
        if artifact == hashlib.sha256(b"").hexdigest():
            return self.cache.put(b"")
        part = self.cache.partial(artifact)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        group = self.shared.get(artifact)
        group = None if group in self.silent else group
        subscribed: list[str] = []
        early: dict[int, bytes] = {}     # a group's chunks that came before its manifest (a window's worth)
        with self._lock:
            self._fetching, self._inbox = artifact, queue.Queue()
        try:
            if group is not None:    # one SUBSCRIBE: the broker sends the manifest's retained message first
                subscribed = ([topics.group_manifest(group, artifact)] if part.manifest is None else []) + \
                    [topics.group_chunks(group, artifact)]
                self._subscribe(subscribed)
            else:
                self._want(part, resend=True)
            heard, dropped, stalls, corrupt = time.monotonic(), False, 0, self.stats.corrupt_chunks
            while True:
                self._check()
                if self.stats.corrupt_chunks - corrupt > max(16, 2 * (part.manifest.count if part.manifest else 0)):
                    raise ArtifactError(f"{self.device_id}: artifact {artifact[:12]}: its chunks keep failing their "
                                        "sha256 (the coordinator's copy is not that artifact any more); dropped")
                if part.complete:
                    size = part.manifest.size
                    if (path := part.finish()) is not None:
                        if artifact in self.shared:    # no acknowledgements told the coordinator: say it here
                            self.wire.publish(topics.metrics(self.device_id), envelopes.dumps(
                                {"state": "downloading", "artifact": artifact, "bytes": size}))
                        return path
                    group = None     # chunks that did not add up: the coordinator sends them again
                    self._want(part, resend=True)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    held = f"{len(part.held)}/{part.manifest.count} chunks" if part.manifest else "no manifest"
                    raise TransportError(f"{self.device_id}: artifact {artifact[:12]} not complete after "
                                         f"{timeout_s:g} s ({held}); is the coordinator running? A later fetch resumes")
                wait = self.group_wait_s if group is not None else min(self.stall_s * 2 ** stalls, self.resend_after_s)
                try:
                    kind, seq, data, via = self._inbox.get(timeout=wait if remaining is None else min(wait, remaining))
                except queue.Empty:
                    if group is not None:      # the group's topics brought what they hold: ask for the rest
                        self._group_gave_out(group, part)
                        group, heard, dropped = None, time.monotonic(), False
                        continue
                    lost = dropped or time.monotonic() - heard >= self.resend_after_s
                    self._want(part, resend=lost)
                    heard, dropped = (time.monotonic(), False) if lost else (heard, dropped)
                    stalls += 1          # each silence waits twice as long before the next ask, up to resend_after_s
                    continue
                heard, stalls = time.monotonic(), 0
                if kind == WAKE:
                    continue             # the link has news: _check() says whether this fetch goes on
                if kind == _RECONNECTED:
                    if group is None:          # a group's renewed subscription brings its retained messages again
                        self._want(part, resend=True)
                elif via is not None and not data:
                    continue                   # a group's message cleared (an old round's)
                elif kind == "manifest" and via is not None:
                    if not self._on_group_manifest(part, data) and group is not None:
                        self._group_gave_out(group, part)
                        group = None
                elif kind == "manifest":
                    self._on_manifest(part, data)
                elif part.manifest is None:         # a chunk before its manifest: the next ask resends it
                    if via is not None and len(early) < WINDOW:
                        early[seq] = data
                    else:
                        dropped = True
                else:
                    self._on_chunk(part, seq, data, progress, acknowledge=via is None)
                if early and part.manifest is not None:
                    for seq, data in sorted(early.items()):
                        self._on_chunk(part, seq, data, progress, acknowledge=False)
                    early.clear()
        finally:
            with self._lock:
                self._fetching = None
            if subscribed and self.wire.connected:
                self.wire.unsubscribe(subscribed)

    def _subscribe(self, filters: list[str]) -> None:
        """Subscribe to a group's topics; a broker slow to confirm it (a crowded one) is not a failure: what
        comes, comes, and what does not is asked of the coordinator after `group_wait_s`."""
        try:
            self.wire.subscribe(filters)
        except TransportError as exc:
            log.info("%s: %s; going on", self.device_id, exc)

    def _group_gave_out(self, group: str, part) -> None:
        """The group's topics brought all they will: the coordinator sends the rest (all of it, when they held
        not even the manifest: then the rest of this instruction's files are asked of it directly)."""
        if part.manifest is None:
            self.silent.add(group)
            log.warning("%s: group %s's topics hold no artifact %s (may this login read fl/v1/group/%s/?); "
                        "asking the coordinator", self.device_id, group, part.id[:12], group)
        self._want(part, resend=True)

    def _on_group_manifest(self, part, payload: bytes) -> bool:
        try:
            manifest = ChunkManifest.from_json(envelopes.loads(payload, f"artifact {part.id[:12]}: manifest"), part.id)
        except (ArtifactError, TransportError) as exc:
            log.warning("%s: %s", self.device_id, exc)
            return False
        if part.manifest != manifest:
            part.start(manifest)
        return True

    def fetch_artifact(self, artifact: str, timeout_s: Optional[float] = None, into: Optional[Path] = None) -> Path:
        """An exported artifact folder from its manifest's id (`WireTransport.ship_artifact`): the manifest,
        every file it names (each fetched by its sha256, so only what the cache lacks travels) and, for a
        suffix, its prefix in `prefix/`: a folder `edgefl.manifest.ArtifactSet.open` reads. `timeout_s` is
        per file."""
        folder = into or self.cache.folder / "artifacts" / artifact
        source = self.fetch(artifact, timeout_s)
        try:
            manifest = Manifest.from_json(json.loads(source.read_bytes()), f"artifact {artifact[:12]}")
        except ValueError:
            raise ArtifactError(f"artifact {artifact[:12]}: not a manifest.json") from None
        for f in manifest.files:
            if Path(f.name).is_absolute() or ".." in Path(f.name).parts:
                raise ArtifactError(f"artifact {artifact[:12]}: file name {f.name!r} leaves the artifact folder")
            _place(self.fetch(f.sha256, timeout_s), folder / f.name)
        if manifest.prefix_id is not None:
            self.fetch_artifact(manifest.prefix_id, timeout_s, folder / PREFIX_DIR)
        _place(source, folder / MANIFEST)
        if into is None:     # the whole set is here: the coordinator's live view shows this device training
            self.wire.publish(topics.metrics(self.device_id), envelopes.dumps({"state": "training",
                                                                                "artifact": artifact}))
        return folder

    def _want(self, part, resend: bool) -> None:
        self.stats.wants += 1
        self.stats.resend_wants += resend
        known = part.manifest is not None
        self.wire.publish(topics.ack(self.device_id), envelopes.want(
            part.id, part.manifest.chunk_size if known else None, part.missing() if known else None, resend))

    def _on_manifest(self, part, payload: bytes) -> None:
        d = envelopes.loads(payload, f"artifact {part.id[:12]}: manifest")
        if d.get("restart"):
            part.discard()
            self._want(part, resend=True)
            return
        if "error" in d:
            raise ArtifactError(f"{self.device_id}: the coordinator refused artifact {part.id[:12]}: {d['error']}")
        manifest = ChunkManifest.from_json(d, part.id)
        if part.manifest != manifest:
            part.start(manifest)

    def _on_chunk(self, part, seq: int, data: bytes, progress, acknowledge: bool = True) -> None:
        """`acknowledge`: a chunk the coordinator sent this device (a group's retained chunks are not)."""
        verdict = part.accept(seq, data)
        if verdict == "bad":
            self.stats.corrupt_chunks += 1
            if acknowledge:
                self.wire.publish(topics.ack(self.device_id), envelopes.bad(part.id, seq))
            return
        if verdict == "dup":
            self.stats.duplicate_chunks += 1
        else:
            self.stats.chunks_accepted += 1
        if acknowledge:
            self.wire.publish(topics.ack(self.device_id), envelopes.got(part.id, seq))
        if verdict == "ok" and progress is not None:
            progress(len(part.held), part.manifest.count)


def _place(cached: Path, dest: Path) -> None:
    """Put a cached file at `dest`: a hard link (no copy; a change to it shows in the cache's hash check)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        if dest.samefile(cached):
            return
        dest.unlink()
    try:
        os.link(cached, dest)
    except OSError:
        shutil.copyfile(cached, dest)
