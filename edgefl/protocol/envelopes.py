"""The JSON messages of the protocol, defined once for both ends.

down/instr    {"schema": INSTRUCTION, "instruction": RoundInstruction JSON, "weights": {"artifact", "bytes",
              "order"} | null, "artifacts": {role: artifact id}, "shared": {artifact id: group}}
              (shared: files the device fetches from its group's retained topics, not its own down/)
up/ack        {"want": id, "chunk_size": n | null, "missing": [seq] | null, "resend": bool}
              (missing null: send the manifest first; resend: what is in flight is lost, send it again)
              {"got": id, "seq": n}  /  {"bad": id, "seq": n}
.../manifest  a chunk manifest, or {"id": id, "error": why, "restart": bool} (restart: drop the partial
              fetch and ask again from scratch)
up/result/<round>/<upload>/meta  {"schema": REPORT, "report": DeviceReport summary (its "upload" the topic's),
              "tensors": {"order", "bytes", "sha256", "chunks"}, "download": {"messages", "payload_bytes",
              "wire_bytes"}}
down/receipt  {"round": r, "upload": id, "taken": bool, "reason": why not (optional)}: the coordinator holds
              the upload (journaled) or refuses it for good; either way the device stops sending it again
broadcast/round  {"round": r, "open": bool} (retained)
presence      {"online": bool, "device": id, "profile": {...}, "reason": why offline (optional)}
up/metrics    {"state": "training", ...} (free form; "state" feeds the coordinator's live view)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from edgefl import topics
from edgefl.errors import ConfigError, ReportRejected, TransportError
from edgefl.manifest import TensorEntry
from edgefl.messages import DEVICE_STATUSES, DeviceReport, RoundInstruction
from edgefl.protocol.tensors import order_from_json, order_to_json

INSTRUCTION = "edgefl.assignment/1"
REPORT = "edgefl.upload/2"       # /2: an upload is named (topic and summary) and answered with a receipt


def dumps(obj: Any) -> bytes:
    def plain(o):  # numpy scalars and arrays in metrics
        if hasattr(o, "tolist"):
            return o.tolist()
        raise TypeError(f"{type(o).__name__} is not JSON serialisable")
    return json.dumps(obj, separators=(",", ":"), default=plain).encode()


def loads(payload: bytes, what: str) -> dict:
    try:
        d = json.loads(payload)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        raise TransportError(f"{what}: not a JSON object")
    return d


@dataclass(frozen=True)
class TensorBlob:
    """Tensors shipped as an artifact: the flat float32 buffer's id and size, and its order."""
    artifact: str
    bytes: int
    order: tuple[TensorEntry, ...]

    def to_json(self) -> dict:
        return {"artifact": self.artifact, "bytes": self.bytes, "order": order_to_json(self.order)}

    @classmethod
    def from_json(cls, d: dict) -> "TensorBlob":
        return cls(str(d["artifact"]), int(d["bytes"]), order_from_json(d["order"]))


@dataclass(frozen=True)
class Assignment:
    """A round instruction as a device receives it: what to train, the weights to start from (an artifact
    holding their flat buffer), the other artifacts it needs, by role, and which artifacts (those files, or
    files of those sets) its group shares: artifact id -> the group whose topics hold them."""
    instruction: RoundInstruction
    weights: Optional[TensorBlob] = None
    artifacts: Mapping[str, str] = field(default_factory=dict)
    shared: Mapping[str, str] = field(default_factory=dict)

    def dumps(self) -> bytes:
        return dumps({"schema": INSTRUCTION, "instruction": self.instruction.to_json(),
                      "weights": self.weights.to_json() if self.weights else None, "artifacts": dict(self.artifacts),
                      **({"shared": dict(self.shared)} if self.shared else {})})

    @classmethod
    def loads(cls, payload: bytes) -> "Assignment":
        d = loads(payload, "instruction")
        if d.get("schema") != INSTRUCTION:
            raise TransportError(f"instruction: schema {d.get('schema')!r}, expected {INSTRUCTION!r}; update edgefl "
                                 "on this device to the coordinator's version")
        try:
            weights = TensorBlob.from_json(d["weights"]) if d.get("weights") else None
            shared = {str(a): topics.check_group(str(g)) for a, g in (d.get("shared") or {}).items()}
            return cls(RoundInstruction.from_json(d["instruction"]), weights, dict(d.get("artifacts") or {}), shared)
        except (KeyError, TypeError, ValueError, AttributeError, ReportRejected, ConfigError) as exc:
            raise TransportError(f"instruction: malformed ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Unreadable:
    """An instruction this device cannot follow (another protocol version, a malformed message), with what
    could be read of it: enough to answer the coordinator with a failed report and the reason."""
    round: int
    config_hash: str
    reason: str

    @classmethod
    def of(cls, payload: bytes, reason: str) -> Optional["Unreadable"]:
        try:
            ins = json.loads(payload)["instruction"]
            return cls(int(ins["round"]), str(ins.get("config_hash", "")), reason)
        except (ValueError, KeyError, TypeError):
            return None    # not even a round to answer for: logged only


def want(artifact: str, chunk_size: Optional[int], missing: Optional[list[int]], resend: bool) -> bytes:
    return dumps({"want": artifact, "chunk_size": chunk_size, "missing": missing, "resend": resend})


def got(artifact: str, seq: int) -> bytes:
    return dumps({"got": artifact, "seq": seq})


def bad(artifact: str, seq: int) -> bytes:
    return dumps({"bad": artifact, "seq": seq})


def refusal(artifact: str, why: str, restart: bool = False) -> bytes:
    return dumps({"id": artifact, "error": why, "restart": restart})


def receipt(round: int, upload: str, taken: bool, reason: str = "") -> bytes:
    return dumps({"round": round, "upload": upload, "taken": taken, **({"reason": reason} if reason else {})})


def round_notice(round: int, open: bool) -> bytes:
    return dumps({"round": round, "open": open})


def presence(online: bool, device: str, profile: Optional[Mapping[str, Any]] = None, reason: str = "") -> bytes:
    """`reason`: why a device is offline (its will: the connection was lost; a clean stop), for the operator."""
    return dumps({"online": online, "device": device, "profile": dict(profile or {}),
                  **({"reason": reason} if reason else {})})


_REPORT_FIELDS = {f.name for f in dataclasses.fields(DeviceReport)} - {"tensors"}


def upload_meta(report: DeviceReport, order: tuple[TensorEntry, ...], nbytes: int, sha256: str, chunks: int,
                download: Mapping[str, int]) -> bytes:
    summary = dataclasses.replace(report, tensors={}).summary()   # summary() would deep-copy the tensors
    return dumps({"schema": REPORT, "report": summary,
                  "tensors": {"order": order_to_json(order), "bytes": nbytes, "sha256": sha256, "chunks": chunks},
                  "download": dict(download)})


def report_from_summary(summary: dict) -> DeviceReport:
    """A DeviceReport (without tensors) from its summary; fields this version does not know are dropped."""
    try:
        report = DeviceReport(**{k: v for k, v in summary.items() if k in _REPORT_FIELDS})
    except (TypeError, AttributeError, ValueError) as exc:   # a missing field, not a JSON object, no status
        raise ReportRejected(f"malformed report ({exc})") from None
    if not (isinstance(report.round, int) and isinstance(report.device_id, str) and report.status in DEVICE_STATUSES
            and isinstance(report.metrics, dict) and isinstance(report.examples, int)):
        raise ReportRejected("malformed report: round, device_id, status, examples or metrics has the wrong type")
    return report
