"""Read the device profiles shipped in `profiles/*.yaml`.

A profile states what a class of device has (RAM, sustained compute, uplink, power) and, for every
number, where it comes from (a datasheet, a measurement, or "estimate, unmeasured"). Fleet groups take
their defaults from a profile and may override them.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from edgefl.errors import ConfigError
from edgefl.units import parse_bitrate, parse_bytes, parse_watts

NUMBER_FIELDS = ("ram", "memory_budget", "sustained_gflops", "uplink", "power_idle", "power_active")
_RUNTIMES = ("ort", "executorch", "torch")


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    ram_bytes: int
    memory_budget_bytes: int      # default peak training memory the device grants
    sustained_flops: float        # FLOP/s sustained in training
    uplink_bits_per_s: float
    power_idle_w: float
    power_active_w: float
    runtime: str
    sources: dict[str, str]


def profile_names() -> list[str]:
    folder = resources.files("edgefl.hardware") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


@lru_cache(maxsize=None)
def load_profile(name: str) -> DeviceProfile:
    names = profile_names()
    if name not in names:
        close = [n for n in names if name and name in n] or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ConfigError(f"unknown device profile {name!r}; {hint}known profiles: {', '.join(names)}")
    path = resources.files("edgefl.hardware") / "profiles" / f"{name}.yaml"
    where = f"hardware/profiles/{name}.yaml"
    profile = parse_profile(path.read_text(), where)
    if profile.name != name:
        raise ConfigError(f"{where}: name is {profile.name!r} but the file is {name}.yaml; make them match")
    return profile


def parse_profile(text: str, where: str = "profile.yaml") -> DeviceProfile:
    """Parse one profile's YAML text; `where` names it in error messages."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: YAML syntax error{at}: {getattr(exc, 'problem', None) or 'invalid YAML'}") from None
    expected = {"name", "description", "runtime", "sources", *NUMBER_FIELDS}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with exactly the keys {', '.join(sorted(expected))}")
    unknown, missing = sorted(set(raw) - expected, key=str), sorted(expected - set(raw))
    if unknown or missing:
        parts = ([f"unknown key(s) {', '.join(map(str, unknown))}"] if unknown else []) + \
                ([f"missing key(s) {', '.join(missing)}"] if missing else [])
        raise ConfigError(f"{where}: {'; '.join(parts)}; a profile has exactly the keys {', '.join(sorted(expected))}")
    sources = raw["sources"]
    if not isinstance(sources, dict):
        raise ConfigError(f"{where}: sources must be a mapping from each of {', '.join(NUMBER_FIELDS)} to its source")
    extra = sorted(set(sources) - set(NUMBER_FIELDS), key=str)
    if extra:
        raise ConfigError(f"{where}: sources.{extra[0]}: unknown key; sources names only {', '.join(NUMBER_FIELDS)}")
    missing = [f for f in NUMBER_FIELDS if sources.get(f) is None or not str(sources[f]).strip()]
    if missing:
        raise ConfigError(f"{where}: sources has no entry for {', '.join(missing)}; "
                          "give a reference or 'estimate, unmeasured: <reasoning>'")
    if raw["runtime"] not in _RUNTIMES:
        raise ConfigError(f"{where}: runtime is {raw['runtime']!r}; use one of {', '.join(_RUNTIMES)}")
    for key in ("name", "description"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string")

    def number(key, parse):
        try:
            return parse(raw[key])
        except ValueError as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None

    ram = number("ram", parse_bytes)
    budget = number("memory_budget", parse_bytes)
    gflops = number("sustained_gflops", _plain_number)
    uplink = number("uplink", parse_bitrate)
    idle = number("power_idle", parse_watts)
    active = number("power_active", parse_watts)
    for key, value in (("ram", ram), ("memory_budget", budget), ("sustained_gflops", gflops),
                       ("uplink", uplink), ("power_active", active)):
        if value <= 0:
            raise ConfigError(f"{where}: {key} must be greater than zero")
    if budget > ram:
        raise ConfigError(f"{where}: memory_budget ({raw['memory_budget']}) exceeds ram ({raw['ram']}); "
                          "grant at most what the device has")
    return DeviceProfile(
        name=raw["name"], description=" ".join(raw["description"].split()),
        ram_bytes=ram, memory_budget_bytes=budget, sustained_flops=gflops * 1e9,
        uplink_bits_per_s=uplink, power_idle_w=idle, power_active_w=active,
        runtime=raw["runtime"], sources={k: str(v) for k, v in sources.items()},
    )


def _plain_number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a plain number; write GFLOP/s as a number, e.g. 8")
    return float(value)
