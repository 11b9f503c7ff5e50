"""The shipped device profiles, and the profile parser's rejection of incomplete ones."""
from __future__ import annotations

import pytest
import yaml

from edgefl.errors import ConfigError
from edgefl.hardware import DeviceProfile, load_profile, profile_names
from edgefl.hardware.profiles import NUMBER_FIELDS, parse_profile

REQUIRED = {
    "raspberry-pi-zero-2w", "raspberry-pi-3b-plus", "raspberry-pi-4-2gb", "raspberry-pi-4-4gb",
    "raspberry-pi-4-8gb", "raspberry-pi-5-4gb", "raspberry-pi-5-8gb", "jetson-nano-4gb",
    "android-low", "android-mid", "android-high",
}
ESTIMATE = "estimate, unmeasured: "

GOOD = {
    "name": "test-board",
    "description": "A test board.",
    "runtime": "ort",
    "ram": "1GiB",
    "memory_budget": "512MiB",
    "sustained_gflops": 2.5,
    "uplink": "20Mbit/s",
    "power_idle": "1W",
    "power_active": "3.5W",
    "sources": {f: f"{ESTIMATE}test value" for f in NUMBER_FIELDS},
}
_DROP = object()   # a key to leave out


def _text(**changes) -> str:
    raw = {**GOOD, **changes}
    return yaml.safe_dump({k: v for k, v in raw.items() if v is not _DROP})


def test_required_profiles_exist():
    assert REQUIRED <= set(profile_names())


@pytest.mark.parametrize("name", profile_names())
def test_profile_loads_and_is_consistent(name):
    p = load_profile(name)
    assert isinstance(p, DeviceProfile)
    assert p.name == name
    assert p.description.strip() and "\n" not in p.description
    assert p.runtime in ("ort", "executorch", "torch")
    assert set(p.sources) == set(NUMBER_FIELDS)
    for field, source in p.sources.items():
        assert source.strip(), f"{name}: sources.{field} is empty"
        # an estimate must say why, after the exact marker
        if source.startswith("estimate"):
            assert source.startswith(ESTIMATE) and source[len(ESTIMATE):].strip(), f"{name}: sources.{field}"
    assert 0 < p.memory_budget_bytes < p.ram_bytes
    assert 0 < p.power_idle_w < p.power_active_w
    assert p.sustained_flops > 0 and p.uplink_bits_per_s > 0


def test_runtime_defaults():
    """Every Raspberry Pi trains natively (no aarch64 ORT-training wheel; aarch64 torch is the CUDA build)."""
    for name in ("android-low", "android-mid", "android-high"):
        assert load_profile(name).runtime == "ort", name
    assert load_profile("jetson-nano-4gb").runtime == "torch"
    for name in REQUIRED:
        if name.startswith("raspberry-pi"):
            assert load_profile(name).runtime == "executorch", name
            assert "native trainer" in load_profile(name).description, name


def test_android_budgets_by_tier():
    low, mid, high = (load_profile(f"android-{t}").memory_budget_bytes for t in ("low", "mid", "high"))
    assert 256 * 2**20 <= low <= 512 * 2**20
    assert low < mid < high


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ConfigError, match="raspberry-pi-zero-2w"):
        load_profile("pi-zero")


def test_parse_good_profile():
    p = parse_profile(_text(), "test.yaml")
    assert p.ram_bytes == 2**30 and p.memory_budget_bytes == 512 * 2**20
    assert p.sustained_flops == 2.5e9 and p.uplink_bits_per_s == 2e7
    assert (p.power_idle_w, p.power_active_w) == (1.0, 3.5)


@pytest.mark.parametrize("field", NUMBER_FIELDS)
def test_missing_source_is_rejected(field):
    sources = {f: v for f, v in GOOD["sources"].items() if f != field}
    with pytest.raises(ConfigError, match=rf"bad\.yaml: sources has no entry for {field}"):
        parse_profile(_text(sources=sources), "bad.yaml")


@pytest.mark.parametrize("empty", ["", "   ", None])
def test_empty_source_is_rejected(empty):
    with pytest.raises(ConfigError, match="sources has no entry for uplink"):
        parse_profile(_text(sources={**GOOD["sources"], "uplink": empty}), "bad.yaml")


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown key\(s\) colour"):
        parse_profile(_text(colour="red"), "bad.yaml")


def test_missing_key_is_rejected():
    with pytest.raises(ConfigError, match=r"missing key\(s\) power_idle"):
        parse_profile(_text(power_idle=_DROP), "bad.yaml")


def test_unknown_source_key_is_rejected():
    with pytest.raises(ConfigError, match="sources.colour: unknown key"):
        parse_profile(_text(sources={**GOOD["sources"], "colour": "a paint chart"}), "bad.yaml")


@pytest.mark.parametrize("changes, message", [
    ({"runtime": "tflite"}, "runtime is 'tflite'"),
    ({"ram": "lots"}, "ram: cannot parse 'lots'"),
    ({"sustained_gflops": "8GFLOP/s"}, "sustained_gflops: '8GFLOP/s' is not a plain number"),
    ({"sustained_gflops": -1}, "sustained_gflops must be greater than zero"),
    ({"memory_budget": "2GiB"}, "memory_budget .* exceeds ram"),
    ({"power_active": "-3W"}, "power_active: '-3W' is negative"),
    ({"sources": "datasheet"}, "sources must be a mapping"),
    ({"description": ""}, "description must be a non-empty string"),
])
def test_bad_values_are_rejected(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse_profile(_text(**changes), "bad.yaml")


@pytest.mark.parametrize("text", ["", "- a list\n", "name: [unclosed\n"])
def test_not_a_profile(text):
    with pytest.raises(ConfigError, match=r"^bad\.yaml: "):
        parse_profile(text, "bad.yaml")
