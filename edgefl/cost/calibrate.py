"""Close the loop: fit each runtime's constants to what devices really used, as an upper bound.

A served run's history holds, per round and device, the cost model's predicted peak and the peak RSS the
device measured for its training process; its plan says which config each device trained. What the cost
model cannot know in advance is a runtime's overhead on that kind of device (allocator arenas, kernel
libraries, what its OS maps in): the level of `RuntimeConstants`, not its shape. `fit_overheads` keeps the
shape the memory benchmarks fitted on many configs (workspace factor, weight copies) and refits the
fixed term the way they fit it (edgefl.cost.upper_bound): the least one under which every measured peak is
predicted with its margin. The worst device sets it, not the median: a plan is a promise.

A peak is evidence only about the plan it was measured under. `refusal` (which
edgefl.planning.calibration.samples_from_run applies) refuses (keeps aside, with the reason) a report whose
device trained another batch than the plan's config, more examples per pass than the plan's `examples`, or
read its data other than a batch at a time (an agent holding its share in
memory measures its data, not the runtime: the calibration would learn the data as overhead and exclude
groups the plan could keep), and a report that does not say so (an older agent).

The result is a calibration file (`{"schema", "runtimes": {name: {workspace_fixed_bytes, families, source}},
"fit"}`) that `edgefl plan --calibration FILE` reads through `edgefl.cost.constants.load_calibration`. The refitted
term is the calibrated model's family's own (`RuntimeConstants.families`), also for a family the benchmarks never
measured: the generic terms stay the bound every other unmeasured family is priced with.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Optional

from edgefl.cost.constants import DEFAULTS, RuntimeConstants
from edgefl.cost.model import PeakTerms
from edgefl.cost.upper_bound import FITTED as BOUND_TERMS
from edgefl.cost.upper_bound import MARGIN_BYTES, MARGIN_FRACTION, fit_upper_bound
from edgefl.errors import ConfigError

SCHEMA = "edgefl.calibration/3"       # /2 wrote each family as a list; load_calibration reads both
DATA_READ = "batch"        # how devices read their data (a report's `data_read`): the one way calibrated


@dataclass(frozen=True)
class PeakSample:
    runtime: str
    group: str
    device: str
    round: int
    predicted_bytes: int     # the cost model's peak under the constants the run was planned with
    measured_bytes: int      # VmHWM of the device's training process
    terms: PeakTerms         # that peak as a function of the constants (edgefl.cost.model.PeakTerms)
    model: str = ""          # the zoo model trained: its family's constants are the ones refitted


@dataclass(frozen=True)
class Refused:
    device: str
    round: int
    reason: str


@dataclass(frozen=True)
class RuntimeFit:
    runtime: str
    samples: int
    shift_bytes: int                    # added to workspace_fixed_bytes
    ratio_before: tuple[float, float]   # (min, max) of measured / predicted under the run's constants
    ratio_after: tuple[float, float]
    constants: RuntimeConstants


def _band(pairs: list[tuple[int, int]]) -> tuple[float, float]:
    ratios = [m / p for p, m in pairs]
    return min(ratios), max(ratios)


def fit_overheads(samples: Iterable[PeakSample], base: Mapping[str, RuntimeConstants] = DEFAULTS,
                  runs: str = "") -> dict[str, RuntimeFit]:
    """Per runtime, the fixed term of the constants its samples' model is priced with (its family's, or the
    generic ones: RuntimeConstants.for_model) refitted as an upper bound on them; the shape is kept."""
    by_runtime: dict[str, list[PeakSample]] = {}
    for s in samples:
        if s.measured_bytes > 0:
            by_runtime.setdefault(s.runtime, []).append(s)
    fits = {}
    for runtime, rows in sorted(by_runtime.items()):
        if runtime not in base:
            raise ConfigError(f"history names runtime {runtime!r}, which the cost model does not know")
        models = {r.model for r in rows}
        if len(models) > 1:
            raise ConfigError(f"calibrate one model's runs at a time: the runs train {', '.join(sorted(models))}")
        model = models.pop()
        old = base[runtime].for_model(model)
        where = f" of {runs}" if runs else ""
        fit = fit_upper_bound([r.terms for r in rows], [r.measured_bytes for r in rows], old,
                              source=f"edgefl calibrate: fixed term an upper bound (+{MARGIN_FRACTION:.0%}, >= "
                                     f"{MARGIN_BYTES >> 20} MiB) on {len(rows)} measured device peaks{where}")
        new = fit.constants.workspace_fixed_bytes
        # always the model's family's own entry: a model of a family the benchmarks never measured is priced
        # with the generic terms, the bound over every measured family; its devices' peaks say nothing about
        # another unmeasured family, which keeps that bound
        placed = base[runtime].with_family(model, **{**{f: getattr(old, f) for f in BOUND_TERMS},
                                                     "workspace_fixed_bytes": new})
        before = [(r.terms.peak(old), r.measured_bytes) for r in rows]
        fits[runtime] = RuntimeFit(runtime, len(rows), new - old.workspace_fixed_bytes, _band(before), fit.band,
                                   replace(placed, source=fit.constants.source))
    return fits


def refusal(plan_batch: int, plan_examples: Optional[int], examples: int, metrics: dict) -> Optional[str]:
    """Why a report's peak says nothing about the plan's config (None: it does)."""
    if "data_read" not in metrics or "batch_size" not in metrics:
        return "the report does not say how the device read its data and at which batch (an older agent)"
    if metrics["data_read"] != DATA_READ:
        return f"the device read its data {metrics['data_read']!r}, not a batch at a time: its peak holds its data"
    if metrics["batch_size"] != plan_batch:
        return f"trained batches of {metrics['batch_size']}, the plan's config has {plan_batch}"
    if plan_examples is not None and examples > plan_examples:
        return f"trained {examples} examples per pass, the plan assumes {plan_examples}"
    return None


def calibration_json(fits: Mapping[str, RuntimeFit], refused: Iterable[Refused] = ()) -> dict:
    return {
        "schema": SCHEMA,
        "runtimes": {r: {"workspace_fixed_bytes": f.constants.workspace_fixed_bytes,
                         "families": [asdict(t) for t in f.constants.families], "source": f.constants.source}
                     for r, f in fits.items()},
        "fit": {r: {"samples": f.samples, "shift_bytes": f.shift_bytes,
                    "measured_over_predicted_before": {"min": f.ratio_before[0], "max": f.ratio_before[1]},
                    "measured_over_predicted_after": {"min": f.ratio_after[0], "max": f.ratio_after[1]}}
                for r, f in fits.items()},
        "refused": [{"device": x.device, "round": x.round, "reason": x.reason} for x in refused],
    }


def calibration_notes(path: str | Path, constants: Mapping[str, RuntimeConstants], model: str) -> list[str]:
    """What a calibration file changes for `model` against the built-in constants, and why (its fit), one line
    per runtime."""
    try:
        fits = json.loads(Path(path).read_text()).get("fit") or {}
    except (OSError, ValueError, AttributeError):
        fits = {}
    notes = []
    for runtime, k in constants.items():
        k, old = k.for_model(model), DEFAULTS[runtime].for_model(model)
        changed = [f for f in FITTED if getattr(k, f) != getattr(old, f)]
        if not changed:
            continue
        what = ", ".join(f"{f} {_show(getattr(old, f))} -> {_show(getattr(k, f))}" for f in changed)
        fit = fits.get(runtime)
        why = (f"; measured/predicted on {fit['samples']} device peaks {_band_text(fit['measured_over_predicted_before'])}"
               f" before, {_band_text(fit['measured_over_predicted_after'])} after" if fit else "")
        notes.append(f"calibration {path}: {runtime}: {what} ({k.source}{why})")
    return notes


FITTED = ("baseline_bytes",) + BOUND_TERMS      # what a calibration may change: the measured baseline too


def _show(v) -> str:
    from edgefl.units import format_bytes
    return format_bytes(v) if isinstance(v, int) else f"{v:g}"


def _band_text(d: dict) -> str:
    return f"{d['min']:.2f}-{d['max']:.2f}"
