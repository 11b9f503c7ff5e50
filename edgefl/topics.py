"""The v1 MQTT topic scheme, in one place: the coordinator's and the devices' ends of the protocol build and
parse their topics here, and the broker's ACL (edgefl.broker.acl) grants them from here.

    fl/v1/dev/<device>/down/instr                    round instruction (JSON envelope)
    fl/v1/dev/<device>/down/artifact/<sha>/manifest  an artifact's chunk manifest, or why it is refused
    fl/v1/dev/<device>/down/artifact/<sha>/c/<seq>   one chunk of it (raw bytes, never retained)
    fl/v1/dev/<device>/up/ack                        artifact flow control: want / got / bad (JSON)
    fl/v1/dev/<device>/down/receipt                  the coordinator took (or refused) an upload: the device
                                                     may forget it (JSON)
    fl/v1/dev/<device>/up/result/<round>/<upload>/meta     a report: summary, tensor order, chunk count
    fl/v1/dev/<device>/up/result/<round>/<upload>/c/<seq>  the report's flat float32 tensor buffer, chunked
                                                     (<upload>: 16 hex digits naming this report, the same
                                                     every time it is sent again)
    fl/v1/dev/<device>/up/metrics                    live metrics and progress (JSON, e.g. {"state": "training"})
    fl/v1/dev/<device>/up/hello                      a login's first publish, to learn whether the broker's
                                                     ACL lets it write there (and, for the coordinator, read)
    fl/v1/broadcast/round                            retained {"round": r, "open": bool}: the round in progress,
                                                     or the last one closed (a device drops older work)
    fl/v1/presence/<device>                          retained {"online": ...}; the device's last will
    fl/v1/group/<group>/art/<sha>/manifest           retained chunk manifest of an artifact every device of the
                                                     group gets alike (published once per group, not per device)
    fl/v1/group/<group>/art/<sha>/c/<seq>            retained chunk of it (published before its manifest)

A device writes only under its own `up/` and its presence topic and reads only its own `down/`,
`broadcast/` and its own group's `group/<group>/`, so a broker ACL per device login is enough to keep
devices (and groups) apart; only the coordinator writes under `group/`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from edgefl.errors import ConfigError

ROOT = "fl/v1"
BROADCAST_ROUND = f"{ROOT}/broadcast/round"
GROUP_MANIFESTS = f"{ROOT}/group/+/art/+/manifest"   # the coordinator finds retained ones a previous run left
COORDINATOR_FILTERS = (f"{ROOT}/dev/+/up/#", f"{ROOT}/presence/+", GROUP_MANIFESTS)
_SHA = re.compile(r"[0-9a-f]{64}")
_UPLOAD = re.compile(r"[0-9a-f]{16}")
# '/', '+' and '#' are topic syntax, '$' opens the broker's own topics, ':' separates the broker's password
# file's fields and whitespace its ACL file's; control characters have no place in any of them
_SYNTAX = "/+#:$"
# MQTT strings hold at most 65535 UTF-8 bytes, and a topic carries the id plus a 64-hex artifact id
_MAX_NAME_CHARS = 4096


def _one_level(name: str, what: str, fix: str) -> str:
    bad = next((c for c in name if c in _SYNTAX or c.isspace() or not c.isprintable()), None)
    if not name or bad or len(name) > _MAX_NAME_CHARS:
        why = f"contains {bad!r}" if bad else "is empty" if not name else f"is over {_MAX_NAME_CHARS} characters"
        raise ConfigError(f"{what} {name!r} {why}, which MQTT topics, the broker's ACL or its password file cannot "
                          f"hold; {fix} using letters, digits, '-', '_' and '.'")
    return name


def check_device_id(device_id: str) -> str:
    """A device id is one topic level, the device's MQTT client id and its login's username."""
    return _one_level(device_id, "device id", "rename it (in fleet.yaml: the group name or its ids)")


def check_group(group: str) -> str:
    """A group name is one topic level (fl/v1/group/<group>/...)."""
    return _one_level(group, "group name", "rename the group in the fleet file")


def is_sha256(text: str) -> bool:
    return bool(_SHA.fullmatch(text))


def is_upload_id(text: str) -> bool:
    return bool(_UPLOAD.fullmatch(text))


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


def receipt(device: str) -> str:
    return f"{_dev(device)}/down/receipt"


def result_meta(device: str, round: int, upload: str) -> str:
    return f"{_dev(device)}/up/result/{round}/{upload}/meta"


def result_chunk(device: str, round: int, upload: str, seq: int) -> str:
    return f"{_dev(device)}/up/result/{round}/{upload}/c/{seq}"


def metrics(device: str) -> str:
    return f"{_dev(device)}/up/metrics"


def hello(device: str) -> str:
    return f"{_dev(device)}/up/hello"


def presence(device: str) -> str:
    return f"{ROOT}/presence/{device}"


def _group(group: str, sha: str) -> str:
    return f"{ROOT}/group/{group}/art/{sha}"


def group_manifest(group: str, sha: str) -> str:
    return f"{_group(group, sha)}/manifest"


def group_chunk(group: str, sha: str, seq: int) -> str:
    return f"{_group(group, sha)}/c/{seq}"


def group_chunks(group: str, sha: str) -> str:
    """The filter for every chunk of a group's artifact."""
    return f"{_group(group, sha)}/c/+"



