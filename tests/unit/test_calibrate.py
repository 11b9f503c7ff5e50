import json
import subprocess
import sys
from dataclasses import replace

import pytest

from edgefl.cost.calibrate import PeakSample, calibration_json, fit_overheads
from edgefl.cost.constants import DEFAULTS, load_calibration
from edgefl.cost.model import PeakTerms
from edgefl.errors import ConfigError
from edgefl.planning.calibration import plan_changes, samples_from_run

MiB = 2**20


def _samples(runtime, residuals_mib, floor_mib=40):
    """Samples whose prediction under the defaults is known: a floor and nothing that scales."""
    terms = PeakTerms(floor=floor_mib * MiB, trained_param_bytes=0, frozen_bytes=0, step_peak_bytes=0, kept_bytes=0)
    predicted = terms.peak(DEFAULTS[runtime].for_model("cnn"))
    return [PeakSample(runtime, "g", f"d{i}", 1, predicted, predicted + r * MiB, terms, "cnn")
            for i, r in enumerate(residuals_mib)]


def test_the_fixed_term_covers_the_worst_device_with_its_margin():
    fits = fit_overheads(_samples("ort", [10, 12, 14, 40]) + _samples("torch", [-30, -30, -31]))
    ort, torch_fit = fits["ort"], fits["torch"]
    worst = _samples("ort", [40])[0].measured_bytes
    # the outlier sets the level, not the median: every peak is now predicted, with max(2%, 1 MiB) to spare
    assert ort.shift_bytes == 40 * MiB + int(0.02 * worst) + 1
    assert ort.ratio_before[1] > 1 and ort.ratio_after[1] == pytest.approx(1 / 1.02, abs=1e-6)
    assert ort.constants.for_model("cnn").workspace_factor == DEFAULTS["ort"].for_model("cnn").workspace_factor
    assert ort.constants.for_model("cnn").workspace_fixed_bytes == (DEFAULTS["ort"].for_model("cnn").workspace_fixed_bytes
                                                                    + ort.shift_bytes)   # the level is the devices'
    assert ort.samples == 4
    # a runtime over-predicted everywhere gets tighter, still above every peak
    assert torch_fit.shift_bytes < 0 and torch_fit.ratio_after[1] <= 1 / 1.02 + 1e-9
    assert torch_fit.ratio_after[0] > torch_fit.ratio_before[0]


def test_calibrating_a_model_of_an_unmeasured_family_leaves_the_generic_bound_alone(tmp_path):
    # executorch's benchmarks never measured densenet40: it is priced with the generic terms, as is any other
    # unmeasured family; its devices' peaks move its own entry only
    generic = DEFAULTS["executorch"].for_model("densenet40")
    terms = PeakTerms(floor=300 * MiB, trained_param_bytes=0, frozen_bytes=0, step_peak_bytes=0, kept_bytes=0)
    predicted = terms.peak(generic)
    samples = [PeakSample("executorch", "g", f"d{i}", 1, predicted, predicted - r * MiB, terms, "densenet40")
               for i, r in enumerate([30, 25])]
    fit = fit_overheads(samples)["executorch"]
    k = fit.constants
    assert fit.shift_bytes < 0
    assert k.for_model("densenet40").workspace_fixed_bytes == generic.workspace_fixed_bytes + fit.shift_bytes
    assert k.for_model("densenet40").workspace_factor == generic.workspace_factor
    assert k.workspace_fixed_bytes == DEFAULTS["executorch"].workspace_fixed_bytes    # the generic bound
    assert replace(k.for_model("vgg11bn"), source="") == replace(DEFAULTS["executorch"].for_model("vgg11bn"), source="")
    # and through the file the planner reads
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration_json({"executorch": fit})))
    loaded = load_calibration(path)["executorch"]
    assert loaded.for_model("densenet40").workspace_fixed_bytes == k.for_model("densenet40").workspace_fixed_bytes
    assert loaded.workspace_fixed_bytes == DEFAULTS["executorch"].workspace_fixed_bytes


def test_calibration_file_round_trips_through_the_planner_loader(tmp_path):
    fits = fit_overheads(_samples("ort", [20, 20, 20]))
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration_json(fits)))
    constants = load_calibration(path)
    assert (constants["ort"].for_model("cnn").workspace_fixed_bytes
            == DEFAULTS["ort"].for_model("cnn").workspace_fixed_bytes + fits["ort"].shift_bytes)
    assert constants["torch"] == DEFAULTS["torch"]


def _plan(tmp_path, budget="4GiB"):
    from edgefl.fleet import parse_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.zoo import ModelRef

    fleet = parse_fleet(f"fleet: {{groups: {{pis: {{count: 2, memory_budget: {budget}, runtime: ort, examples: 64}}, "
                        f"big: {{count: 1, memory_budget: 4GiB, runtime: torch}}}}}}")
    plan = verify(get_strategy("fedolf").plan(PlanContext(fleet, ModelRef.of("cnn"), rounds=2)), fleet)
    plan.write(tmp_path / "plan.json")
    return plan


def _history(tmp_path, plan, metrics, examples=None):
    predicted = {d: plan.groups[g].steps[0].predicted.peak_memory_bytes for d, g in (("a", "pis"), ("b", "big"))}
    rounds = [{"round": 1, "sampled": {"a": "pis", "b": "big"}, "predicted_peak_bytes": predicted,
               "measured_peak_bytes": {"a": 100 * MiB, "b": 400 * MiB}, "device_metrics": metrics,
               "examples": examples or {"a": 64, "b": 500}}]
    (tmp_path / "history.json").write_text(json.dumps({"rounds": rounds}))
    return tmp_path


