"""A device's upload, put together and checked at the coordinator's end (edgefl.transport.endpoint): its meta
message (the report's summary and what its tensor buffer holds) and its chunks, in any order. A report is
handed on only when whole and checked (sha256, size, tensor order, the fields the round loop computes with,
the topic it came on); anything else becomes a REJECTED report (`rejected`) saying why.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional

from edgefl.errors import ReportRejected, TransportError
from edgefl.messages import DeviceReport, ReportStatus
from edgefl.protocol import envelopes
from edgefl.protocol.tensors import PackedTensors, shared_order
from edgefl.protocol.wire import Traffic
from edgefl.units import format_bytes

UPLOAD_REJECTED = "upload rejected"     # how a refused upload's reason reads to an operator


def rejected(device: str, round: int, upload: str, meta: Optional[bytes], why: object,
             upload_bytes: int = 0) -> DeviceReport:
    """The report this end makes of an upload it refused."""
    return DeviceReport(round=round, device_id=device, config_hash=config_hash(meta), status=ReportStatus.REJECTED,
                        reason=f"{UPLOAD_REJECTED}: {why}", upload_bytes=upload_bytes, upload=upload)


@dataclass
class Upload:
    """A (device, round)'s upload as it arrives: its meta message and its tensor chunks."""
    meta: Optional[bytes] = None
    chunks: dict = field(default_factory=dict)
    held: int = 0                 # chunk bytes held
    refused: str = ""             # why its chunks are being dropped
    traffic: Traffic = field(default_factory=Traffic)


def finish(device: str, round: int, upload: str, up: Upload, limit: Optional[int]) -> Optional[DeviceReport]:
    """The report once the meta and all chunks are in (None before); a bad upload becomes a REJECTED report."""
    if up.meta is None:
        return None
    try:
        meta = envelopes.loads(up.meta, f"{device}: report")
        if meta.get("schema") != envelopes.REPORT:
            raise ReportRejected(f"schema {meta.get('schema')!r}, expected {envelopes.REPORT!r}")
        summary, info, download = meta["report"], meta["tensors"], meta.get("download", {})
        if up.refused:
            raise ReportRejected(up.refused)
        if limit is not None and int(info["bytes"]) > limit:
            raise ReportRejected(f"{format_bytes(int(info['bytes']))} of tensors, more than the "
                                 f"{format_bytes(limit)} its instruction expects")
        if len(up.chunks) < int(info["chunks"]):
            return None
        buffer = b"".join(up.chunks[i] for i in range(int(info["chunks"])))
        if len(buffer) != int(info["bytes"]) or hashlib.sha256(buffer).hexdigest() != info["sha256"]:
            raise ReportRejected("the tensor buffer does not match its size and sha256")
        report = envelopes.report_from_summary(summary)
        check_fields(report)
        if report.device_id != device or report.round != round or report.upload != upload:
            raise ReportRejected(f"sent on {device}'s round-{round} topic as upload {upload} but claims "
                                 f"{report.device_id!r}, round {report.round}, upload {report.upload!r}")
        report.tensors = PackedTensors(buffer, shared_order(info["order"]))   # unpacked when taken
    except (ReportRejected, TransportError, KeyError, TypeError, ValueError) as exc:
        return rejected(device, round, upload, up.meta, exc, up.traffic.payload_bytes)
    report.upload_bytes = len(buffer)
    report.download_bytes = int(download.get("payload_bytes", 0))
    report.metrics = {**report.metrics, "transport": {"download": download, "upload": up.traffic.to_json()}}
    return report


def check_fields(report: DeviceReport) -> None:
    """What the round loop does arithmetic on or prints must be what it says (the summary is the device's word)."""
    for name in ("loss_before", "loss_after", "wall_s", "peak_rss_bytes", "activation_bytes"):
        value = getattr(report, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ReportRejected(f"malformed report: {name} is {value!r}")
    if not isinstance(report.reason, str) or not isinstance(report.config_hash, str):
        raise ReportRejected("malformed report: reason and config_hash must be strings")


def declares_tensors(meta: bytes) -> bool:
    """Whether an upload's meta announces a tensor buffer (unreadable: assume it does). A report without one,
    a device's failed round, holds nothing and is let through wherever it is sent."""
    try:
        return int(envelopes.loads(meta, "report")["tensors"]["chunks"]) != 0
    except (TransportError, KeyError, TypeError, ValueError):
        return True


def config_hash(meta: Optional[bytes]) -> str:
    try:
        return str(envelopes.loads(meta or b"", "report")["report"]["config_hash"])
    except (TransportError, KeyError, TypeError):
        return ""
