"""Close the loop: fit each runtime's overhead constant from what devices really used.

A served run's history holds, per round and device, the cost model's predicted peak and the peak RSS the
device measured for its training process. What the cost model cannot know in advance is a runtime's
overhead on that kind of device (import and session RSS, allocator arenas, kernel libraries): the part
of `RuntimeConstants` that does not scale with the model. `fit_overheads` moves each runtime's
`baseline_bytes` by the median residual (measured - predicted) of its samples: the median, because one
device with a background service should not move the whole fleet's plan. The workspace terms, fitted on
controlled measurements (bench/memory_model.py), are kept.

The result is a calibration file (`{"schema", "runtimes": {name: {baseline_bytes, source}}, "fit": ...}`)
that `edgefl plan --calibration FILE` reads through `edgefl.calibration.load_calibration`.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from edgefl.calibration import DEFAULTS, RuntimeConstants
from edgefl.errors import ConfigError

SCHEMA = "edgefl.calibration/1"


@dataclass(frozen=True)
class PeakSample:
    runtime: str
    group: str
    device: str
    round: int
    predicted_bytes: int     # the cost model's peak under the constants the run was planned with
    measured_bytes: int      # VmHWM of the device's training process


@dataclass(frozen=True)
class RuntimeFit:
    runtime: str
    samples: int
    shift_bytes: int                 # added to baseline_bytes
    error_before: tuple[float, float]   # (median, max) of |measured - predicted| / measured
    error_after: tuple[float, float]
    constants: RuntimeConstants


def _errors(pairs: list[tuple[int, int]]) -> tuple[float, float]:
    rel = [abs(m - p) / m for p, m in pairs]
    return statistics.median(rel), max(rel)


def fit_overheads(samples: Iterable[PeakSample], base: Mapping[str, RuntimeConstants] = DEFAULTS) -> dict[str, RuntimeFit]:
    by_runtime: dict[str, list[PeakSample]] = {}
    for s in samples:
        if s.measured_bytes > 0 and s.predicted_bytes > 0:
            by_runtime.setdefault(s.runtime, []).append(s)
    fits = {}
    for runtime, rows in sorted(by_runtime.items()):
        if runtime not in base:
            raise ConfigError(f"history names runtime {runtime!r}, which the cost model does not know")
        shift = int(statistics.median(r.measured_bytes - r.predicted_bytes for r in rows))
        old = base[runtime]
        new = RuntimeConstants(baseline_bytes=max(0, old.baseline_bytes + shift),
                               workspace_fixed_bytes=old.workspace_fixed_bytes,
                               workspace_factor=old.workspace_factor,
                               source=f"edgefl calibrate: baseline shifted by the median residual of "
                                      f"{len(rows)} measured device peaks")
        applied = new.baseline_bytes - old.baseline_bytes
        before = [(r.predicted_bytes, r.measured_bytes) for r in rows]
        after = [(r.predicted_bytes + applied, r.measured_bytes) for r in rows]
        fits[runtime] = RuntimeFit(runtime, len(rows), applied, _errors(before), _errors(after), new)
    return fits


def samples_from_run(run: str | Path) -> list[PeakSample]:
    """Predicted and measured peaks of every report in a run folder (history.json + plan.json)."""
    run = Path(run)
    try:
        history = json.loads((run / "history.json").read_text())
        plan = json.loads((run / "plan.json").read_text())
        runtime_of = {name: g["runtime"] for name, g in plan["groups"].items()}
        out = []
        for record in history["rounds"]:
            measured = record.get("measured_peak_bytes") or {}
            for device, peak in measured.items():
                group = record["sampled"][device]
                out.append(PeakSample(runtime_of[group], group, device, record["round"],
                                      record["predicted_peak_bytes"][device], int(peak)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{run}: not a served run with measured peaks ({type(exc).__name__}: {exc}); "
                          "calibrate needs the history.json and plan.json that 'edgefl serve --state DIR' writes") from None
    if not out:
        raise ConfigError(f"{run}/history.json has no measured peak RSS in any report; calibrate needs a run "
                          "served to real devices ('edgefl serve'), not an emulation")
    return out


def calibration_json(fits: Mapping[str, RuntimeFit]) -> dict:
    return {
        "schema": SCHEMA,
        "runtimes": {r: {"baseline_bytes": f.constants.baseline_bytes, "source": f.constants.source}
                     for r, f in fits.items()},
        "fit": {r: {"samples": f.samples, "shift_bytes": f.shift_bytes,
                    "relative_error_before": {"median": f.error_before[0], "max": f.error_before[1]},
                    "relative_error_after": {"median": f.error_after[0], "max": f.error_after[1]}}
                for r, f in fits.items()},
    }
