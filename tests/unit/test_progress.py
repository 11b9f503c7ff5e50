"""ProFL's effective movement (sec. 3.3): 1 while every scalar moves one way, 0 once it oscillates; a block
freezes once the least-squares slope has stayed below phi for W evaluations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edgefl.planning.progress import (effective_movement, is_flat, movement_series, should_freeze, slope, slopes,
                                      trend)

H, WINDOW, W, PHI = 4, 3, 3, 0.01


def trajectory(rounds: int = 30) -> list[float]:
    """Oscillation +-0.1 every round, plus from round 5 a geometric approach to 1 (steps 0.4, 0.24, ...)."""
    return [0.1 * (-1) ** k + 1 - 0.6 ** max(0, k - 4) for k in range(rounds)]


def test_effective_movement_by_hand():
    theta = trajectory()
    # rounds 1-4: updates -0.2, +0.2, -0.2, +0.2 cancel -> 0
    assert effective_movement(theta[:5], H) == pytest.approx(0.0)
    # rounds 2-5: +0.2, -0.2, +0.2, then -0.2 + 0.4 = +0.2 -> |0.4| / 0.8
    assert effective_movement(theta[:6], H) == pytest.approx(0.5)
    # a steady one-way walk moves fully; a constant block did not move at all
    assert effective_movement([0.0, 1.0, 1.5, 1.75, 1.875], H) == pytest.approx(1.0)
    assert effective_movement([2.0] * 5, H) == 0.0


def test_block_is_normalised_over_all_its_scalars():
    # scalar a moves +1 each round (|sum| 4 of 4), b oscillates +-3 (|sum| 0 of 12): 4 / 16
    history = [{"a": torch.tensor([float(k)]), "b": np.array([3.0 * (k % 2)])} for k in range(5)]
    assert effective_movement(history, H) == pytest.approx(0.25)


def test_slope_is_least_squares():
    assert slope([1, 3, 5]) == pytest.approx(2.0)
    assert slope([0, 1, 0, 1]) == pytest.approx(np.polyfit(range(4), [0, 1, 0, 1], 1)[0])


def test_movement_rises_then_falls_and_freezing_waits_until_it_is_flat():
    theta = trajectory()
    em = movement_series(theta, H)            # em[i] is round H + i

    peak = int(np.argmax(em))
    assert 0 < peak < len(em) - 1
    assert em[0] < em[peak] and em[-1] < 0.01
    assert np.all(np.diff(em[: peak + 1]) > 0)      # rises ...
    assert np.all(np.diff(em[peak:]) <= 1e-12)      # ... then falls

    # With a window of 3 the slope at round k is (EM_k - EM_{k-2}) / 2. EM peaks at round H + peak = 8 and
    # falls fast after it (slope -0.23 at round 12): falling is not flat, so nothing freezes there (a rule
    # reading "slope < phi" with its sign froze at round 11, EM still 0.22). |slope| < phi first holds at
    # round 17 (-0.0096), so the third flat evaluation in a row is round 19.
    ev = slopes(theta, H, WINDOW)                     # ev[i] is round H + WINDOW - 1 + i
    first = H + WINDOW - 1
    assert all(s < -PHI for s in ev[11 - first: 17 - first])             # falling fast, rounds 11-16
    assert all(abs(s) < PHI for s in ev[17 - first: 20 - first])         # flat from round 17
    fired = [k for k in range(len(theta)) if should_freeze(theta[: k + 1], H, W, PHI, WINDOW)]
    assert fired[0] == 19
    assert em[19 - H] < 0.01 < 0.2 < em[11 - H]


def test_not_enough_evaluations_never_freezes():
    assert not should_freeze([0.0] * 6, H, W, PHI, WINDOW)     # 2 movements: no slope yet
    assert should_freeze([0.0] * 10, H, W, PHI, WINDOW)        # a block that never moves is done


def test_the_series_is_the_definition_bit_for_bit_and_one_series_answers_every_question():
    """movement_series builds U pair by pair and |U| once; it must equal EM_k written out per window, to the
    bit, so that a faster series never moves a freeze."""
    rng = np.random.default_rng(0)
    history = [rng.standard_normal(1001).astype(np.float32) for _ in range(12)]
    stacked = np.stack([h.astype(np.float64) for h in history])
    updates = np.diff(stacked, axis=0)
    by_definition = [float(np.abs(updates[k - H: k].sum(axis=0)).sum() / np.abs(updates[k - H: k]).sum())
                     for k in range(H, len(history))]
    em = movement_series(history, H)
    assert em == by_definition
    assert trend(em, WINDOW) == slopes(history, H, WINDOW)
    assert is_flat(trend(em, WINDOW), W, PHI) == should_freeze(history, H, W, PHI, WINDOW)
    assert is_flat([0.2, 0.0, 0.0, 0.0], W, PHI) and not is_flat([0.0, 0.0], W, PHI)
    with pytest.raises(ValueError, match="W must be"):
        is_flat([0.0], 0, PHI)
