"""The v1 MQTT topic scheme (ARCHITECTURE.md, "MQTT topics (v1)"), in one place.

    fl/v1/dev/<device>/down/instr                    round instruction (JSON envelope)
    fl/v1/dev/<device>/down/artifact/<sha>/manifest  an artifact's chunk manifest, or why it is refused
    fl/v1/dev/<device>/down/artifact/<sha>/c/<seq>   one chunk of it (raw bytes, never retained)
    fl/v1/dev/<device>/up/ack                        artifact flow control: want / got / bad (JSON)
    fl/v1/dev/<device>/up/result/<round>/meta        a report: summary, tensor order, chunk count
    fl/v1/dev/<device>/up/result/<round>/c/<seq>     the report's flat float32 tensor buffer, chunked
    fl/v1/dev/<device>/up/metrics                    live metrics and progress (JSON, e.g. {"state": "training"})
    fl/v1/dev/<device>/up/hello                      a login's first publish, to learn whether the broker's
                                                     ACL lets it write there (and, for the coordinator, read)
    fl/v1/broadcast/round                            small retained pointer to the current round
    fl/v1/presence/<device>                          retained {"online": ...}; the device's last will

A device writes only under its own `up/` and its presence topic and reads only its own `down/` and
`broadcast/`, so a broker ACL per device login is enough to keep devices apart.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from edgefl.errors import ConfigError

ROOT = "fl/v1"
BROADCAST_ROUND = f"{ROOT}/broadcast/round"
COORDINATOR_FILTERS = (f"{ROOT}/dev/+/up/#", f"{ROOT}/presence/+")
_SHA = re.compile(r"[0-9a-f]{64}")


def check_device_id(device_id: str) -> str:
    """A device id is one topic level (and the device's MQTT client id)."""
    bad = next((c for c in device_id if c in "/+#$" or c.isspace() or not c.isprintable()), None)
    if not device_id or bad:
        what = f"contains {bad!r}" if bad else "is empty"
        raise ConfigError(f"device id {device_id!r} {what}; MQTT topics cannot hold it: use letters, digits, "
                          "'-', '_' and '.'")
    return device_id


def is_sha256(text: str) -> bool:
    return bool(_SHA.fullmatch(text))


def _dev(device: str) -> str:
    return f"{ROOT}/dev/{device}"


def instruction(device: str) -> str:
    return f"{_dev(device)}/down/instr"


def artifact_manifest(device: str, sha: str) -> str:
    return f"{_dev(device)}/down/artifact/{sha}/manifest"


def artifact_chunk(device: str, sha: str, seq: int) -> str:
    return f"{_dev(device)}/down/artifact/{sha}/c/{seq}"


def ack(device: str) -> str:
    return f"{_dev(device)}/up/ack"


def result_meta(device: str, round: int) -> str:
    return f"{_dev(device)}/up/result/{round}/meta"


def result_chunk(device: str, round: int, seq: int) -> str:
    return f"{_dev(device)}/up/result/{round}/c/{seq}"


def metrics(device: str) -> str:
    return f"{_dev(device)}/up/metrics"


def hello(device: str) -> str:
    return f"{_dev(device)}/up/hello"


def presence(device: str) -> str:
    return f"{ROOT}/presence/{device}"


def device_filters(device: str) -> tuple[str, ...]:
    """What a device subscribes to: its own down/ and the broadcast topics."""
    return f"{_dev(device)}/down/#", f"{ROOT}/broadcast/#"


@dataclass(frozen=True)
class Topic:
    """A parsed v1 topic. kind: instr | manifest | chunk | ack | result_meta | result_chunk | metrics | hello |
    presence | broadcast."""
    kind: str
    device: Optional[str] = None
    sha: Optional[str] = None
    seq: Optional[int] = None
    round: Optional[int] = None


def parse(topic: str) -> Optional[Topic]:
    """The meaning of a v1 topic, or None for anything else (which a receiver ignores)."""
    parts = topic.split("/")
    if parts[:2] != ROOT.split("/"):
        return None
    rest = parts[2:]
    try:
        if rest[:1] == ["presence"] and len(rest) == 2:
            return Topic("presence", device=rest[1])
        if rest[:1] == ["broadcast"]:
            return Topic("broadcast")
        if rest[:1] != ["dev"] or len(rest) < 4:
            return None
        device, path = rest[1], rest[2:]
        if path == ["down", "instr"]:
            return Topic("instr", device)
        if path[:2] == ["down", "artifact"] and len(path) >= 4 and is_sha256(path[2]):
            if path[3:] == ["manifest"]:
                return Topic("manifest", device, sha=path[2])
            if path[3] == "c" and len(path) == 5:
                return Topic("chunk", device, sha=path[2], seq=int(path[4]))
        if path == ["up", "ack"]:
            return Topic("ack", device)
        if path == ["up", "metrics"]:
            return Topic("metrics", device)
        if path == ["up", "hello"]:
            return Topic("hello", device)
        if path[:2] == ["up", "result"] and len(path) >= 4:
            if path[3:] == ["meta"]:
                return Topic("result_meta", device, round=int(path[2]))
            if path[3] == "c" and len(path) == 5:
                return Topic("result_chunk", device, round=int(path[2]), seq=int(path[4]))
    except ValueError:  # a non-numeric round or sequence number
        return None
    return None


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching ('+' one level, '#' the rest)."""
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)
