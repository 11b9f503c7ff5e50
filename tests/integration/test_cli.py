"""The `edgefl` command as users type it: real subprocesses, exit codes, one-line errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet.yaml"


def edgefl(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "edgefl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def write(tmp_path, text, name="fleet.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plan_json_has_the_documented_fields(tmp_path):
    out = tmp_path / "plan.json"
    r = edgefl("plan", "--devices", FLEET, "--model", "resnet20", "--method", "slt", "--format", "json", "-o", out)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan == json.loads(out.read_text())
    assert plan["schema"] == "edgefl.plan/1" and plan["method"] == "slt" and plan["model"]["name"] == "resnet20"
    for name, g in plan["groups"].items():
        assert g["count"] > 0 and g["budget"]["memory_bytes"] > 0
        assert isinstance(g["excluded"], bool) and g["min_memory_bytes"] > 0
        for step in g["steps"]:
            first, last = step["rounds"]
            assert 1 <= first <= last <= plan["rounds"]
            assert {"frozen_prefix", "trained_layers", "head_width"} <= set(step["config"])
            assert step["predicted"]["peak_memory_bytes"] <= g["budget"]["memory_bytes"]
            assert {"upload_bytes", "flops_per_sample"} <= set(step["predicted"])


@pytest.mark.parametrize("method", ["slt", "fedolf", "fedepth", "profl", "fedavg", "exclusive", "small", "fd",
                                    "fedrolex", "heterofl", "fjord", "depthfl", "caff"])
def test_plan_table_for_every_method(method):
    r = edgefl("plan", "--devices", FLEET, "--model", "resnet20", "--method", method)
    assert r.returncode == 0, r.stderr
    assert "zero" in r.stdout and "phone-mid" in r.stdout


def test_plan_caff_on_the_transformer():
    r = edgefl("plan", "--devices", FLEET, "--model", "transformer", "--method", "caff", "--format", "json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["model"]["kwargs"]["layers"] in (3, 6, 9, 12)


def test_group_that_fits_nothing_is_listed_with_its_smallest_budget(tmp_path):
    fleet = write(tmp_path, "fleet:\n  groups:\n    big: {count: 2, memory_budget: 2GiB}\n"
                            "    tiny: {count: 3, memory_budget: 10MiB, runtime: ort}\n")
    r = edgefl("plan", "--devices", fleet, "--model", "resnet20", "--method", "fedolf", "--format", "json")
    assert r.returncode == 0, r.stderr
    tiny = json.loads(r.stdout)["groups"]["tiny"]
    assert tiny["excluded"] and tiny["min_memory_bytes"] > 10 * 2**20 and "memory budget of" in tiny["reason"]


def test_no_group_can_take_part_exits_non_zero(tmp_path):
    fleet = write(tmp_path, "fleet:\n  groups:\n    tiny: {count: 3, memory_budget: 10MiB, runtime: ort}\n")
    r = edgefl("plan", "--devices", fleet, "--model", "resnet20", "--method", "fedavg")
    assert_one_line_error(r, "no device group can take part", "tiny")


@pytest.mark.parametrize("text,needles", [
    ("fleet:\n  groups:\n    a: {count: 1, memory_budget: 1GiB\n", ["YAML syntax error", "line"]),
    ("fleet:\n  groups:\n    a: {count: 1, memory_budget: 1GiB, colour: red}\n", ["fleet.groups.a", "colour"]),
    ("fleet:\n  groups:\n    a: {count: 1, memory_budget: 1GiB}\n  owner: me\n", ["owner"]),
    ("fleet:\n  groups:\n    a: {count: 1, memory_budget: -5MiB}\n", ["fleet.groups.a.memory_budget"]),
    ("fleet:\n  groups:\n    a: {count: 1, memory_budget: lots}\n", ["fleet.groups.a.memory_budget"]),
    ("fleet:\n  groups:\n    a: {count: 1, profile: raspberry-pi-9}\n", ["fleet.groups.a.profile", "raspberry-pi-9"]),
    ("fleet:\n  groups: {}\n", ["fleet.groups", "add at least one"]),
    ("fleet:\n  groups:\n    a: {count: 1}\n", ["fleet.groups.a", "memory_budget"]),
])
def test_bad_fleet_files_get_one_line(tmp_path, text, needles):
    fleet = write(tmp_path, text)
    r = edgefl("plan", "--devices", fleet, "--model", "resnet20", "--method", "slt")
    assert_one_line_error(r, str(fleet), *needles)


def test_unknown_model_and_method(tmp_path):
    assert_one_line_error(edgefl("plan", "--devices", FLEET, "--model", "resnet21", "--method", "slt"),
                          "--model", "resnet21", "resnet20")
    assert_one_line_error(edgefl("plan", "--devices", FLEET, "--model", "resnet20", "--method", "fedsgd"),
                          "unknown method", "fedsgd", "slt")
    assert_one_line_error(edgefl("plan", "--devices", tmp_path / "missing.yaml", "--model", "cnn", "--method", "slt"),
                          "missing.yaml", "--devices")


def test_flops_budget_without_examples_is_explained(tmp_path):
    fleet = write(tmp_path, "fleet:\n  groups:\n    a: {count: 1, memory_budget: 1GiB, flops_budget: 5GFLOP}\n")
    assert_one_line_error(edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "fedolf"),
                          "fleet.groups.a.flops_budget", "examples")


def test_profile_prints_the_breakdown_as_json():
    r = edgefl("profile", "--model", "resnet20", "--frozen-prefix", "7", "--head-width", "0.25", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    p = out["predicted"]
    assert p["peak_memory_bytes"] == p["runtime_baseline_bytes"] + p["training_bytes"]
    assert p["activation_bytes"] > 0 and out["config"]["frozen_prefix"] == 7 and out["config"]["head_start"] == 8
    assert_one_line_error(edgefl("profile", "--model", "cnn", "--frozen-prefix", "9"), "--frozen-prefix", "4 layers")
