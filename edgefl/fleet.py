"""fleet.yaml: named device groups with budgets, typed and validated.

    fleet:
      name: campus
      groups:
        zero:
          count: 40
          profile: raspberry-pi-zero-2w
          memory_budget: 180MiB
          upload_budget: 2MB

A group's profile supplies defaults (memory budget, runtime); the group's own keys override them. `agent:`
names the program that stays resident on its devices, whose memory the plan counts against the memory budget:
`native` (`bin/edgefl-device` of a bundle, or the library an app embeds) or `python` (`edgefl-device` from the
wheels). The native agent trains ExecuTorch sets only, so the default follows the runtime (`default_agent`):
native for executorch, python for ort and torch; `agent: native` with another runtime is refused, since no
native agent could keep that plan's promise.
Every error names the file, the field and the fix, in one line.

Device ids: `ids: [...]` lists them; `count: N` names them `<group>-0` ... `<group>-<N-1>` (`device_id`),
never padded, so an id does not depend on the count: a fleet of 2 and one of 40 both have `zero-0` and
`zero-1`, and the logins of a full deployment serve a subset fleet file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgefl.errors import ConfigError
from edgefl.hardware import DeviceProfile, load_profile
from edgefl.units import parse_bytes, parse_flops

Runtime = Literal["ort", "executorch", "torch"]
Agent = Literal["native", "python"]
DEFAULT_AGENT = "native"     # for ExecuTorch, the runtime the native agent trains; see default_agent
_SIZE_EXAMPLE = {"memory_budget": "180MiB", "upload_budget": "2MB", "flops_budget": "50GFLOP"}
# every device gets a name in memory: a mistyped count (4000000000) must fail, not hang the loader
MAX_DEVICES = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class GroupSpec(_Strict):
    count: Optional[int] = Field(default=None, ge=1, strict=True)
    ids: Optional[list[str]] = None
    profile: Optional[str] = None
    # sizes and FLOPs are written with units ('180MiB', '60GFLOP'): parsed into bytes and FLOPs before validation
    memory_budget: Optional[int] = None
    upload_budget: Optional[int] = None
    flops_budget: Optional[float] = None
    runtime: Optional[Runtime] = None
    # the program that stays resident on the device beside each round's training process: its memory is
    # part of what the plan promises (edgefl.cost.constants.AGENTS)
    agent: Optional[Agent] = None
    examples: Optional[int] = Field(default=None, ge=1, strict=True)

    @field_validator("memory_budget", "upload_budget", mode="before")
    @classmethod
    def _size(cls, v):
        return None if v is None else _positive(parse_bytes(v))

    @field_validator("flops_budget", mode="before")
    @classmethod
    def _flops(cls, v):
        return None if v is None else _positive(parse_flops(v))

    @field_validator("ids")
    @classmethod
    def _ids(cls, v):
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("ids must be a non-empty list of distinct device names")
        return v


def default_agent(runtime: str) -> str:
    """The agent a group of `runtime` runs unless its entry says otherwise: the native one where it can train
    (ExecuTorch), else the Python agent, so that the plan counts what will be resident."""
    return DEFAULT_AGENT if runtime == "executorch" else "python"


def _positive(value):
    if value <= 0:
        raise ValueError("must be greater than zero")
    return value


class FleetBody(_Strict):
    name: str = "fleet"
    groups: dict[str, GroupSpec]

    @field_validator("groups")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("the fleet has no groups; add at least one under fleet.groups")
        return v


class FleetFile(_Strict):
    fleet: FleetBody


@dataclass(frozen=True)
class Group:
    """A device group with every default resolved."""
    name: str
    device_ids: tuple[str, ...]
    memory_budget_bytes: int
    upload_budget_bytes: Optional[int]
    flops_budget: Optional[float]           # FLOPs per round
    runtime: str
    examples: Optional[int]
    profile: Optional[DeviceProfile]
    agent: str = DEFAULT_AGENT              # the device agent kind: native | python

    @property
    def count(self) -> int:
        return len(self.device_ids)


@dataclass(frozen=True)
class Fleet:
    name: str
    groups: tuple[Group, ...]

    @property
    def device_count(self) -> int:
        return sum(g.count for g in self.groups)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r} in fleet {self.name!r}; groups: {', '.join(g.name for g in self.groups)}")


def device_id(group: str, index: int) -> str:
    """The id `count: N` gives a group's device `index` (0-based); independent of N."""
    return f"{group}-{index}"


def load_fleet(path: str | Path) -> Fleet:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the fleet file ({exc.strerror}); check the --devices path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: byte {exc.start} is not UTF-8 text; save the fleet file as UTF-8") from None
    return parse_fleet(text, str(path))


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, mark):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.mark = key, mark