def device_filters(device: str) -> tuple[str, ...]:
    """What a device subscribes to: its own down/ and the broadcast topics."""
    return f"{_dev(device)}/down/#", f"{ROOT}/broadcast/#"


COORDINATOR_GRANT = f"{ROOT}/#"      # the coordinator reads and writes everything under the root


def device_grants(device: str, group: Optional[str] = None) -> tuple[tuple[str, str], ...]:
    """(access, filter) a device's login is granted: it writes only under its own up/ and its presence topic
    (its last will), and reads only its own down/, the broadcast topics and its group's shared topics."""
    dev = _dev(check_device_id(device))
    shared = (("read", f"{ROOT}/group/{check_group(group)}/#"),) if group is not None else ()
    return (("write", f"{dev}/up/#"), ("write", presence(device)), ("read", f"{dev}/down/#"),
            ("read", f"{ROOT}/broadcast/#")) + shared


@dataclass(frozen=True)
class Topic:
    """A parsed v1 topic. kind: instr | receipt | manifest | chunk | ack | result_meta | result_chunk | metrics |
    hello | presence | broadcast; a group's manifest or chunk has `group` set and no `device`."""
    kind: str
    device: Optional[str] = None
    sha: Optional[str] = None
    seq: Optional[int] = None
    round: Optional[int] = None
    group: Optional[str] = None
    upload: Optional[str] = None


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
        if rest[:1] == ["group"] and len(rest) >= 5 and rest[2] == "art" and is_sha256(rest[3]):
            if rest[4:] == ["manifest"]:
                return Topic("manifest", sha=rest[3], group=rest[1])
            if rest[4] == "c" and len(rest) == 6:
                return Topic("chunk", sha=rest[3], seq=int(rest[5]), group=rest[1])
            return None
        if rest[:1] != ["dev"] or len(rest) < 4:
            return None
        device, path = rest[1], rest[2:]
        if path == ["down", "instr"]:
            return Topic("instr", device)
        if path == ["down", "receipt"]:
            return Topic("receipt", device)
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
        if path[:2] == ["up", "result"] and len(path) >= 5 and is_upload_id(path[3]):
            if path[4:] == ["meta"]:
                return Topic("result_meta", device, round=int(path[2]), upload=path[3])
            if path[4] == "c" and len(path) == 6:
                return Topic("result_chunk", device, round=int(path[2]), seq=int(path[5]), upload=path[3])
    except ValueError:  # a non-numeric round or sequence number
        return None
    return None


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching: '+' is one level, a trailing '#' any number (zero included); wildcards
    never match a first level starting with '$' (the broker's own topics)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def filter_covered(pattern: str, subscription: str) -> bool:
    """True when every topic `subscription` can match is also matched by `pattern`."""
    p, s = pattern.split("/"), subscription.split("/")
    for i, level in enumerate(p):
        if level == "#":
            return True
        if i >= len(s) or s[i] == "#" or (level != "+" and level != s[i]):
            return False
    return len(p) == len(s)
