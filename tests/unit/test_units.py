"""edgefl.units: parsing and printing sizes, FLOPs, watts and bit rates."""
from __future__ import annotations

import math

import pytest

from edgefl.units import format_bytes, format_flops, parse_bitrate, parse_bytes, parse_flops, parse_watts


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 536870912),
    ("1.5GB", 1500000000),
    ("4MB", 4000000),
    ("2GiB", 2 * 2**30),
    ("180 MiB", 180 * 2**20),
    (" 1KiB ", 1024),
    ("1kB", 1000),
    ("512Mi", 536870912),      # Kubernetes-style: a binary prefix alone means bytes
    ("100B", 100),
    ("3 bytes", 3),
    ("1e3", 1000),
    ("1.5e3KB", 1500000),
    ("4096", 4096),
    (4096, 4096),
    (1.5e9, 1500000000),
    (0, 0),
])
def test_parse_bytes(text, expected):
    value = parse_bytes(text)
    assert value == expected and isinstance(value, int)


@pytest.mark.parametrize("text, expected", [
    ("50GFLOP", 5e10), ("50 GFLOPs", 5e10), ("1.2TFLOP", 1.2e12), ("3kflop", 3e3), ("1000", 1e3), (7, 7.0),
])
def test_parse_flops(text, expected):
    assert parse_flops(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, expected", [("2.5W", 2.5), ("0.05W", 0.05), ("6 W", 6.0), ("1kW", 1000.0), (3, 3.0)])
def test_parse_watts(text, expected):
    assert parse_watts(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, expected", [
    ("20Mbit/s", 2e7), ("1Gbit/s", 1e9), ("500 kbps", 5e5), ("2MB/s", 1.6e7), ("1Mibit/s", 2**20), ("9600", 9600.0),
])
def test_parse_bitrate(text, expected):
    assert parse_bitrate(text) == pytest.approx(expected)


PARSERS = [parse_bytes, parse_flops, parse_watts, parse_bitrate]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("text", ["-5", "-1.5MiB", "-2W", "-20Mbit/s", "-50GFLOP", -3, -0.5])
def test_negative_raises_with_input(parse, text):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert repr(text) in str(info.value) or str(text) in str(info.value)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("text", ["", "lots", "MiB", "1,5GB", "5 5", "nan", "inf", "1e400", "None"])
def test_unparsable_raises_with_input(parse, text):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("parse, text", [
    (parse_flops, "5GB"), (parse_flops, "10GFLOP/s"),
    (parse_watts, "5 mW"), (parse_watts, "5 J"), (parse_bitrate, "5 Mbit"), (parse_bitrate, "5 W"),
])
def test_unknown_unit_raises_with_input_and_unit_list(parse, text):
    with pytest.raises(ValueError, match="unknown unit") as info:
        parse(text)
    assert repr(text) in str(info.value) and "use one of" in str(info.value)


@pytest.mark.parametrize("text, says", [
    ("4Mb", "'4Mb' is in megabits; a size is in bytes: write 4MB or 4MiB"),
    ("8Mbit", "'8Mbit' is in megabits; a size is in bytes: write 8MB or 8MiB"),
    ("2 Gbits", "'2 Gbits' is in gigabits; a size is in bytes: write 2GB or 2GiB"),
    ("128 mb", "unknown unit 'mb' in '128 mb'; a size is in bytes (B) with a decimal (kB, MB, GB, TB) or binary "
               "(KiB, MiB, GiB, TiB) prefix: write 128MB or 128MiB"),
    ("64mib", "write 64MB or 64MiB"), ("1 gb", "write 1GB or 1GiB"), ("16kb", "'16kb' is in kilobits"),
    ("5 XB", "unknown unit 'XB' in '5 XB'"), ("5W", "e.g. 5MB or 5MiB"),
])
def test_a_size_in_bits_or_with_a_lower_case_prefix_is_refused_with_the_spelling_meant(text, says):
    """A byte budget is never read in bits (4Mb was 488 KiB), and the error lists MB and MiB."""
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert says in str(info.value)


@pytest.mark.parametrize("parse, text", [(parse_flops, "2MiFLOP"), (parse_watts, "3KiW"), (parse_watts, "2Gi")])
def test_binary_prefix_rejected_where_meaningless(parse, text):
    with pytest.raises(ValueError, match="binary prefix") as info:
        parse(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf")])
def test_non_numbers_raise(parse, value):
    with pytest.raises(ValueError) as info:
        parse(value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("n, expected", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (187904819, "179 MiB"), (512 * 2**20, "512 MiB"),
    (1000 * 2**20, "0.977 GiB"),       # not '1e+03 MiB'
    (1023.9 * 2**10, "1 MiB"),         # not '1.02e+03 KiB'
    (3 * 2**40, "3 TiB"),
])
def test_format_bytes(n, expected):
    assert format_bytes(n) == expected


@pytest.mark.parametrize("n, expected", [
    (0, "0 FLOP"), (5e10, "50 GFLOP"), (999.7e9, "1 TFLOP"), (123456, "123 kFLOP"), (2.5e15, "2.5 PFLOP"),
])
def test_format_flops(n, expected):
    assert format_flops(n) == expected


@pytest.mark.parametrize("n", [1, 999, 1023, 1024, 1536, 10**6, 187904819, 2**30 - 1, 1000 * 2**20, 7.3e9,
                               2**40, 12345678901234])
def test_bytes_round_trip(n):
    text = format_bytes(n)
    assert "e" not in text.split()[0]
    assert parse_bytes(text) == pytest.approx(n, rel=5e-3, abs=1)


@pytest.mark.parametrize("n", [0.5, 999.4, 999.7, 1e3, 4.2e7, 5e10, 999.7e9, 1.23e14, 2e18])
def test_flops_round_trip(n):
    text = format_flops(n)
    assert "e" not in text.split()[0]
    assert parse_flops(text) == pytest.approx(n, rel=5e-3)


def test_parsed_values_are_finite():
    for parse, text in [(parse_bytes, "9TiB"), (parse_flops, "9PFLOP"), (parse_watts, "9kW"), (parse_bitrate, "9Tbit/s")]:
        assert math.isfinite(parse(text))
