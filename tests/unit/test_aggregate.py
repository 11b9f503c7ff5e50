"""Aggregation: the layer-wise weighted mean over the devices that trained each entry ('trained') and
CoCoFL/CAFF's rule where every sampled device counts ('sampled'), on hand-made tensors with the expected
numbers worked out by hand."""
from __future__ import annotations

import pytest
import torch

from edgefl.server.submodel import aggregate, embed, extract, index_sets
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

pytestmark = pytest.mark.usefixtures("one_thread")

T, F = True, False


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def m(*values):
    return torch.tensor(values, dtype=torch.bool)


@pytest.fixture
def round_():
    """Global w = [1, 1, 1, 1], b = [10] (nobody trains it), n = 5 (a BN counter).
    Device A (1 example) trained w[0:2] -> [3, 5] and n -> 7; device B (3 examples) trained w[1:3] -> [9, 2]."""
    global_state = {"w": t(1, 1, 1, 1), "b": t(10), "n": torch.tensor(5)}
    a = (1, {"w": t(3, 5, 1, 1), "n": torch.tensor(7)}, {"w": m(T, T, F, F), "n": torch.tensor(True)})
    b = (3, {"w": t(1, 9, 2, 1)}, {"w": m(F, T, T, F)})
    return global_state, [a, b]


def test_trained_mode_averages_over_the_devices_that_trained_each_entry(round_):
    global_state, contributions = round_

    new = aggregate(global_state, contributions, "trained")

    # w[0]: A alone -> 3; w[1]: (1*5 + 3*9) / 4 = 8; w[2]: B alone -> 2; w[3]: nobody -> 1
    assert torch.equal(new["w"], t(3, 8, 2, 1))
    assert new["b"] is global_state["b"]
    assert new["n"].item() == 7                                       # integer buffer: max over trainers


def test_sampled_mode_counts_every_device_with_the_global_value_where_it_did_not_train(round_):
    global_state, contributions = round_

    new = aggregate(global_state, contributions, "sampled")

    # weights 1 and 3, total 4. w[0]: (1*3 + 3*1) / 4 = 1.5; w[1]: (1*5 + 3*9) / 4 = 8;
    # w[2]: (1*1 + 3*2) / 4 = 1.75; w[3]: (1*1 + 3*1) / 4 = 1
    assert torch.equal(new["w"], t(1.5, 8, 1.75, 1))
    assert torch.equal(new["b"], t(10))
    assert new["n"].item() == 7


def test_slices_of_a_matrix():
    # A 3x2 weight; device A trained rows {0, 2} x column {1} (a channel slice in both dims), device B
    # the whole of row 2 (its rows {2}, all columns).
    g = torch.zeros(3, 2)
    a_placed, a_mask = g.clone(), torch.zeros(3, 2, dtype=torch.bool)
    a_placed[[0, 2], 1], a_mask[[0, 2], 1] = 4.0, True
    b_placed, b_mask = g.clone(), torch.zeros(3, 2, dtype=torch.bool)
    b_placed[2], b_mask[2] = torch.tensor([6.0, 8.0]), True
    contributions = [(2, {"w": a_placed}, {"w": a_mask}), (2, {"w": b_placed}, {"w": b_mask})]

    trained = aggregate({"w": g}, contributions, "trained")["w"]
    sampled = aggregate({"w": g}, contributions, "sampled")["w"]

    # trained: (0,1) A -> 4; (2,0) B -> 6; (2,1) (2*4 + 2*8) / 4 = 6; others untouched 0
    assert torch.equal(trained, torch.tensor([[0.0, 4.0], [0.0, 0.0], [6.0, 6.0]]))
    # sampled: (0,1) (2*4 + 2*0) / 4 = 2; (2,0) (2*0 + 2*6) / 4 = 3; (2,1) 6
    assert torch.equal(sampled, torch.tensor([[0.0, 2.0], [0.0, 0.0], [3.0, 6.0]]))


def test_integer_buffers_take_the_max_over_trainers_else_global():
    g = {"n": torch.tensor([5, 5])}
    contributions = [(1, {"n": torch.tensor([9, 4])}, {"n": m(T, F)}),
                     (1, {"n": torch.tensor([6, 3])}, {"n": m(T, F)})]
    assert aggregate(g, contributions, "trained")["n"].tolist() == [9, 5]


def test_no_contributions_keeps_the_global_state_and_errors_are_loud(round_):
    global_state, contributions = round_
    assert aggregate(global_state, [], "trained") == global_state
    with pytest.raises(ValueError, match="mode"):
        aggregate(global_state, contributions, "mean")
    with pytest.raises(ValueError, match="example counts"):
        aggregate(global_state, [(-1, *contributions[0][1:])])
    with pytest.raises(KeyError, match="ensure_aux"):
        aggregate(global_state, [(1, {"aux.x": t(1)}, {"aux.x": m(T)})])


def test_devices_with_different_rolling_windows_average_where_they_overlap():
    ref = ModelRef.of("cnn", input_shape=(1, 8, 8))
    state = build(ref).state_dict()
    config = TrainConfig(4, head_start=0, head_width=0.5, index_mode="rolling")
    contributions = []
    for r, delta in ((0, 1.0), (8, 3.0)):           # windows of L0 (M=32, 16 kept): {0..15} and {8..23}
        indices = index_sets(ref, config, round=r)
        update = {k: v + delta for k, v in extract(state, ref, config, indices).items()}
        contributions.append((1, *embed(state, update, ref, config, indices)))

    new = aggregate(state, contributions, "trained")

    bias = new["layers.0.0.bias"] - state["layers.0.0.bias"]
    torch.testing.assert_close(bias, torch.tensor([1.0] * 8 + [2.0] * 8 + [3.0] * 8 + [0.0] * 8))


@pytest.mark.parametrize("mode", ["trained", "sampled"])
def test_a_broadcast_whole_mask_averages_as_an_explicit_one(mode):
    """embed marks a tensor trained whole with one True broadcast over its shape (no per-device copy);
    aggregation must treat it exactly as a materialised all-True mask, beside a device that trained a slice."""
    global_state = {"w": t(1, 1, 1, 1)}
    whole = torch.ones((), dtype=torch.bool).expand(4)
    a_explicit = (2, {"w": t(3, 5, 7, 9)}, {"w": m(T, T, T, T)})
    a_broadcast = (2, {"w": t(3, 5, 7, 9)}, {"w": whole})
    b = (1, {"w": t(0, 6, 1, 1)}, {"w": m(F, T, F, F)})

    expected = aggregate(global_state, [a_explicit, b], mode)["w"]
    got = aggregate(global_state, [a_broadcast, b], mode)["w"]

    assert torch.equal(got, expected)
    # trained: w[1] = (2*5 + 1*6) / 3; sampled: w[0] = (2*3 + 1*1) / 3 (b did not train it: global 1)
    assert got[1].item() == pytest.approx(16 / 3) if mode == "trained" else got[0].item() == pytest.approx(7 / 3)


def test_embed_of_a_whole_tensor_keeps_the_upload_and_a_broadcast_mask():
    ref = ModelRef.of("cnn", num_classes=10, input_shape=(1, 28, 28))
    state = build(ref).state_dict()
    config = TrainConfig(num_layers=4)
    update = {k: v + 1 for k, v in extract(state, ref, config, index_sets(ref, config)).items()}

    placed, mask = embed(state, update, ref, config, index_sets(ref, config))

    key = "layers.2.1.weight"
    assert torch.equal(placed[key], update[key]) and mask[key].shape == state[key].shape
    assert not any(mask[key].stride()) and bool(mask[key].all())
