"""What crosses between the coordinator and a device: RoundInstruction down, DeviceReport up.

Versioned and validated on read. Tensors travel as a mapping of global tensor names to arrays (an
auxiliary head under its global key aux.<boundary>.<kind>.<name>, so the heads of several blocks or exits
never collide); on a wire they become one flat float32 buffer in the order the manifest states.
An instruction with a `sequence` asks for its configs to be trained one after another in the round
(FeDepth), each block starting from the blocks before it as trained; its weights are the union of theirs.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from edgefl.errors import ReportRejected
from edgefl.trainconfig import TrainConfig

INSTRUCTION_SCHEMA = "edgefl.instruction/1"
REPORT_SCHEMA = "edgefl.report/1"


@dataclass(frozen=True)
class RoundInstruction:
    round: int
    device_id: str
    config: TrainConfig
    weights_version: int
    seed: int
    lr: float
    deadline_s: Optional[float] = None
    options: tuple[tuple[str, Any], ...] = ()   # method-specific switches for the trainer (e.g. fjord widths)
    sequence: tuple[TrainConfig, ...] = ()      # configs trained one after another (FeDepth); () = (config,)

    @property
    def configs(self) -> tuple[TrainConfig, ...]:
        return self.sequence or (self.config,)

    @property
    def config_hash(self) -> str:
        if not self.sequence:
            return self.config.hash()
        return hashlib.sha256("/".join(c.hash() for c in self.sequence).encode()).hexdigest()[:16]

    def option(self, name: str, default=None):
        return dict(self.options).get(name, default)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(schema=INSTRUCTION_SCHEMA, config=self.config.to_json(), config_hash=self.config_hash,
                 options=dict(self.options), sequence=[c.to_json() for c in self.sequence])
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RoundInstruction":
        if d.get("schema") != INSTRUCTION_SCHEMA:
            raise ValueError(f"unknown instruction schema {d.get('schema')!r}; expected {INSTRUCTION_SCHEMA!r}")
        return cls(round=d["round"], device_id=d["device_id"], config=TrainConfig.from_json(d["config"]),
                   weights_version=d["weights_version"], seed=d["seed"], lr=d["lr"], deadline_s=d.get("deadline_s"),
                   options=tuple(sorted(d.get("options", {}).items())),
                   sequence=tuple(TrainConfig.from_json(c) for c in d.get("sequence", [])))


if sys.version_info >= (3, 11):
    from enum import StrEnum
else:     # Python 3.10: StrEnum as 3.11 has it, a str whose str() is its value
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return self.value


class ReportStatus(StrEnum):
    """How a device's round ended. A device reports OK or FAILED (out of memory, a crash, an instruction it
    refused); the coordinator's end of the transport makes the other two: REJECTED (it refused the upload:
    malformed, not asked for, over its size) and OFFLINE (the device went offline during its round)."""
    OK = "ok"
    FAILED = "failed"
    REJECTED = "rejected"
    OFFLINE = "offline"


DEVICE_STATUSES = (ReportStatus.OK, ReportStatus.FAILED)     # what a device's own report may say


@dataclass
class DeviceReport:
    round: int
    device_id: str
    config_hash: str
    status: ReportStatus                          # a str on the wire and in files: coerced on construction
    examples: int = 0
    loss_before: Optional[float] = None
    loss_after: Optional[float] = None
    tensors: dict[str, Any] = field(default_factory=dict)   # trained tensors by global name
    wall_s: float = 0.0
    peak_rss_bytes: Optional[int] = None
    activation_bytes: Optional[int] = None       # measured by autograd hooks when asked
    upload_bytes: int = 0
    download_bytes: int = 0
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)   # method-specific, e.g. FjORD's sampled widths
    upload: str = ""        # over a wire: the id the device gave this report, the same each time it resends it

    def __post_init__(self) -> None:
        self.status = ReportStatus(self.status)

    @property
    def ok(self) -> bool:
        return self.status == ReportStatus.OK

    def check(self, instruction: RoundInstruction) -> None:
        """Reject a report that does not answer the instruction it claims to answer."""
        if self.round != instruction.round:
            raise ReportRejected(f"{self.device_id}: report for round {self.round}, expected {instruction.round}")
        if self.config_hash != instruction.config_hash:
            raise ReportRejected(f"{self.device_id}: report for config {self.config_hash}, "
                                 f"expected {instruction.config_hash}")
        if self.ok and self.examples <= 0:
            raise ReportRejected(f"{self.device_id}: a successful report must count its examples")

    def summary(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "tensors"}
        d["schema"] = REPORT_SCHEMA
        return d
