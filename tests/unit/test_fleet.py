"""fleet.yaml: the example fleet, profile defaults and overrides, and one-line errors for bad input."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgefl.errors import ConfigError
from edgefl.fleet import Fleet, Group, load_fleet, parse_fleet
from edgefl.hardware import load_profile

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
MiB = 2**20


def _fleet(groups: str, head: str = "fleet:\n  groups:\n") -> str:
    return head + "".join(f"    {line}\n" for line in groups.strip("\n").splitlines())


# --- the example -------------------------------------------------------------------------------

def test_example_loads():
    fleet = load_fleet(EXAMPLE)
    assert isinstance(fleet, Fleet) and all(isinstance(g, Group) for g in fleet.groups)
    counts = {g.name: g.count for g in fleet.groups}
    assert counts["zero"] == 40
    assert fleet.device_count == sum(counts.values())
    zero = fleet.group("zero")
    assert zero.profile.name == "raspberry-pi-zero-2w"
    assert zero.memory_budget_bytes == 180 * MiB and zero.upload_budget_bytes == 2_000_000
    assert zero.runtime == "executorch"      # the native trainer: no ORT-training wheel for aarch64
    assert all(g.examples for g in fleet.groups)
    assert {g.profile.name for g in fleet.groups} >= {"raspberry-pi-zero-2w", "raspberry-pi-4-2gb", "android-low",
                                                      "android-mid"}
    ids = [d for g in fleet.groups for d in g.device_ids]
    assert len(ids) == len(set(ids))


def test_example_budgets_leave_small_devices_short_of_full_resnet20():
    """Full ResNet-20 at batch 32 peaks at ~125 MiB with ort, ~76 MiB with executorch (the native trainer) and
    ~407 MiB with torch (cost model), plus each group's agent: the low phones (ort, so the Python agent) can hold
    neither its memory nor its upload, the larger devices train it whole, and the Pi Zero could hold it natively
    but not a round of it on its FLOP cap."""
    from edgefl.planning.strategies import PlanContext
    from edgefl.zoo import ModelRef

    fleet = load_fleet(EXAMPLE)
    ctx = PlanContext(fleet, ModelRef.of("resnet20"), batch_size=32)
    full = {g.name: ctx.cost(ctx.config(frozen_prefix=0), g) for g in fleet.groups}
    fits = {g.name: full[g.name].peak_memory_bytes <= g.memory_budget_bytes for g in fleet.groups}
    assert {g.name: g.agent for g in fleet.groups} == {"zero": "native", "pi4": "native", "pi5": "python",
                                                       "phone-low": "python", "phone-mid": "python"}
    low = fleet.group("phone-low")
    assert not fits["phone-low"] and full["phone-low"].upload_bytes > low.upload_budget_bytes   # both must shrink
    assert fits["pi4"] and fits["pi5"] and fits["phone-mid"]
    zero = fleet.group("zero")
    assert fits["zero"] and ctx.cost(ctx.config(frozen_prefix=0), "torch").peak_memory_bytes > zero.memory_budget_bytes
    # a round of the whole model over its examples exceeds its FLOP cap: the planner freezes a prefix
    assert full["zero"].flops_per_sample * zero.examples > zero.flops_budget


def test_group_lookup_unknown_name():
    with pytest.raises(KeyError, match="no group 'nope'"):
        load_fleet(EXAMPLE).group("nope")


# --- defaults and overrides --------------------------------------------------------------------

def test_profile_supplies_memory_budget_and_runtime():
    fleet = parse_fleet(_fleet("pi:\n  count: 3\n  profile: raspberry-pi-4-2gb"))
    g = fleet.group("pi")
    profile = load_profile("raspberry-pi-4-2gb")
    assert g.memory_budget_bytes == profile.memory_budget_bytes
    assert g.runtime == profile.runtime
    assert g.profile == profile
    assert g.device_ids == ("pi-0", "pi-1", "pi-2")


def test_group_keys_override_the_profile():
    g = parse_fleet(_fleet("pi:\n  count: 1\n  profile: raspberry-pi-4-2gb\n  memory_budget: 300MiB\n"
                           "  runtime: executorch")).group("pi")
    assert g.memory_budget_bytes == 300 * MiB
    assert g.runtime == "executorch"


def test_no_profile_defaults_to_torch():
    g = parse_fleet(_fleet("x:\n  count: 1\n  memory_budget: 1GiB")).group("x")
    assert g.runtime == "torch" and g.profile is None


def test_budgets_parse_units():
    g = parse_fleet(_fleet("x:\n  count: 1\n  memory_budget: 180MiB\n  upload_budget: 2MB\n"
                           "  flops_budget: 50GFLOP\n  examples: 500")).group("x")
    assert (g.memory_budget_bytes, g.upload_budget_bytes, g.flops_budget, g.examples) == (180 * MiB, 2_000_000, 5e10, 500)


def test_count_names_devices_independently_of_the_count():
    """A subset fleet (count 2) has the ids of the full one (count 40): the full deployment's logins serve it."""
    ids = {n: parse_fleet(_fleet(f"z:\n  count: {n}\n  memory_budget: 1MiB")).group("z").device_ids for n in (2, 12, 40)}
    assert ids[2] == ("z-0", "z-1")
    assert ids[12][:2] == ids[40][:2] == ids[2] and ids[12][10:] == ("z-10", "z-11")
    assert ids[40][-1] == "z-39" and set(ids[12]) < set(ids[40])


def test_ids_are_kept():
    g = parse_fleet(_fleet("lab:\n  ids: [a, b]\n  memory_budget: 1MiB")).group("lab")
    assert g.device_ids == ("a", "b") and g.count == 2