GOOD = {"data_read": "batch", "batch_size": 32}


def test_samples_carry_the_peak_terms_of_the_config_each_device_trained(tmp_path):
    plan = _plan(tmp_path)
    samples, refused = samples_from_run(_history(tmp_path, plan, {"a": GOOD, "b": GOOD}))
    assert refused == []
    assert [(s.runtime, s.group, s.device, s.measured_bytes) for s in samples] == [
        ("ort", "pis", "a", 100 * MiB), ("torch", "big", "b", 400 * MiB)]
    for s in samples:      # the terms reproduce the plan's prediction under the constants it was planned with
        assert s.terms.peak(DEFAULTS[s.runtime].for_model("cnn")) == s.predicted_bytes


@pytest.mark.parametrize("metrics, examples, reason", [
    ({}, 64, "does not say how the device read its data"),
    ({"data_read": "whole", "batch_size": 32}, 64, "not a batch at a time: its peak holds its data"),
    ({"data_read": "batch", "batch_size": 16}, 64, "trained batches of 16, the plan's config has 32"),
    (GOOD, 15000, "trained 15000 examples per pass, the plan assumes 64"),
])
def test_reports_that_do_not_match_the_plan_are_refused_with_the_reason(tmp_path, metrics, examples, reason):
    plan = _plan(tmp_path)
    samples, refused = samples_from_run(_history(tmp_path, plan, {"a": metrics, "b": GOOD}, {"a": examples, "b": 500}))
    assert [s.device for s in samples] == ["b"]
    assert [(r.device, r.round) for r in refused] == [("a", 1)] and reason in refused[0].reason


def test_an_emulated_run_has_nothing_to_calibrate_from(tmp_path):
    plan = _plan(tmp_path)
    (tmp_path / "history.json").write_text(json.dumps({"rounds": [{"round": 1, "sampled": {"a": "pis"},
                                                                   "predicted_peak_bytes": {"a": 1},
                                                                   "measured_peak_bytes": {}}]}))
    del plan
    with pytest.raises(ConfigError, match="no measured peak RSS"):
        samples_from_run(tmp_path)
    with pytest.raises(ConfigError, match="not a served run"):
        samples_from_run(tmp_path / "missing")


def test_plan_with_a_calibration_says_what_changed_and_why(tmp_path):
    """A calibration that raises ORT's fixed term by about 20 MiB, on a group budgeted halfway between the CNN with
    one frozen layer and the whole CNN: the group freezes more, and `edgefl plan` says so in the plan's notes, with
    the fit that justified it."""
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.zoo import ModelRef

    ctx = PlanContext(parse_fleet("fleet: {groups: {g: {count: 1, memory_budget: 4GiB}}}"), ModelRef.of("cnn"))
    one, whole = (ctx.cost(ctx.config(frozen_prefix=k), "ort").peak_memory_bytes for k in (1, 0))
    budget = (one + whole) // 2
    fleet_text = f"fleet:\n  groups:\n    pis: {{count: 2, memory_budget: {budget}, runtime: ort}}\n"
    (tmp_path / "fleet.yaml").write_text(fleet_text)
    fits = fit_overheads(_samples("ort", [18, 12]))
    (tmp_path / "cal.json").write_text(json.dumps(calibration_json(fits)))
    r = subprocess.run([sys.executable, "-m", "edgefl", "plan", "--devices", tmp_path / "fleet.yaml", "--model", "cnn",
                        "--method", "fedolf", "--calibration", tmp_path / "cal.json", "--format", "json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any("ort: workspace_fixed_bytes" in n and "measured/predicted on 2 device peaks" in n for n in notes)
    assert any(n.startswith("group pis: frozen prefix 1 -> ") and "predicted peak" in n for n in notes)

    fleet = parse_fleet(fleet_text)
    plain = get_strategy("fedolf").plan(PlanContext(fleet, ModelRef.of("cnn")))
    assert plan_changes(plain, plain) == ["the calibration changes no group's admission or first config"]


def test_a_plan_says_when_its_model_has_no_measured_constants_on_a_runtime_until_calibrated(tmp_path):
    from edgefl.fleet import parse_fleet
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.zoo import ModelRef

    fleet = parse_fleet("fleet: {groups: {pis: {count: 1, memory_budget: 2GiB, runtime: executorch}, "
                        "phones: {count: 1, memory_budget: 2GiB, runtime: ort}}}")
    plan = get_strategy("fedolf").plan(PlanContext(fleet, ModelRef.of("densenet40")))
    notes = [n for n in plan.notes if "no measured memory constants" in n]
    # executorch's benchmarks never measured densenet40; ort's did
    assert len(notes) == 1 and notes[0].startswith("executorch: no measured memory constants for densenet40")
    assert "cnn, resnet, transformer, vgg11bn, vit" in notes[0]
    # a calibration from its devices gives it its own entry: the note goes
    generic = DEFAULTS["executorch"].for_model("densenet40")
    terms = PeakTerms(floor=300 * MiB, trained_param_bytes=0, frozen_bytes=0, step_peak_bytes=0, kept_bytes=0)
    samples = [PeakSample("executorch", "pis", "d0", 1, terms.peak(generic), terms.peak(generic), terms, "densenet40")]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration_json(fit_overheads(samples))))
    calibrated = get_strategy("fedolf").plan(PlanContext(fleet, ModelRef.of("densenet40"),
                                                         constants=load_calibration(path)))
    assert not [n for n in calibrated.notes if "no measured memory constants" in n]
