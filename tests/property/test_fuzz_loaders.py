"""Fuzzing the loaders users feed by hand, fleet.yaml and plan.json (issue 6): whatever the input, the
only way out is a plan/fleet or an `EdgeflError` whose message is one line; never another exception.

Inputs come four ways: arbitrary text and bytes, random YAML/JSON documents, schema-shaped documents
whose values are drawn from a hostile pool (wrong types, huge and negative numbers, NaN, unit strings),
and single edits (drop, replace, add a key) of a valid fleet or plan. Crashes the fuzzer found are
pinned below as explicit regression cases."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefl.errors import EdgeflError
from edgefl.fleet import load_fleet, parse_fleet
from edgefl.planning.plan import Plan

EXAMPLE_FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
# The default run is small and the same every time; EDGEFL_FUZZ_EXAMPLES=5000 fuzzes longer, from a fresh seed.
LONG = "EDGEFL_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(max_examples=int(os.environ.get("EDGEFL_FUZZ_EXAMPLES", "50")), deadline=None, database=None,
                derandomize=not LONG, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def only_one_line_edgefl_errors(load, value):
    try:
        load(value)
    except EdgeflError as exc:
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message, repr(message)


# --- value pools -----------------------------------------------------------------------------------

FLEET_KEYS = ["fleet", "name", "groups", "count", "ids", "profile", "memory_budget", "upload_budget",
              "flops_budget", "runtime", "examples"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["180MiB", "2MB", "-1GiB", "1e400B", "nanMiB", "50GFLOP", "3KiFLOP",
                                           "ort", "torch", "raspberry-pi-zero-2w", "android-low", "", " ", "0"]))
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12))


def documents(leaves, keys):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)),
                                                     inner, max_size=4)), max_leaves=12)


@st.composite
def shaped_fleets(draw):
    """Dicts with the fleet.yaml shape whose values come from the hostile pool."""
    group_keys = st.sampled_from(FLEET_KEYS[3:] + ["colour"])
    groups = draw(st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.none()),
                                  st.dictionaries(group_keys, st.one_of(scalars, st.lists(scalars, max_size=3))),
                                  max_size=3))
    body = {"groups": groups}
    if draw(st.booleans()):
        body["name"] = draw(scalars)
    return {"fleet": body}


def _dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)


# --- fleet.yaml --------------------------------------------------------------------------------------

@FUZZ
@given(st.text(max_size=200))
def test_fleet_any_text(text):
    only_one_line_edgefl_errors(parse_fleet, text)


@FUZZ
@given(documents(scalars, FLEET_KEYS))
def test_fleet_any_yaml_document(doc):
    only_one_line_edgefl_errors(parse_fleet, _dump(doc))


@FUZZ
@given(shaped_fleets())
def test_fleet_schema_shaped_hostile_values(doc):
    only_one_line_edgefl_errors(parse_fleet, _dump(doc))


@FUZZ
@given(st.data())
def test_fleet_one_edit_of_the_example(data):
    text = EXAMPLE_FLEET.read_text()
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 8))
    insert = data.draw(st.text(alphabet=":{}[]-#&*!|>'\"\n \t,0123456789abcMiB", max_size=6))
    only_one_line_edgefl_errors(parse_fleet, text[:at] + insert + text[at + cut:])


@FUZZ
@given(st.binary(max_size=200))
def test_fleet_file_of_any_bytes(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_bytes(raw)
    only_one_line_edgefl_errors(load_fleet, path)


# --- plan.json ----------------------------------------------------------------------------------------

COST = {"runtime_baseline_bytes": 50_000_000, "weights_frozen_bytes": 0, "weights_trained_bytes": 1000,
        "gradient_bytes": 1000, "optimizer_bytes": 1000, "activation_bytes": 1000, "workspace_bytes": 0,
        "flops_per_sample": 1e6, "upload_bytes": 1000, "download_bytes": 1000, "trained_params": 250}
VALID_PLAN = {
    "schema": "edgefl.plan/1", "method": "fedavg", "model": {"name": "cnn", "kwargs": {"classes": 10}}, "rounds": 5,
    "batch_size": 32, "optimizer": "sgd", "local_epochs": 1, "notes": ["n"],
    "groups": {"lab": {"count": 3, "runtime": "torch", "examples": 100, "min_memory_bytes": 60_000_000,
                       "budget": {"memory_bytes": 2**29, "upload_bytes": None, "flops_per_round": None},
                       "reason": "", "flags": [],
                       "steps": [{"rounds": [1, 5], "label": "", "predicted": COST,
                                  "config": {"num_layers": 4, "frozen_prefix": 1, "head_start": 2,
                                             "head_width": 0.5, "trained_layers": [1, 2, 3]}}]}}}
PLAN_KEYS = sorted({*VALID_PLAN, *VALID_PLAN["groups"]["lab"], *COST, "num_layers", "frozen_prefix", "name"})


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


PLAN_PATHS = [p for p in _paths(VALID_PLAN) if p]


def test_the_plan_the_mutations_start_from_is_valid():
    plan = Plan.from_json(json.loads(json.dumps(VALID_PLAN)))
    assert plan.groups["lab"].steps[0].config.head_width == 0.5


@FUZZ
@given(documents(json_scalars, PLAN_KEYS))
def test_plan_any_json_document(doc):
    only_one_line_edgefl_errors(Plan.from_json, doc)


@FUZZ
@given(st.sampled_from(PLAN_PATHS), st.sampled_from(["drop", "replace", "add"]),
       documents(scalars, PLAN_KEYS), st.text(max_size=8))
def test_plan_one_edit_of_a_valid_plan(path, action, value, key):
    doc = json.loads(json.dumps(VALID_PLAN))
    *parents, last = path
    holder = doc
    for p in parents:
        holder = holder[p]
    if action == "drop":
        del holder[last]
    elif action == "replace":
        holder[last] = value
    elif isinstance(holder[last], dict):
        holder[last][key] = value
    else:
        holder[last] = [holder[last], value]
    only_one_line_edgefl_errors(Plan.from_json, doc)


@FUZZ
@given(st.binary(max_size=200))
def test_plan_file_of_any_bytes(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_bytes(raw)
    only_one_line_edgefl_errors(Plan.read, path)


# --- crashes the fuzzer found, pinned --------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "fleet:\n  groups:\n    \"a\\nb\": {count: 2, memory_budget: 1GiB, colour: red}\n",   # a newline in a group name
    "fleet:\n  groups:\n    \"\\n\": {count: false}\n",
    "fleet:\n  groups:\n    \"\\n\": {}\n",
])
def test_regression_names_with_newlines_stay_on_one_line(text):
    with pytest.raises(EdgeflError) as info:
        parse_fleet(text)
    assert "\n" not in str(info.value) and "\\n" in str(info.value)


def test_regression_a_fleet_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"\x80fleet:\n")
    with pytest.raises(EdgeflError, match="not UTF-8"):
        load_fleet(path)


def test_regression_a_plan_key_with_a_newline():
    doc = json.loads(json.dumps(VALID_PLAN))
    doc["groups"]["lab"]["steps"][0]["predicted"]["a\nb"] = 1
    with pytest.raises(EdgeflError) as info:
        Plan.from_json(doc)
    assert "\n" not in str(info.value) and "a\\nb" in str(info.value)


def test_regression_a_huge_count_fails_instead_of_hanging(monkeypatch):
    with pytest.raises(EdgeflError, match="count: 4000000000"):
        parse_fleet("fleet:\n  groups:\n    a: {count: 4000000000, memory_budget: 1GiB}\n")
    monkeypatch.setattr("edgefl.fleet.MAX_DEVICES", 10)         # the limit holds for the fleet, not per group
    ok = "fleet:\n  groups:\n    a: {count: 6, memory_budget: 1GiB}\n    b: {ids: [x], memory_budget: 1GiB}\n"
    assert parse_fleet(ok + "    c: {count: 3, memory_budget: 1GiB}\n").device_count == 10
    with pytest.raises(EdgeflError, match="fleet.groups.c.count: 4 devices"):
        parse_fleet(ok + "    c: {count: 4, memory_budget: 1GiB}\n")
