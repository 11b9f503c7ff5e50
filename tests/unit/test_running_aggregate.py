"""The running aggregate (edgefl.server.aggregate): contributions folded one at a time give the batch weighted
mean, per entry over the devices that trained it, and the order they arrive in moves a float32 result by
at most one unit in the last place."""
from __future__ import annotations

import itertools

import pytest
import torch

from edgefl.server.aggregate import RunningAggregate

pytestmark = pytest.mark.usefixtures("one_thread")

WHOLE = torch.ones((), dtype=torch.bool)


def fold(global_state, contributions, mode="trained"):
    running = RunningAggregate(global_state, mode)
    for c in contributions:
        running.add(c)
    return running.result()


def within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    inf = torch.full_like(a, float("inf"))
    return bool(((b >= torch.nextafter(a, -inf)) & (b <= torch.nextafter(a, inf))).all())


@pytest.fixture
def slices():
    """Global w (6 x 5, float32); five devices with uneven example counts: two trained w whole, three a
    prefix of its rows (HeteroFL / FjORD widths 1/3, 1/2, 2/3), so row i was trained by a different set."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(6, 5, generator=gen)
    contributions = []
    for n, rows in ((17, 6), (3, 2), (40, 3), (9, 6), (25, 4)):
        mask = WHOLE.expand(6, 5) if rows == 6 else torch.arange(6).unsqueeze(1).expand(6, 5) < rows
        placed = torch.where(mask, torch.randn(6, 5, generator=gen), g)
        contributions.append((n, {"w": placed}, {"w": mask}))
    return {"w": g}, contributions


def test_a_whole_tensor_folds_to_the_batch_weighted_mean():
    gen = torch.Generator().manual_seed(1)
    g = {"w": torch.randn(64, 32, generator=gen)}
    uploads = [(n, torch.randn(64, 32, generator=gen)) for n in (20, 7, 33, 1, 12)]

    new = fold(g, [(n, {"w": x}, {"w": WHOLE.expand(64, 32)}) for n, x in uploads])

    batch = sum(n * x for n, x in uploads) / sum(n for n, _ in uploads)    # float32, all at once
    torch.testing.assert_close(new["w"], batch)
    assert new["w"].dtype == torch.float32


def test_each_entry_is_averaged_over_the_devices_that_trained_it(slices):
    g, contributions = slices

    new = fold(g, contributions)["w"]

    for row in range(6):
        trainers = [(n, p["w"][row]) for n, p, m in contributions if bool(m["w"][row, 0])]
        expected = sum(n * x for n, x in trainers) / sum(n for n, _ in trainers)
        torch.testing.assert_close(new[row], expected)
    # sampled (CAFF): every device counts, with the global row where it did not train
    total = sum(n for n, _, _ in contributions)
    expected = sum(n * torch.where(m["w"], p["w"], g["w"]) for n, p, m in contributions) / total
    torch.testing.assert_close(fold(g, contributions, "sampled")["w"], expected)


@pytest.mark.parametrize("mode", ["trained", "sampled"])
def test_arrival_order_moves_a_result_by_at_most_one_ulp(slices, mode):
    g, contributions = slices
    in_order = fold(g, contributions, mode)["w"]

    for order in itertools.permutations(contributions):
        assert within_one_ulp(in_order, fold(g, order, mode)["w"])


def test_integer_tensors_take_the_max_over_trainers_in_any_order():
    g = {"n": torch.tensor([5, 5, 5])}
    contributions = [(1, {"n": torch.tensor([9, 4, 1])}, {"n": torch.tensor([True, False, True])}),
                     (2, {"n": torch.tensor([6, 3, 7])}, {"n": torch.tensor([True, False, True])})]
    for order in (contributions, contributions[::-1]):
        assert fold(g, order)["n"].tolist() == [9, 5, 7]


def test_the_accumulator_holds_sums_not_uploads(slices):
    g, contributions = slices
    running = RunningAggregate(g, "trained")
    for c in contributions:
        running.add(c)
    held = list(running._num.values()) + [d for d in running._den.values() if isinstance(d, torch.Tensor)]
    assert running.count == 5 and running.total == 94.0
    assert sum(t.numel() for t in held) == 2 * g["w"].numel()      # one numerator, one per-element count


def test_bad_contributions_are_refused_on_arrival():
    g = {"w": torch.zeros(2)}
    running = RunningAggregate(g)
    with pytest.raises(ValueError, match="example counts"):
        running.add((-1, {"w": torch.ones(2)}, {"w": WHOLE.expand(2)}))
    with pytest.raises(KeyError, match="ensure_aux"):
        running.add((1, {"aux.x": torch.ones(1)}, {"aux.x": WHOLE.expand(1)}))
    with pytest.raises(ValueError, match="mode"):
        RunningAggregate(g, "median")
    zero = RunningAggregate(g)
    zero.add((0, {"w": torch.ones(2)}, {"w": WHOLE.expand(2)}))
    with pytest.raises(ValueError, match="positive sum"):
        zero.result()
    assert RunningAggregate(g).result()["w"] is g["w"]             # nothing folded: the global state
