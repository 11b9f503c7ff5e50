"""The coordinator's end of the device protocol over any Wire (MQTT or the in-process hub).

Down: each instruction goes to `down/instr` with the weights it needs as an artifact of their flat
float32 buffer (offered to that device only, replacing its previous round's), plus the ids of other
artifacts shipped to it (`ship`). Up: a report is its chunked tensor buffer and a meta message, put
together here and checked (sha256, size, tensor order) before `collect` hands it out; the bytes it took
are measured here (payload and MQTT framing) and set on the report. Presence: retained `presence/<id>`
messages (a device's announcement, or its last will) tell who is online with which profile.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from edgefl.errors import ArtifactError, ReportRejected, TransportError
from edgefl.manifest import MANIFEST, PREFIX_DIR, Manifest
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.transport import Transport, envelopes, topics
from edgefl.transport.artifact_server import ArtifactServer
from edgefl.transport.chunks import CHUNK_SIZE, WINDOW
from edgefl.transport.envelopes import Assignment, TensorBlob
from edgefl.transport.tensors import order_from_json, pack, unpack
from edgefl.transport.wire import Traffic, Wire, log

COORDINATOR_ID = "edgefl-coordinator"


@dataclass
class _Upload:
    meta: Optional[bytes] = None
    chunks: dict = field(default_factory=dict)
    traffic: Traffic = field(default_factory=Traffic)


class WireTransport(Transport):
    def __init__(self, wire: Wire, chunk_size: int = CHUNK_SIZE, window: int = WINDOW):
        self.wire = wire
        self.artifacts = ArtifactServer(wire, chunk_size, window)
        self._cond = threading.Condition()
        self._uploads: dict[tuple[str, int], _Upload] = {}
        self._done: dict[int, dict[str, DeviceReport]] = {}
        self._presence: dict[str, dict] = {}
        wire.on_message(self._on_message)
        wire.subscribe(topics.COORDINATOR_FILTERS)

    # ------------------------------------------------------------------------------ down
    def ship(self, device_id: str, data: str | Path | bytes) -> str:
        """Offer an artifact (a file or bytes) to a device; returns its id (sha256) for `send(artifacts=...)`.
        The device fetches it only if its cache lacks it."""
        return self.artifacts.offer(topics.check_device_id(device_id), Path(data) if isinstance(data, str) else data)

    def ship_artifact(self, device_id: str, folder: str | Path) -> str:
        """Offer an exported artifact folder: manifest.json, every file it names and, for a suffix, its prefix
        (in `prefix/`). Returns the manifest file's id; the device rebuilds the folder with
        `DeviceLink.fetch_artifact`, fetching only files its cache lacks (a frozen prefix once)."""
        folder = Path(folder)
        manifest = Manifest.read(folder, verify=False)
        for f in manifest.files:
            if self.ship(device_id, folder / f.name) != f.sha256:   # hashing it to ship it checks it too
                raise ArtifactError(f"{folder / f.name}: sha256 does not match {folder / MANIFEST}; re-export")
        if manifest.prefix_id is not None and self.ship_artifact(device_id, folder / PREFIX_DIR) != manifest.prefix_id:
            raise ArtifactError(f"{folder / PREFIX_DIR / MANIFEST}: not the prefix {folder / MANIFEST} names; re-export")
        return self.ship(device_id, folder / MANIFEST)

    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        device = topics.check_device_id(instruction.device_id)
        artifacts = dict(artifacts or {})
        if unshipped := [role for role, a in artifacts.items() if not self.artifacts.offered(device, a)]:
            raise ValueError(f"{device}: artifacts {unshipped} were not shipped to it; ship() them first")
        blob = None
        if weights:
            buffer, order = pack(weights)
            blob = TensorBlob(self.artifacts.offer(device, buffer, slot="weights"), len(buffer), order)
        self.wire.publish(topics.instruction(device), Assignment(instruction, blob, artifacts).dumps())

    # -------------------------------------------------------------------------------- up
    def collect(self, round: int, expected: Iterable[str], timeout_s: Optional[float],
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        expected = set(expected)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen: set[str] = set()

        def news() -> bool:
            done = self._done.get(round, {}).keys()
            return expected <= done or bool(done - seen)

        while True:
            with self._cond:
                self._cond.wait_for(news, None if deadline is None else max(0.0, deadline - time.monotonic()))
                done = dict(self._done.get(round, {}))
            for device in sorted(done.keys() - seen):
                seen.add(device)
                if on_report is not None:    # outside the lock: a journal write must not stall the receive thread
                    on_report(done[device])
            if expected <= seen or (deadline is not None and time.monotonic() >= deadline):
                break
        with self._cond:
            reports = self._done.pop(round, {})
            for late, devices in self._done.items():
                if late < round:    # a round already closed: its aggregate is final
                    log.warning("dropped late reports for closed round %d from %s", late, ", ".join(sorted(devices)))
            self._done = {r: v for r, v in self._done.items() if r > round}
            self._uploads = {k: v for k, v in self._uploads.items() if k[1] > round}
        return [reports[d] for d in sorted(reports)]

    def reports_in(self, round: int) -> int:
        """Reports complete for `round` and not yet collected (a live view's counter)."""
        with self._cond:
            return len(self._done.get(round, {}))

    def online(self) -> dict[str, dict]:
        """Devices whose presence says online -> the profile they announced."""
        with self._cond:
            return {d: p.get("profile", {}) for d, p in self._presence.items() if p.get("online")}

    def wait_online(self, devices: Iterable[str], timeout_s: float) -> dict[str, dict]:
        """Wait until all of `devices` are online (or the timeout passes); returns who is online."""
        wanted = set(devices)
        with self._cond:
            self._cond.wait_for(lambda: wanted <= {d for d, p in self._presence.items() if p.get("online")},
                                timeout_s)
        return self.online()

    def close(self) -> None:
        self.wire.close()

    # --------------------------------------------------------------------- receive thread
    def _on_message(self, topic: str, payload: bytes, wire_bytes: int) -> None:
        t = topics.parse(topic)
        if t is None:
            return
        if t.kind == "ack":
            self.artifacts.handle(t.device, payload)
        elif t.kind == "presence":
            self._on_presence(t.device, payload)
        elif t.kind in ("result_meta", "result_chunk"):
            self._on_upload(t, payload, wire_bytes)

    def _on_presence(self, device: str, payload: bytes) -> None:
        try:
            state = envelopes.loads(payload, f"{device}: presence") if payload else {"online": False}
        except TransportError as exc:
            log.warning("%s", exc)
            return
        with self._cond:
            self._presence[device] = state
            self._cond.notify_all()

    def _on_upload(self, t: topics.Topic, payload: bytes, wire_bytes: int) -> None:
        with self._cond:
            up = self._uploads.setdefault((t.device, t.round), _Upload())
            if t.kind == "result_chunk":
                if t.seq in up.chunks:
                    return                       # redelivered
                up.chunks[t.seq] = payload
            elif up.meta is None:
                up.meta = payload
            else:
                return
            up.traffic.add(len(payload), wire_bytes)
            report = self._finish(t.device, t.round, up)
            if report is not None:
                del self._uploads[(t.device, t.round)]
                self._done.setdefault(t.round, {})[t.device] = report
                self._cond.notify_all()

    @staticmethod
    def _finish(device: str, round: int, up: _Upload) -> Optional[DeviceReport]:
        """The report once the meta and all chunks are in (None before); a bad upload becomes a failed report."""
        if up.meta is None:
            return None
        summary: dict = {}
        try:
            meta = envelopes.loads(up.meta, f"{device}: report")
            if meta.get("schema") != envelopes.REPORT:
                raise ReportRejected(f"schema {meta.get('schema')!r}, expected {envelopes.REPORT!r}")
            summary, info, download = meta["report"], meta["tensors"], meta.get("download", {})
            if len(up.chunks) < int(info["chunks"]):
                return None
            buffer = b"".join(up.chunks[i] for i in range(int(info["chunks"])))
            if len(buffer) != int(info["bytes"]) or hashlib.sha256(buffer).hexdigest() != info["sha256"]:
                raise ReportRejected("the tensor buffer does not match its size and sha256")
            report = envelopes.report_from_summary(summary)
            if report.device_id != device or report.round != round:
                raise ReportRejected(f"sent on {device}'s round-{round} topic but claims {report.device_id!r}, "
                                     f"round {report.round}")
            report.tensors = unpack(buffer, order_from_json(info["order"]))
        except (ReportRejected, TransportError, KeyError, TypeError, ValueError) as exc:
            return DeviceReport(round=round, device_id=device, config_hash=str(summary.get("config_hash", "")),
                                status="failed", reason=f"upload rejected: {exc}", upload_bytes=up.traffic.payload_bytes)
        report.upload_bytes = len(buffer)
        report.download_bytes = int(download.get("payload_bytes", 0))
        report.metrics = {**report.metrics, "transport": {"download": download, "upload": up.traffic.to_json()}}
        return report
