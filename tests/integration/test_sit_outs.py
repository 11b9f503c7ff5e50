"""A group that takes part but trains nothing in some rounds is named with the rounds and the budget that keeps it
out, from the plan to the report (issue 40): `edgefl plan`'s table and JSON, the reason the round loop skips its
devices with, the report's group table. SLT freezes past its eq. 7 where that lets a group train, so the campus
fleet's upload-bound groups train the CNN's last step instead of sitting it out."""
from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefl.errors import InfeasiblePlanError
from edgefl.fleet import load_fleet, parse_fleet
from edgefl.planning.plan import Plan, verify
from edgefl.planning.planner import plan_fleet, strategy_for
from edgefl.units import format_bytes
from edgefl.zoo import ModelRef

ROOT = Path(__file__).resolve().parents[2]
# 'slow' affords SLT's pre-training but not the last step's FLOPs: 24.6 MFLOP per example x 100 > 2 GFLOP
SLOW = ("fleet:\n  groups:\n    big: {count: 2, memory_budget: 1GiB, runtime: ort}\n"
        "    slow: {count: 2, memory_budget: 1GiB, runtime: ort, flops_budget: 2GFLOP, examples: 100}\n")
OUT = "2.46 GFLOP per round > budget 2 GFLOP"


def edgefl(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "edgefl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_the_campus_fleet_trains_every_round_of_slt_within_every_budget():
    """Before: zero, phone-low and phone-mid had no step in rounds 2-5 (the last step's full-width classifier,
    6.35 MiB, is over their upload budgets) while the table said 'fits yes'."""
    fleet = load_fleet(ROOT / "examples" / "fleet.yaml")
    plan = plan_fleet(strategy_for("slt"), fleet, ModelRef.of("cnn"), rounds=5)
    for g in fleet.groups:
        gp = plan.groups[g.name]
        assert not gp.excluded and gp.sits_out == [], (g.name, gp.sits_out)
        assert [r for s in gp.steps for r in range(s.rounds[0], s.rounds[1] + 1)] == [1, 2, 3, 4, 5], g.name
        last = gp.steps[-1]
        if g.upload_budget_bytes is not None and g.upload_budget_bytes < 6 * 2**20:
            # past eq. 7: the fully trained layer is frozen too, the classifier alone trains
            assert last.config.frozen_prefix == 3 and list(last.config.trained_layers) == [3], g.name
            assert last.predicted.upload_bytes <= g.upload_budget_bytes
    assert plan.groups["pi4"].steps[-1].config.frozen_prefix == 0     # eq. 7: a loose group freezes nothing

    r = edgefl("plan", "--devices", ROOT / "examples" / "fleet.yaml", "--model", "cnn", "--method", "slt", "--rounds", 5)
    assert r.returncode == 0, r.stderr
    assert "sits out" not in r.stdout and "NO" not in r.stdout, r.stdout


def test_the_plan_names_each_sit_out_with_its_rounds_and_budget(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(SLOW)
    r = edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "slt", "--rounds", 8, "-o", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert f"slow sits out rounds 2-8: {OUT}" in r.stdout, r.stdout
    rows = [line for line in r.stdout.splitlines() if "│" in line and "2-8" in line]
    assert len(rows) == 2 and "yes" in rows[0] and f"no: {OUT}" in rows[1], rows      # big trains, slow does not
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["groups"]["slow"]["sits_out"] == [{"rounds": [2, 8], "reason": OUT}]
    assert plan["groups"]["big"]["sits_out"] == [] and not plan["groups"]["slow"]["excluded"]

    # a group with no round left to train is excluded, and its reason says which budget, for which rounds
    r = edgefl("plan", "--devices", fleet, "--model", "cnn", "--method", "slt", "--rounds", 4, "--format", "json")
    slow = json.loads(r.stdout)["groups"]["slow"]
    assert slow["excluded"] and slow["reason"] == f"no round it can train: rounds 1-4: {OUT}", slow


def test_the_round_loop_skips_it_with_that_reason_and_the_report_says_so(tmp_path, data):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(SLOW)
    run = tmp_path / "run"
    r = edgefl("emulate", "--devices", fleet, "--model", "cnn", "--dataset", "fashion-mnist", "--method", "slt",
               "--rounds", 8, "--clients-per-round", 4, "--train-limit", 400, "--test-limit", 100, "--eval-every", 8,
               "-o", run)
    assert r.returncode == 0, r.stderr
    rounds = json.loads((run / "history.json").read_text())["rounds"]
    assert rounds[0]["participating_devices"] == {"big": 2, "slow": 2} and not rounds[0]["skipped"]
    for record in rounds[1:]:
        assert record["participating_devices"] == {"big": 2}
        assert record["skipped"] == {d: f"its group sits out rounds 2-8: {OUT}" for d in ("slow-0", "slow-1")}

    r = edgefl("report", run, "-o", tmp_path / "report")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"<td>slow</td><td>2</td><td>ort</td><td>{format_bytes(2**30)}</td>" in page
    assert html.escape(f"takes part; sits out rounds 2-8: {OUT}") in page


def test_verify_refuses_a_group_left_out_of_rounds_without_a_reason():
    fleet = parse_fleet(SLOW)
    plan = plan_fleet(strategy_for("slt"), fleet, ModelRef.of("cnn"), rounds=8)
    assert plan.groups["slow"].idle_reason(5) == f"its group sits out rounds 2-8: {OUT}"
    assert plan.groups["slow"].idle_reason(9) == "round 9 is past the plan, which ends at round 8"
    unexplained = plan.to_json()
    unexplained["groups"]["slow"]["sits_out"] = []
    with pytest.raises(InfeasiblePlanError, match="group slow: rounds 2-8 have neither a step nor a named sit-out"):
        verify(Plan.from_json(unexplained), fleet)
