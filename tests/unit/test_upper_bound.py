from dataclasses import replace

import pytest

from edgefl.cost.constants import FamilyTerms, RuntimeConstants
from edgefl.cost.model import PeakTerms
from edgefl.cost.upper_bound import fit_families, fit_upper_bound, grid, joint_generic

MiB = 2**20
BASE = RuntimeConstants(baseline_bytes=100 * MiB, workspace_fixed_bytes=0, workspace_factor=1.0, source="test",
                        trained_weight_copies=0.0, frozen_weight_copies=0.0)


def _terms(floor_mib, trained_mib, device):
    return PeakTerms(floor=floor_mib * MiB, trained_param_bytes=trained_mib * MiB, frozen_bytes=0,
                     step_peak_bytes=0, kept_bytes=0, device=device)


def _family(loop_fixed_mib, device_mib, copies):
    """Bare loops of floors 10..50 MiB, and the same configs in a device process that adds `device_mib` and
    `copies` of the trained weights (what loading the artifact holds)."""
    loops = [_terms(f, f // 10, False) for f in range(10, 60, 10)]
    devices = [replace(t, device=True) for t in loops]
    measured = ([100 * MiB + t.floor + loop_fixed_mib * MiB for t in loops]
                + [100 * MiB + t.floor + (loop_fixed_mib + device_mib) * MiB + int(copies * t.trained_param_bytes)
                   for t in devices])
    return loops + devices, measured


def test_a_device_process_is_priced_above_the_bare_loop_by_what_it_adds():
    terms, measured = _family(30, 20, 1.0)
    fit = fit_upper_bound(terms, measured, BASE, trained_copies=grid(2.0, 0.5))
    k = fit.constants
    # the loops set the fixed term (30 MiB and the largest loop's 2% margin), the device rows the device bytes
    # (20 MiB, and the margin of a device peak over a loop's) and the weight copies on top
    assert k.trained_weight_copies == 1.0
    assert 30 * MiB + 0.02 * max(measured[:5]) <= k.workspace_fixed_bytes < 30 * MiB + 0.02 * max(measured[:5]) + 1
    assert 20 * MiB < k.device_bytes < 21 * MiB
    assert max(fit.ratios) <= 1 / 1.02 + 1e-9           # every peak covered, with its margin
    assert min(fit.ratios) > 0.97                        # a loop is not priced as a device
    loop, device = terms[0], terms[5]
    assert device.peak(k) - loop.peak(k) == k.device_bytes + int(k.trained_weight_copies * device.trained_param_bytes)


def test_device_rows_alone_keep_the_device_bytes_they_were_given():
    terms, measured = _family(30, 20, 0.0)
    devices, peaks = terms[5:], measured[5:]
    fit = fit_upper_bound(devices, peaks, replace(BASE, device_bytes=8 * MiB))
    assert fit.constants.device_bytes == 8 * MiB
    assert max(fit.ratios) <= 1 / 1.02 + 1e-9
    # the fixed term took the rest: 50 MiB in all, and the largest peak's margin
    assert fit.constants.workspace_fixed_bytes + 8 * MiB == pytest.approx(50 * MiB + 0.02 * max(peaks), abs=1)


def test_a_new_family_gets_the_largest_device_total_not_the_largest_of_each_part():
    a = _family(40, 5, 0.0)      # a heavy loop, a light device process
    b = _family(20, 30, 0.0)     # the other way round
    k = fit_families({"cnn": a, "vit": b}, BASE)
    cnn, vit = k.for_model("cnn"), k.for_model("vit")
    totals = [c.workspace_fixed_bytes + c.device_bytes for c in (cnn, vit)]
    assert max(cnn.workspace_fixed_bytes, vit.workspace_fixed_bytes) < max(totals) < sum(totals)
    # how a new family's total splits between loop and device process is not known: both get the total
    assert (k.workspace_fixed_bytes, k.device_bytes) == (max(totals), 0)
    loop, device = a[0][0], a[0][-1]
    assert loop.peak(k) >= loop.peak(cnn) and device.peak(k) >= device.peak(cnn)
    # each family's own terms come back whole, device bytes included
    assert vit.device_bytes > cnn.device_bytes > 0


def test_a_family_entry_without_device_bytes_holds_them_in_its_fixed_term():
    older = replace(BASE, device_bytes=7 * MiB, families=(FamilyTerms("cnn", 50 * MiB, 1.0, 0.0, 0.0),))
    assert older.for_model("cnn").device_bytes == 0
    assert older.for_model("cnn").workspace_fixed_bytes == 50 * MiB
    newer = older.with_family("cnn", workspace_fixed_bytes=40 * MiB, workspace_factor=1.0, trained_weight_copies=0.0,
                              frozen_weight_copies=0.0, device_bytes=10 * MiB)
    assert newer.for_model("cnn").device_bytes == 10 * MiB
    assert newer.for_model("vit").device_bytes == 7 * MiB      # another family: the generic terms


def _hidden_family(fixed_mib, hidden_mib):
    """Device samples: head-only ones at `fixed_mib`, ones that train hidden layers `hidden_mib` above."""
    terms = [replace(_terms(f, 0, True), hidden=h) for f in range(10, 60, 10) for h in (False, True)]
    return terms, [100 * MiB + t.floor + (fixed_mib + (hidden_mib if t.hidden else 0)) * MiB for t in terms]


def test_hidden_layer_bytes_are_learnt_beside_head_only_samples_when_asked():
    terms, measured = _hidden_family(10, 6)
    plain = fit_upper_bound(terms, measured, BASE)
    learnt = fit_upper_bound(terms, measured, BASE, learn_hidden=True)
    assert plain.constants.hidden_bytes == 0
    # 6 MiB, and the margin of the largest such peak over the largest head-only one (2% of 6 MiB)
    assert learnt.constants.hidden_bytes == pytest.approx(1.02 * 6 * MiB, abs=1)
    assert max(learnt.ratios) <= 1 / 1.02 + 1e-9
    # without it the head-only samples pay for the hidden layers they do not train
    assert min(learnt.ratios) > 0.97 > min(plain.ratios)


def test_a_new_family_is_priced_without_hidden_bytes_but_by_the_fits_that_lack_them():
    k = fit_families({"cnn": _hidden_family(10, 6), "vit": _hidden_family(20, 2)}, BASE, learn_hidden=True)
    assert k.for_model("cnn").hidden_bytes > k.for_model("vit").hidden_bytes > 0
    assert k.hidden_bytes == 0
    plain = fit_families({"cnn": _hidden_family(10, 6), "vit": _hidden_family(20, 2)}, BASE)
    assert k.workspace_fixed_bytes == plain.workspace_fixed_bytes        # every sample covered without H
    for name in ("cnn", "vit"):
        terms, measured = _hidden_family(10, 6) if name == "cnn" else _hidden_family(20, 2)
        assert all(t.peak(k) >= m for t, m in zip(terms, measured))       # the generic terms cover both


def _shaped_family(fixed_mib, factor, steps_mib=(10, 20, 40, 80)):
    """Device samples whose workspace is `fixed_mib` plus `factor` times a step peak of 10..80 MiB."""
    terms = [PeakTerms(floor=s * MiB, trained_param_bytes=MiB, frozen_bytes=0, step_peak_bytes=s * MiB, kept_bytes=0)
             for s in steps_mib]
    return terms, [100 * MiB + t.floor + fixed_mib * MiB + int(factor * t.step_peak_bytes) for t in terms]


FACTORS = grid(3.0, 0.01)


def test_families_of_one_shape_give_a_new_one_a_single_fit_over_all_of_them():
    peaks = {"cnn": _shaped_family(10, 1.1), "vit": _shaped_family(14, 1.0), "vgg11bn": _shaped_family(12, 1.05)}
    joint = fit_families(peaks, BASE, factors=FACTORS, joint=True)
    largest = fit_families(peaks, BASE, factors=FACTORS)
    assert "one fit over all of them" in joint.source and "each term the largest" in largest.source
    generic = replace(joint, families=())
    for terms, measured in peaks.values():
        assert all(m <= t.peak(generic) for t, m in zip(terms, measured))     # still a bound on every family
    # one fit over every family's peaks at the margin joint_generic found, not any family's own terms
    _, fraction = joint_generic(peaks, BASE, factors=FACTORS)
    every = fit_upper_bound([t for ts, _ in peaks.values() for t in ts], [m for _, ms in peaks.values() for m in ms],
                            BASE, fraction=fraction, factors=FACTORS).constants
    assert (generic.workspace_fixed_bytes, generic.workspace_factor) == (every.workspace_fixed_bytes,
                                                                        every.workspace_factor)
    assert (generic.workspace_fixed_bytes, generic.workspace_factor) not in {
        (joint.for_model(n).workspace_fixed_bytes, joint.for_model(n).workspace_factor) for n in peaks}


def test_the_joint_margin_is_the_least_that_bounds_each_family_left_out():
    peaks = {"cnn": _shaped_family(10, 1.1), "vit": _shaped_family(14, 1.0), "vgg11bn": _shaped_family(20, 1.2)}
    k, fraction = joint_generic(peaks, BASE, factors=FACTORS)
    assert fraction > 0.02          # fitted on cnn and vit, vgg11bn's larger peaks need more than 2%

    def worst_left_out(f):
        out = []
        for name in peaks:
            rest = [n for n in peaks if n != name]
            fit = fit_upper_bound([t for n in rest for t in peaks[n][0]], [m for n in rest for m in peaks[n][1]],
                                  BASE, fraction=f, factors=FACTORS).constants
            out.append(max(m / t.peak(fit) for t, m in zip(*peaks[name])))
        return max(out)

    assert worst_left_out(fraction) <= 1 / 1.02 < worst_left_out(round(fraction - 0.01, 2))
    assert "%d%%" % round(fraction * 100) in fit_families(peaks, BASE, factors=FACTORS, joint=True).source
    # how a new family copies its weights is not known: the most the grid allows
    copies = joint_generic(peaks, BASE, factors=FACTORS, trained_copies=grid(1.0, 0.5), frozen_copies=grid(0.5, 0.5))
    assert (copies[0].trained_weight_copies, copies[0].frozen_weight_copies) == (1.0, 0.5)


def test_families_too_different_for_one_fit_fall_back_to_the_largest_terms():
    peaks = {"cnn": _shaped_family(5, 0.5), "vit": _shaped_family(5, 2.5), "vgg11bn": _shaped_family(40, 1.0)}
    assert joint_generic(peaks, BASE, factors=FACTORS) is None
    k = fit_families(peaks, BASE, factors=FACTORS, joint=True)
    assert "each term the largest" in k.source
    assert k.workspace_factor >= 2.5 and k.workspace_fixed_bytes >= 40 * MiB
    assert joint_generic({"cnn": peaks["cnn"]}, BASE, factors=FACTORS) is None     # one family: nothing to leave out


def test_a_family_factor_floor_keeps_its_workspace_growing_with_the_step_where_its_samples_would_not():
    # samples whose peaks do not grow with the step: alone they fit a factor near 0, blind to a larger batch
    peaks = {"resnet": _shaped_family(30, 0.0), "cnn": _shaped_family(10, 1.0)}
    free = fit_families(peaks, BASE, factors=FACTORS).for_model("resnet")
    floored = fit_families(peaks, BASE, factors=FACTORS, factor_floors={"resnet": 0.95}).for_model("resnet")
    assert free.workspace_factor < 0.05 and floored.workspace_factor >= 0.95
    terms, measured = peaks["resnet"]
    assert all(m <= t.peak(floored) for t, m in zip(terms, measured))      # still a bound on every sample
    larger = replace(terms[-1], floor=320 * MiB, step_peak_bytes=320 * MiB)
    assert larger.peak(floored) - larger.peak(free) > 0.9 * 240 * MiB      # it grows with the step, free does not
    # a floor no factor of the grid reaches keeps the grid's largest
    assert fit_families(peaks, BASE, factors=(0.0, 0.5), factor_floors={"resnet": 0.95}).for_model(
        "resnet").workspace_factor == 0.5
