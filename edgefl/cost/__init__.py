"""The cost model: what a TrainConfig costs a device in peak memory, FLOPs, upload and download bytes.

`profile` (per layer of a model: parameters, activation bytes, FLOPs, widths), `profile_store` (profiles kept
on disk, made by `profiler` with torch the first time), `model` (the cost model's formulas), `constants`
(each runtime's measured constants, as named fields), `upper_bound` and `calibrate` (fitting those constants
as an upper bound on measured peaks: from benchmarks and from served devices' reports), `measure` (measuring a
configuration on this machine, torch), `breakdown` (one configuration's cost: `edgefl profile`).
"""
from edgefl import lazy_exports

_WHERE = {
    "Cost": ".model", "cost": ".model", "config_cost": ".model", "step_peak_bytes": ".model", "PeakTerms": ".model",
    "ModelProfile": ".profile", "LayerProfile": ".profile", "AuxProfile": ".profile",
    "ProfileStore": ".profile_store",
    "RuntimeConstants": ".constants", "FamilyTerms": ".constants", "DEFAULTS": ".constants",
    "load_calibration": ".constants", "family": ".constants",
    "fit_overheads": ".calibrate", "calibration_json": ".calibrate", "PeakSample": ".calibrate",
    "Breakdown": ".breakdown", "breakdown": ".breakdown",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