def test_fleet_name():
    assert parse_fleet("fleet:\n  name: campus\n  groups:\n    x: {count: 1, memory_budget: 1MiB}\n").name == "campus"


# --- bad input: one line, names the file and the field, says how to fix ------------------------

BAD = {
    # name: (text, field path the message must name, words of the fix)
    "yaml syntax": ("fleet:\n  groups:\n    zero: {count: 2\n", "line 4", "fix the indentation or quoting"),
    "unknown group key": (_fleet("zero: {count: 2, memory_budget: 1MiB, colour: red}"),
                          "fleet.groups.zero.colour", "allowed keys here: count, ids, profile"),
    "unknown top-level key": ("fleet:\n  groups:\n    zero: {count: 2, memory_budget: 1MiB}\nextra: 1\n",
                              "extra", "allowed keys here: fleet"),
    "unknown fleet key": (_fleet("zero: {count: 2, memory_budget: 1MiB}", head="fleet:\n  nmae: x\n  groups:\n"),
                          "fleet.nmae", "allowed keys here: name, groups"),
    "negative budget": (_fleet("zero: {count: 2, memory_budget: -5MiB}"), "fleet.groups.zero.memory_budget", "e.g."),
    "negative number budget": (_fleet("zero: {count: 2, upload_budget: -5, memory_budget: 1MiB}"),
                               "fleet.groups.zero.upload_budget", "e.g."),
    "zero budget": (_fleet("zero: {count: 2, memory_budget: 0}"), "fleet.groups.zero.memory_budget", "e.g. 180MiB"),
    "unparsable budget": (_fleet("zero: {count: 2, memory_budget: lots}"), "fleet.groups.zero.memory_budget", "e.g."),
    "unknown unit": (_fleet("zero: {count: 2, memory_budget: 1MiB, flops_budget: 5GB}"),
                     "fleet.groups.zero.flops_budget", "e.g. 50GFLOP"),
    "budget in bits": (_fleet("zero: {count: 2, memory_budget: 1MiB, upload_budget: 4Mb}"),
                       "fleet.groups.zero.upload_budget", "'4Mb' is in megabits; a size is in bytes: write 4MB or 4MiB"),
    "lower-case size": (_fleet("zero: {count: 2, memory_budget: 128 mb}"), "fleet.groups.zero.memory_budget",
                        "write 128MB or 128MiB"),
    "boolean budget": (_fleet("zero: {count: 2, memory_budget: yes}"), "fleet.groups.zero.memory_budget", "e.g."),
    "unknown profile": (_fleet("zero: {count: 2, profile: pi-zero}"), "fleet.groups.zero.profile",
                        "did you mean raspberry-pi-zero-2w"),
    "empty fleet": ("fleet:\n  groups: {}\n", "fleet.groups", "add at least one"),
    "no groups key": ("fleet:\n  name: x\n", "fleet.groups", "add 'groups:'"),
    "fleet is null": ("fleet:\n", "fleet", "expected a mapping"),
    "empty file": ("", "fleet", "e.g. 'fleet:"),
    "group is null": (_fleet("zero:"), "fleet.groups.zero", "expected a mapping"),
    "missing memory_budget": (_fleet("zero: {count: 2}"), "fleet.groups.zero.memory_budget",
                              "give a memory_budget (e.g. 180MiB) or a profile"),
    "count and ids": (_fleet("zero: {count: 2, ids: [a, b], memory_budget: 1MiB}"), "fleet.groups.zero",
                      "keep exactly one"),
    "neither count nor ids": (_fleet("zero: {memory_budget: 1MiB}"), "fleet.groups.zero.count", "count: N or ids"),
    "count zero": (_fleet("zero: {count: 0, memory_budget: 1MiB}"), "fleet.groups.zero.count", "greater than or equal to 1"),
    "count boolean": (_fleet("zero: {count: true, memory_budget: 1MiB}"), "fleet.groups.zero.count", "valid integer"),
    "repeated id": (_fleet("zero: {ids: [a, a], memory_budget: 1MiB}"), "fleet.groups.zero.ids", "distinct"),
    "duplicate ids across groups": (_fleet("a: {ids: [x, y], memory_budget: 1MiB}\nb: {ids: [y], memory_budget: 1MiB}"),
                                    "fleet.groups.b.ids", "also in group 'a'"),
    "generated name clashes": (_fleet("a: {ids: [b-1], memory_budget: 1MiB}\nb: {count: 2, memory_budget: 1MiB}"),
                               "fleet.groups.b.count", "unique across the fleet"),
    "group given twice": (_fleet("a: {count: 1, memory_budget: 1MiB}\na: {count: 2, memory_budget: 1MiB}"),
                          "line 4", "key 'a' is given twice"),
    "bad runtime": (_fleet("a: {count: 1, memory_budget: 1MiB, runtime: tflite}"), "fleet.groups.a.runtime",
                    "'ort', 'executorch' or 'torch'"),
    "non-string id": (_fleet("a: {ids: [1], memory_budget: 1MiB}"), "fleet.groups.a.ids.0", "quote it"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_line_naming_file_field_and_fix(case):
    text, field, fix = BAD[case]
    with pytest.raises(ConfigError) as info:
        parse_fleet(text, "conf/fleet.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("conf/fleet.yaml: ")
    assert field in message
    assert fix in message


def test_load_fleet_names_the_path(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(_fleet("zero: {count: 2}"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: fleet\.groups\.zero\.memory_budget: missing; give"):
        load_fleet(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the fleet file"):
        load_fleet(tmp_path / "absent.yaml")
