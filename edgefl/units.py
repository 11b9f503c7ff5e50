"""Parse and print quantities: bytes, FLOPs, watts, bit rates; and lists of names, cut to a few.

Decimal prefixes (k, M, G, T) are powers of 1000, binary ones (Ki, Mi, Gi, Ti) powers of 1024,
as in IEC 80000-13. A bare number is taken in the base unit. A size is in bytes (B): a size written in bits
('4Mb', megabits: 488 KiB) or with a lower-case prefix ('128 mb') is refused with the spelling it most likely
meant, never read as something else.
"""
from __future__ import annotations

import math
import re
from typing import Iterable

_PREFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_PATTERN = re.compile(_NUMBER + r"\s*(?P<prefix>Ki|Mi|Gi|Ti|[kKMGTP]?)(?P<unit>[A-Za-z/]*)\s*$")

# unit spellings accepted for each quantity, and the factor to the base unit
_UNITS: dict[str, dict[str, float]] = {
    "bytes": {"": 1, "B": 1, "byte": 1, "bytes": 1},
    "flops": {"": 1, "FLOP": 1, "FLOPs": 1, "FLOPS": 1, "flop": 1, "flops": 1},
    "watts": {"": 1, "W": 1, "w": 1},
    "bits_per_second": {"": 1, "bit/s": 1, "bps": 1, "b/s": 1, "bits/s": 1, "B/s": 8},
}

# how each quantity is named in messages, with an example of its spelling
_NAME: dict[str, str] = {"bytes": "a size in bytes (e.g. 512MiB)", "flops": "a FLOP count (e.g. 50GFLOP)",
         "watts": "a power (e.g. 2.5W)", "bits_per_second": "a bit rate (e.g. 20Mbit/s)"}


def _parse(text: str | int | float, quantity: str) -> float:
    if isinstance(text, bool):
        raise ValueError(f"expected {_NAME[quantity]}, got the boolean {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _PATTERN.match(str(text).strip())
        if not m:
            raise ValueError(f"cannot parse {text!r} as {_NAME[quantity]}")
        units = _UNITS[quantity]
        unit = m["unit"]
        if unit not in units:
            if quantity == "bytes":
                raise ValueError(_size_fix(text, m["num"], m["prefix"], unit))
            raise ValueError(f"unknown unit {unit!r} in {text!r} (use one of: "
                             f"{', '.join(u for u in units if u)})")
        binary = m["prefix"] in ("Ki", "Mi", "Gi", "Ti")
        if binary and quantity in ("flops", "watts"):
            raise ValueError(f"binary prefix {m['prefix']!r} in {text!r} makes no sense for "
                             f"{quantity}; use a decimal one (k, M, G, T)")
        if quantity == "bytes" and binary and unit == "":
            unit = "B"  # '512Mi' reads as MiB, as in Kubernetes quantities
        value = float(m["num"]) * _PREFIX[m["prefix"]] * units[unit]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    if value < 0:
        raise ValueError(f"{text!r} is negative; expected {_NAME[quantity]}")
    return value


_BITS = {"b", "bit", "bits"}
_PREFIX_NAME = {"": "", "k": "kilo", "K": "kilo", "M": "mega", "G": "giga", "T": "tera", "P": "peta", "Ki": "kibi",
                "Mi": "mebi", "Gi": "gibi", "Ti": "tebi"}


def _size_fix(text, number: str, prefix: str, unit: str) -> str:
    """Why `text` is no size in bytes, and the spellings it most likely meant ('4Mb' -> 4MB or 4MiB)."""
    letter = (prefix or unit[:1]).upper().replace("I", "")[:1]
    if letter not in ("K", "M", "G", "T"):
        letter = ""
    meant = (f"write {number}{letter.replace('K', 'k')}B or {number}{letter}iB" if letter
             else f"e.g. {number}MB or {number}MiB")
    if unit in _BITS:
        return f"{text!r} is in {_PREFIX_NAME.get(prefix, '')}bits; a size is in bytes: {meant}"
    return (f"unknown unit {unit!r} in {text!r}; a size is in bytes (B) with a decimal (kB, MB, GB, TB) or binary "
            f"(KiB, MiB, GiB, TiB) prefix: {meant}")


def parse_bytes(text: str | int | float) -> int:
    """'512MiB' -> 536870912, '1.5GB' -> 1500000000; '4Mb' (bits) is refused."""
    return int(round(_parse(text, "bytes")))


def parse_flops(text: str | int | float) -> float:
    """'50GFLOP' -> 5e10."""
    return _parse(text, "flops")


def parse_watts(text: str | int | float) -> float:
    """'2.5W' -> 2.5."""
    return _parse(text, "watts")


def parse_bitrate(text: str | int | float) -> float:
    """'20Mbit/s' -> 2e7 bits per second."""
    return _parse(text, "bits_per_second")


def format_bytes(n: float) -> str:
    """Binary prefixes, three significant digits: 187904819 -> '179 MiB'; under 1 KiB whole bytes."""
    if abs(n) < 2**10:
        return f"{int(n)} B"
    return _format(n, (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)))


def format_flops(n: float) -> str:
    """Decimal prefixes, three significant digits: 5e10 -> '50 GFLOP'."""
    return _format(n, (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3),
                       ("FLOP", 1)))


def _format(n: float, units: tuple[tuple[str, float], ...]) -> str:
    """The largest unit the value reaches, three significant digits, never scientific notation:
    a value that rounds up to 1000 of a unit (1023.9 KiB, 999.7 GFLOP) moves to the next unit."""
    for i, (unit, scale) in enumerate(units):
        if abs(n) >= scale or i == len(units) - 1:
            value = n / scale
            if i > 0 and abs(float(f"{value:.3g}")) >= 1000:
                unit, scale = units[i - 1]
                value = n / scale
            return f"{_three_digits(value)} {unit}"
    raise AssertionError("unreachable")


def _three_digits(value: float) -> str:
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text


def listing(items: Iterable[str], shown: int = 5) -> str:
    """'a, b, c' or 'a, b, c and 4 more': a cut list says how much it left out."""
    items = list(items)
    head = ", ".join(items[:shown])
    return f"{head} and {len(items) - shown} more" if len(items) > shown else head
