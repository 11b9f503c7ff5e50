"""Fit a runtime's cost-model constants as an upper bound on measured peaks: a plan is a promise.

A peak is linear in the constants but for the workspace factor (edgefl.cost.model.PeakTerms):

    predicted = baseline + F + floor + [D + t * trained + f * frozen, on a device] + [H, with hidden layers]
                + copies * max(0, c * step_peak - kept)

For every (c, t, f) on a grid, F is the least fixed term that covers every sample with its margin,
predicted >= measured + max(`fraction` of it, `at_least` bytes); the kept (c, t, f, F) maximises the
smallest measured / predicted (the tightest band under 1), then the mean squared slack. Where samples of
bare training loops stand beside device samples (PeakTerms.device), F covers the loops and D, the device
process's own bytes, is the least that covers the device samples on top (with the weight copies t and f,
which only a device process holds); with device samples alone D is the base's and F covers the rest.
Likewise H, the bytes the kernels of trained hidden layers hold (PeakTerms.hidden), covers on top of F the
samples that train more than the last layer, where asked and where head-only samples stand beside them.
A grid of one value keeps that constant: `edgefl calibrate` refits only F on a served run's few configs,
keeping the shape the memory benchmarks fitted on many.

numpy only: the planner and `edgefl calibrate` run it without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from edgefl.cost.constants import RuntimeConstants
from edgefl.cost.model import PeakTerms

MiB = 2**20
MARGIN_FRACTION, MARGIN_BYTES = 0.02, MiB     # an upper bound's slack over every measured peak


def grid(stop: float, step: float) -> tuple[float, ...]:
    return tuple(round(i * step, 6) for i in range(int(round(stop / step)) + 1))


@dataclass(frozen=True)
class Fit:
    constants: RuntimeConstants
    ratios: tuple[float, ...]        # measured / predicted under `constants`, per sample

    @property
    def band(self) -> tuple[float, float]:
        return min(self.ratios), max(self.ratios)


def predict(terms: Sequence[PeakTerms], k: RuntimeConstants) -> list[int]:
    return [t.peak(k) for t in terms]


def fit_upper_bound(terms: Sequence[PeakTerms], measured: Sequence[int], base: RuntimeConstants, *,
                    factors: Sequence[float] | None = None, trained_copies: Sequence[float] | None = None,
                    frozen_copies: Sequence[float] | None = None, fraction: float = MARGIN_FRACTION,
                    at_least: int = MARGIN_BYTES, source: str = "", learn_hidden: bool = False) -> Fit:
    """`base`'s constants with workspace_fixed_bytes, and those of workspace_factor, trained_weight_copies and
    frozen_weight_copies whose grid is given (None: keep `base`'s), fitted as an upper bound (module doc);
    device_bytes where bare loops stand beside device samples, hidden_bytes with `learn_hidden`.
    `base.baseline_bytes` is kept: it is measured, not fitted."""
    if len(terms) != len(measured) or not terms:
        raise ValueError("one measured peak per PeakTerms, and at least one")
    m = np.asarray(measured, dtype=np.float64)
    need = m + np.maximum(fraction * m, at_least)
    floor = np.asarray([t.floor for t in terms], dtype=np.float64) + base.baseline_bytes
    trained = np.asarray([t.trained_param_bytes for t in terms], dtype=np.float64)
    frozen = np.asarray([t.frozen_bytes for t in terms], dtype=np.float64)
    step = np.asarray([t.step_peak_bytes for t in terms], dtype=np.float64)
    kept = np.asarray([t.kept_bytes for t in terms], dtype=np.float64)
    copies = np.asarray([t.copies for t in terms], dtype=np.float64)
    device = np.asarray([t.device for t in terms], dtype=bool)
    hidden = np.asarray([t.hidden for t in terms], dtype=bool)
    ts = np.asarray(trained_copies if trained_copies is not None else [base.trained_weight_copies])
    fs = np.asarray(frozen_copies if frozen_copies is not None else [base.frozen_weight_copies])
    linear = floor + (ts[:, None, None] * trained + fs[None, :, None] * frozen) * device   # (t, f, samples)
    best = None
    for c in (factors if factors is not None else [base.workspace_factor]):
        rest = linear + copies * np.maximum(0.0, np.floor(c * step) - kept)
        fixed, dev, hid = _fixed_terms(need - rest, device, hidden, base, learn_hidden)
        ratio = m / (rest + fixed[..., None] + dev[..., None] * device + hid[..., None] * hidden)
        score = ratio.min(axis=-1) - 1e-3 * ((1.0 - ratio) ** 2).mean(axis=-1)
        i = np.unravel_index(int(np.argmax(score)), score.shape)
        if best is None or score[i] > best[0]:
            best = (score[i], float(c), float(ts[i[0]]), float(fs[i[1]]), int(fixed[i]), int(dev[i]), int(hid[i]))
    _, c, t, f, fixed, dev, hid = best
    constants = replace(base, workspace_fixed_bytes=fixed, workspace_factor=c, trained_weight_copies=t,
                        frozen_weight_copies=f, device_bytes=dev, hidden_bytes=hid, source=source or base.source)
    return Fit(constants, tuple(float(x) / p for x, p in zip(m, predict(terms, constants), strict=True)))


def _fixed_terms(gap: np.ndarray, device: np.ndarray, hidden: np.ndarray, base: RuntimeConstants,
                 learn_hidden: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F, D and H per grid point (`gap`: what each sample needs above the rest of its prediction, (t, f,
    samples)). D is learnt where device samples stand beside bare loops, H where samples that train hidden
    layers stand beside head-only ones (and `learn_hidden`); a term not learnt is the base's. F is the least
    that covers the samples whose other terms are known, D then covers the device samples of those, H the
    samples that train hidden layers."""
    learn_d = bool(device.any() and not device.all())
    learn_h = bool(learn_hidden and hidden.any() and not hidden.all())
    if learn_h and learn_d and not ((~hidden & ~device).any() and (~hidden & device).any()):
        learn_h = False      # F and D then need head-only samples of both kinds
    shape = gap.shape[:2]
    dev = np.full(shape, float(base.device_bytes))
    hid = np.full(shape, float(base.hidden_bytes))
    known = gap - dev[..., None] * (device & (not learn_d)) - hid[..., None] * (hidden & (not learn_h))
    reference = ~(device & learn_d) & ~(hidden & learn_h)
    fixed = np.maximum(0.0, np.ceil(known[..., reference].max(axis=-1)))
    if learn_d:
        rows = device & ~(hidden & learn_h)
        dev = np.maximum(0.0, np.ceil((known[..., rows] - fixed[..., None]).max(axis=-1)))
    if learn_h:
        hid = np.maximum(0.0, np.ceil((gap[..., hidden] - fixed[..., None]
                                       - dev[..., None] * device[hidden]).max(axis=-1)))
    return fixed, dev, hid


FITTED = ("workspace_fixed_bytes", "workspace_factor", "trained_weight_copies", "frozen_weight_copies", "device_bytes",
          "hidden_bytes")


# `joint_generic`'s margins for a model of an unmeasured family: the least of these that bounds each measured family
# when that family is left out of the fit
GENERIC_MARGINS = grid(0.15, 0.01)[2:]


def fit_families(peaks: dict[str, tuple[Sequence[PeakTerms], Sequence[int]]], base: RuntimeConstants, *,
                 source: str = "", learn_hidden: bool = False, joint: bool = False,
                 factor_floors: Mapping[str, float] | None = None, **grids) -> RuntimeConstants:
    """`base` with each family's own upper bound (`peaks`: family -> its terms and measured peaks;
    RuntimeConstants.families) and the terms a model of any other family gets: with `joint`, `joint_generic`'s
    where it has them; else term by term the largest any family needed (the fixed and device bytes as one: the
    largest total). Both are an upper bound for every measured family; the largest terms also the most a new one
    can be promised, and loose where the families' largest terms come from different families. `joint` is for a
    runtime whose families share one shape (ORT: its graph holds what the step peak says, the families' factors
    agree), not one whose families each need their own (ExecuTorch's memory planner). `grids` as for
    `fit_upper_bound`. With `learn_hidden` a family's own terms include hidden_bytes; the generic terms come
    from fits without it: a family's hidden-layer bytes trade against its factor, and the largest of each,
    taken from different families, does not bound a family none of them is. `factor_floors`: family -> the
    least workspace factor its own fit may take (ExecuTorch: the least of its programs' planned arena over step
    peak), so that its workspace grows with its activations where its few samples would let a constant stand in."""
    floors = factor_floors or {}

    def own(hidden: bool) -> dict[str, RuntimeConstants]:
        return {name: fit_upper_bound(terms, measured, replace(base, families=()), learn_hidden=hidden,
                                      **floored(grids, floors.get(name, 0.0))).constants
                for name, (terms, measured) in sorted(peaks.items())}

    per = own(learn_hidden)
    n = sum(len(m) for _, m in peaks.values())
    head = f"upper bound (+{MARGIN_FRACTION:.0%}, >= {MARGIN_BYTES >> 20} MiB) per family on {n} measured peaks of " \
           f"{', '.join(per)}; other models: "
    found = joint_generic(peaks, replace(base, families=()), **grids) if joint else None
    if found is not None:
        k, fraction = found
        constants = replace(k, source=source or head + f"one fit over all of them, weight copies at their ceiling, "
                                                       f"+{fraction:.0%}: the least that bounded each left out")
    else:
        plain = own(False) if learn_hidden else per
        largest = {f: max(getattr(k, f) for k in plain.values()) for f in FITTED}
        # a device's fixed bytes are F + D: the largest total any family needed, not the largest F plus the largest
        # D. How a new family's total splits between its training loop and its device process is not known
        # (densenet40's loop needs 8% more F than any other family's, its device process less D): its bare loops
        # get the total too
        largest["workspace_fixed_bytes"] = max(k.workspace_fixed_bytes + k.device_bytes for k in plain.values())
        largest["device_bytes"] = 0
        constants = replace(base, families=(), **largest,
                            source=source or head + "each term the largest of theirs")
    for name, k in per.items():
        constants = constants.with_family(name, **{f: getattr(k, f) for f in FITTED})
    return constants


def floored(grids: dict, floor: float) -> dict:
    """`grids` with the workspace factors below `floor` left out (the largest kept where none reaches it)."""
    factors = grids.get("factors")
    if not floor or factors is None:
        return grids
    kept = [c for c in factors if c >= floor - 1e-9]
    return {**grids, "factors": kept or [max(factors)]}


def joint_generic(peaks: dict[str, tuple[Sequence[PeakTerms], Sequence[int]]], base: RuntimeConstants,
                  **grids) -> tuple[RuntimeConstants, float] | None:
    """The terms for a model of an unmeasured family, and their margin: one fit over every family's peaks with
    the weight copies at the top of their grids (how a new family's runtime copies its weights is not known:
    the most any family may), with the least margin of GENERIC_MARGINS under which, leaving each family out in
    turn, the fit on the others bounds the one left out with the in-sample margin. None with fewer than two
    families, or where no such margin exists: the families differ too much for one fit to speak for a new one."""
    names = sorted(peaks)
    if len(names) < 2:
        return None
    ceiling = {key: (max(grids[key]),) if grids.get(key) is not None else None
               for key in ("trained_copies", "frozen_copies")}

    def fit(members, fraction):
        terms = [t for name in members for t in peaks[name][0]]
        measured = [m for name in members for m in peaks[name][1]]
        return fit_upper_bound(terms, measured, base, fraction=fraction, factors=grids.get("factors"),
                               **ceiling).constants

    for fraction in GENERIC_MARGINS:
        if all(max(m / t.peak(k) for t, m in zip(*peaks[out])) <= 1 / (1 + MARGIN_FRACTION)
               for out in names for k in [fit([n for n in names if n != out], fraction)]):
            return fit(names, fraction), fraction
    return None
