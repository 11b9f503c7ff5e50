"""fleet.yaml: named device groups with budgets, typed and validated.

    fleet:
      name: campus
      groups:
        zero:
          count: 40
          profile: raspberry-pi-zero-2w
          memory_budget: 180MiB
          upload_budget: 2MB

A group's profile supplies defaults (memory budget, runtime); the group's own keys override them.
Every error names the file, the field and the fix, in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgefl.errors import ConfigError
from edgefl.hardware import DeviceProfile, load_profile
from edgefl.units import parse_bytes, parse_flops

Runtime = Literal["ort", "executorch", "torch"]
_SIZE_EXAMPLE = {"memory_budget": "180MiB", "upload_budget": "2MB", "flops_budget": "50GFLOP"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class GroupSpec(_Strict):
    count: Optional[int] = Field(default=None, ge=1)
    ids: Optional[list[str]] = None
    profile: Optional[str] = None
    memory_budget: Optional[Union[str, int, float]] = None
    upload_budget: Optional[Union[str, int, float]] = None
    flops_budget: Optional[Union[str, int, float]] = None
    runtime: Optional[Runtime] = None
    examples: Optional[int] = Field(default=None, ge=1)

    @field_validator("memory_budget", "upload_budget")
    @classmethod
    def _size(cls, v):
        return None if v is None else _positive(parse_bytes(v))

    @field_validator("flops_budget")
    @classmethod
    def _flops(cls, v):
        return None if v is None else _positive(parse_flops(v))

    @field_validator("ids")
    @classmethod
    def _ids(cls, v):
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("ids must be a non-empty list of distinct device names")
        return v

    @model_validator(mode="after")
    def _count_or_ids(self):
        if (self.count is None) == (self.ids is None):
            raise ValueError("give either count or ids (exactly one of them)")
        if self.memory_budget is None and self.profile is None:
            raise ValueError("give a memory_budget (e.g. 180MiB) or a profile that supplies one")
        return self


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
        return next(g for g in self.groups if g.name == name)


def load_fleet(path: str | Path) -> Fleet:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the fleet file ({exc.strerror}); check the --devices path") from None
    return parse_fleet(text, str(path))


def parse_fleet(text: str, where: str = "fleet.yaml") -> Fleet:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error{at}: {problem}; fix the indentation or quoting there") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with a top-level 'fleet' key, e.g. 'fleet: {{groups: ...}}'")
    try:
        spec = FleetFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None
    return _resolve(spec.fleet, where)


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    field = str(err["loc"][-1]) if err["loc"] else ""
    if err["type"] == "extra_forbidden":
        allowed = {"fleet": "fleet", "groups": "name, groups"}.get(str(err["loc"][-2]) if len(err["loc"]) > 1 else "", None)
        known = ", ".join(GroupSpec.model_fields) if len(err["loc"]) == 4 else (allowed or ", ".join(FleetBody.model_fields))
        return f"{loc}: unknown key {field!r}; allowed keys here: {known}"
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    fix = f" (write e.g. {_SIZE_EXAMPLE[field]})" if field in _SIZE_EXAMPLE else ""
    shown = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], (dict, list)) else ""
    return f"{loc}: {msg}{shown}{fix}"


def _resolve(body: FleetBody, where: str) -> Fleet:
    groups, seen = [], set()
    for name, g in body.groups.items():
        profile = None
        if g.profile is not None:
            try:
                profile = load_profile(g.profile)
            except ConfigError as exc:
                raise ConfigError(f"{where}: fleet.groups.{name}.profile: {exc}") from None
        ids = tuple(g.ids) if g.ids is not None else tuple(f"{name}-{i:0{len(str(g.count))}d}" for i in range(g.count))
        clash = seen.intersection(ids)
        if clash:
            raise ConfigError(f"{where}: fleet.groups.{name}.ids: device {sorted(clash)[0]!r} is in two groups; "
                              "device names must be unique across the fleet")
        seen.update(ids)
        groups.append(Group(
            name=name, device_ids=ids,
            memory_budget_bytes=g.memory_budget if g.memory_budget is not None else profile.memory_budget_bytes,
            upload_budget_bytes=g.upload_budget, flops_budget=g.flops_budget,
            runtime=g.runtime or (profile.runtime if profile else "torch"),
            examples=g.examples, profile=profile,
        ))
    return Fleet(name=body.name, groups=tuple(groups))
