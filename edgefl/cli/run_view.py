"""How a served run reads to an operator, the same in `edgefl serve`'s live view and in `edgefl status`: a
finished round's line, the round in progress (header and one line per device) from the status file's
JSON. Pure formatting: no I/O, times passed in."""
from __future__ import annotations

import time
from typing import Iterable, Mapping, Optional

from edgefl.units import format_bytes

STATUS_FILE = "status.json"
STATUS_SCHEMA = "edgefl.status/1"
ORDER = ("offline", "sent", "downloading", "training", "failed", "reported")   # who needs a look first


def listing(items: Iterable[str], shown: int = 5) -> str:
    """'a, b, c' or 'a, b, c and 4 more': a cut list says how much it left out."""
    items = list(items)
    head = ", ".join(items[:shown])
    return f"{head} and {len(items) - shown} more" if len(items) > shown else head


def round_line(r) -> str:
    """One finished round (a RoundRecord) in one line."""
    reports = sum(r.participating.values())
    acc = f"accuracy {r.accuracy:.4f}" if r.accuracy is not None else "no evaluation"
    line = (f"round {r.round}: {reports}/{len(r.sampled)} reports, {acc}, up {format_bytes(r.upload_bytes)}, "
            f"down {format_bytes(r.download_bytes)}, {r.wall_s:.1f} s")
    for what in ("skipped", "failed", "rejected"):
        if entries := getattr(r, what):
            line += f"; {what}: " + listing([f"{d} ({why})" for d, why in sorted(entries.items())], 3)
    if r.missing:
        line += f"; no report from {listing(r.missing)}"
    if not r.aggregated:
        line += "; below quorum: not aggregated"
    return line


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def header(status: Mapping, now: float) -> str:
    """'round 2 of 5: 1/4 reported, deadline in 412 s; 4/4 devices online'."""
    devices = status.get("devices", {})
    done = sum(d["state"] == "reported" for d in devices.values())
    line = f"round {status.get('round') or '-'} of {status.get('rounds', '?')}"
    if devices:
        line += f": {done}/{len(devices)} reported"
    if (deadline := status.get("deadline")) is not None:
        line += f", deadline in {max(0, deadline - now):.0f} s ({clock(deadline)})"
    expected = status.get("expected")
    if expected is not None:
        line += f"; {len(status.get('online', []))}/{expected} devices online"
    return line


def device_line(device: str, d: Mapping, group: Optional[str], now: float) -> str:
    line = f"{device:<16} {group or '':<10} {d['state']:<12} {now - d['since']:>5.0f} s"
    if d.get("bytes"):
        line += f"  {format_bytes(d['bytes'])} fetched"
    if d.get("detail"):
        line += f"  {d['detail']}"
    return line


def device_lines(status: Mapping, now: float, shown: int = 40) -> list[str]:
    """The round's devices, those that need a look first; a long fleet ends with a count of the rest."""
    devices = status.get("devices", {})
    groups = status.get("groups", {})
    order = sorted(devices, key=lambda d: (ORDER.index(devices[d]["state"]) if devices[d]["state"] in ORDER
                                           else 0, d))
    lines = [device_line(d, devices[d], groups.get(d), now) for d in order[:shown]]
    if len(order) > shown:
        rest: dict[str, int] = {}
        for d in order[shown:]:
            rest[devices[d]["state"]] = rest.get(devices[d]["state"], 0) + 1
        lines.append(f"... and {len(order) - shown} more: " + ", ".join(f"{n} {s}" for s, n in rest.items()))
    return lines