class _Loader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the last)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # unhashable key: construct_mapping reports it
            continue
        if duplicate:
            raise _DuplicateKey(key, key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_fleet(text: str, where: str = "fleet.yaml") -> Fleet:
    try:
        raw = yaml.load(text, Loader=_Loader)
    except _DuplicateKey as exc:
        raise ConfigError(f"{where}: line {exc.mark.line + 1}: key {exc.key!r} is given twice in the same mapping; "
                          "rename or merge one of them (YAML would silently keep only the last)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = _one_line(getattr(exc, "problem", None) or "invalid YAML")
        raise ConfigError(f"{where}: YAML syntax error{at}: {problem}; fix the indentation or quoting there") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with a top-level 'fleet' key, e.g. 'fleet: {{groups: ...}}'")
    try:
        spec = FleetFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None
    return _resolve(spec.fleet, where)


_GROUP_KEYS = ", ".join(GroupSpec.model_fields)
# allowed keys, by depth of the mapping that holds them: top level, under fleet, in a group
_ALLOWED = {1: "fleet", 2: ", ".join(FleetBody.model_fields), 4: _GROUP_KEYS}
# what a mapping at each path holds, for "expected a mapping" errors
_MAPPING_OF = {1: "with the keys name (optional) and groups, e.g. 'fleet: {groups: {zero: {count: 40, ...}}}'",
               2: f"from group name to the group's settings ({_GROUP_KEYS})",
               3: f"of the group's settings ({_GROUP_KEYS})"}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: ValidationError) -> str:
    """The first validation error as 'field.path: what is wrong (got X); how to fix it'."""
    err = exc.errors()[0]
    path = err["loc"]
    loc = ".".join(str(p) for p in path)
    field = str(path[-1]) if path else ""
    shown = "input" in err and not isinstance(err["input"], (dict, list))
    got = f" (got {err['input']!r})" if shown else ""
    if err["type"] == "extra_forbidden":
        allowed = _ALLOWED.get(len(path), "")
        return f"{loc}: unknown key {field!r}; allowed keys here: {allowed} (check the spelling and indentation)"
    if err["type"] == "missing":
        if path == ("fleet", "groups"):
            return f"{loc}: required key is missing; add 'groups:' mapping each group name to its settings ({_GROUP_KEYS})"
        return f"{loc}: required key is missing; add it"
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return f"{loc}: expected a mapping {_MAPPING_OF.get(len(path), '')}{got}".rstrip()
    msg = _one_line(err["msg"].removeprefix("Value error, "))
    if shown and repr(err["input"]) in msg:
        got = ""
    fix = ""
    if field in _SIZE_EXAMPLE and "e.g." not in msg and "write " not in msg:   # units says how to write it
        fix = f"; write e.g. {_SIZE_EXAMPLE[field]}"
    elif err["type"] == "string_type":
        fix = "; quote it"
    return f"{loc}: {msg}{got}{fix}"


def _resolve(body: FleetBody, where: str) -> Fleet:
    groups: list[Group] = []
    seen: set[str] = set()
    owner: dict[str, str] = {}
    for name, g in body.groups.items():
        at = f"{where}: fleet.groups.{name}"
        if g.count is not None and g.ids is not None:
            raise ConfigError(f"{at}: has both count and ids; keep exactly one of them "
                              "(count: N generates the device names, ids: [...] lists them)")
        if g.count is None and g.ids is None:
            raise ConfigError(f"{at}.count: missing; give count: N or ids: [device names] (exactly one of them)")
        if g.count is not None and len(seen) + g.count > MAX_DEVICES:
            raise ConfigError(f"{at}.count: {g.count} devices take the fleet past {MAX_DEVICES}, the most edgefl "
                              "expands into device names; check the number, or split the fleet")
        profile = None
        if g.profile is not None:
            try:
                profile = load_profile(g.profile)
            except ConfigError as exc:
                raise ConfigError(f"{at}.profile: {exc}") from None
        memory = g.memory_budget if g.memory_budget is not None else profile.memory_budget_bytes if profile else None
        if memory is None:
            raise ConfigError(f"{at}.memory_budget: missing; give a memory_budget (e.g. 180MiB) "
                              "or a profile that supplies one (see hardware/profiles/)")
        ids = tuple(g.ids) if g.ids is not None else tuple(device_id(name, i) for i in range(g.count or 0))
        clash = seen.intersection(ids)
        if clash:
            key = "ids" if g.ids is not None else "count"
            raise ConfigError(f"{at}.{key}: device {sorted(clash)[0]!r} is also in group {owner[sorted(clash)[0]]!r}; "
                              "device names must be unique across the fleet, so rename one of them")
        seen.update(ids)
        owner.update(dict.fromkeys(ids, name))
        runtime = g.runtime or (profile.runtime if profile else "torch")
        if g.agent == "native" and runtime != "executorch":
            raise ConfigError(f"{at}.agent: the native agent trains ExecuTorch sets only and the group's runtime is "
                              f"{runtime}; write runtime: executorch, or agent: python (the default for {runtime})")
        groups.append(Group(
            name=name, device_ids=ids,
            memory_budget_bytes=memory,
            upload_budget_bytes=g.upload_budget, flops_budget=g.flops_budget,
            runtime=runtime, examples=g.examples, profile=profile, agent=g.agent or default_agent(runtime),
        ))
    return Fleet(name=body.name, groups=tuple(groups))
