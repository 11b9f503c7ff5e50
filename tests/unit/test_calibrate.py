import json

import pytest

from edgefl.calibrate import PeakSample, calibration_json, fit_overheads, samples_from_run
from edgefl.calibration import DEFAULTS, load_calibration
from edgefl.errors import ConfigError

MiB = 2**20


def _samples(runtime, residuals_mib, predicted_mib=100):
    return [PeakSample(runtime, "g", f"d{i}", 1, predicted_mib * MiB, (predicted_mib + r) * MiB)
            for i, r in enumerate(residuals_mib)]


def test_shift_is_the_median_residual_and_errors_shrink():
    fits = fit_overheads(_samples("ort", [10, 12, 14, 40]) + _samples("torch", [-5, -5, -6]))
    ort, torch_fit = fits["ort"], fits["torch"]
    assert ort.shift_bytes == 13 * MiB
    assert ort.constants.baseline_bytes == DEFAULTS["ort"].baseline_bytes + 13 * MiB
    assert ort.constants.workspace_factor == DEFAULTS["ort"].workspace_factor
    assert torch_fit.shift_bytes == -5 * MiB
    assert ort.error_before[0] > ort.error_after[0]
    assert ort.error_after[1] == pytest.approx(27 / 140)   # the outlier stays an outlier
    assert ort.samples == 4


def test_calibration_file_round_trips_through_the_planner_loader(tmp_path):
    fits = fit_overheads(_samples("ort", [20, 20, 20]))
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration_json(fits)))
    constants = load_calibration(path)
    assert constants["ort"].baseline_bytes == DEFAULTS["ort"].baseline_bytes + 20 * MiB
    assert constants["torch"] == DEFAULTS["torch"]


def _run(tmp_path, measured):
    (tmp_path / "plan.json").write_text(json.dumps({"groups": {"pis": {"runtime": "ort"}, "big": {"runtime": "torch"}}}))
    rounds = [{"round": 1, "sampled": {"a": "pis", "b": "big"},
               "predicted_peak_bytes": {"a": 90 * MiB, "b": 400 * MiB}, "measured_peak_bytes": measured}]
    (tmp_path / "history.json").write_text(json.dumps({"rounds": rounds}))
    return tmp_path


def test_samples_from_a_served_run(tmp_path):
    samples = samples_from_run(_run(tmp_path, {"a": 100 * MiB}))
    assert samples == [PeakSample("ort", "pis", "a", 1, 90 * MiB, 100 * MiB)]


def test_an_emulated_run_has_nothing_to_calibrate_from(tmp_path):
    with pytest.raises(ConfigError, match="no measured peak RSS"):
        samples_from_run(_run(tmp_path, {}))
    with pytest.raises(ConfigError, match="not a served run"):
        samples_from_run(tmp_path / "missing")
