"""FedOLF's TOA: filters of the frozen layers before the last one are sampled in proportion to their
Frobenius norms, the device model for the reduced prefix still runs, and the stated download saving is
the bytes of the dropped filters and of the inputs that read them."""
from __future__ import annotations

import pytest
import torch

from edgefl.server.submodel import device_model, extract, index_sets
from edgefl.server.toa import filter_norms, sample_filters, toa
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

pytestmark = pytest.mark.usefixtures("one_thread")


CNN = ModelRef.of("cnn", input_shape=(1, 8, 8))


def cnn_state():
    torch.manual_seed(0)
    return build(CNN).state_dict()


def test_filter_norms_are_frobenius_norms_of_the_output_filters():
    state = cnn_state()
    config = TrainConfig(4, frozen_prefix=3)
    norms = filter_norms(state, CNN, config, "L1")
    expected = state["layers.1.0.weight"].double().flatten(1).norm(dim=1)      # (64, 32*5*5) rows
    torch.testing.assert_close(norms, expected)


def test_sampling_frequencies_follow_the_norms():
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    draws = 20000

    counts = torch.zeros(4)
    for _ in range(draws):
        counts[sample_filters(norms, 1, gen)] += 1           # floor(s * H_q) = 1: P(j) = ||Z_j|| / sum ||Z||

    torch.testing.assert_close(counts / draws, (norms / norms.sum()).float(), atol=0.01, rtol=0)


def test_toa_end_to_end_frequencies_follow_the_norms():
    state = cnn_state()
    state["layers.0.0.weight"] = torch.zeros_like(state["layers.0.0.weight"])
    state["layers.0.0.weight"][:4] = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(4, 1, 1, 1) / 5   # norms 1..4
    config = TrainConfig(4, frozen_prefix=3)
    counts = torch.zeros(32)
    for seed in range(600):
        result = toa(state, CNN, config, index_sets(CNN, config), s=1 / 32, seed=seed)
        counts[list(result.indices.kept["L0"])] += 1

    assert counts[4:].sum() == 0
    torch.testing.assert_close(counts[:4] / 600, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.06, rtol=0)


def test_saving_is_the_bytes_of_the_dropped_filters():
    state = cnn_state()
    config = TrainConfig(4, frozen_prefix=3)         # frozen: conv1, conv2, fc-512 (the last, kept whole)

    result = toa(state, CNN, config, index_sets(CNN, config), s=0.5)

    assert result.reduced_layers == (0, 1)
    assert [len(result.indices.kept[s]) for s in ("L0", "L1")] == [16, 32]
    dropped = (16 * 1 * 25 + 16                      # conv1: 16 of 32 filters and their biases
               + (64 * 32 - 32 * 16) * 25 + 32       # conv2: 32 of 64 filters, and the inputs of the rest
               + 512 * 32 * 2 * 2)                   # fc-512 reads 32 fewer channels of a 2x2 map
    assert result.saved_bytes == 4 * dropped


@pytest.mark.parametrize("name,kwargs,frozen,reduced", [
    ("cnn", dict(input_shape=(1, 8, 8)), 3, (0, 1)),
    ("resnet20", dict(input_shape=(3, 8, 8)), 8, (1, 3, 5)),     # stream0 reaches the trained projection
    ("densenet40", dict(input_shape=(3, 8, 8)), 14, tuple(range(13))),
    ("vgg11bn", {}, 4, (0, 1, 2)),
    ("transformer", dict(context=8, layers=4), 4, (1, 2)),        # the embedding has no filters
])
def test_the_reduced_prefix_still_runs(name, kwargs, frozen, reduced):
    ref = ModelRef.of(name, **kwargs)
    torch.manual_seed(0)
    state = build(ref).state_dict()
    config = TrainConfig(len(build(ref).layers), frozen_prefix=frozen)

    result = toa(state, ref, config, index_sets(ref, config), s=0.5, seed=1)

    assert result.reduced_layers == reduced
    assert result.saved_bytes > 0
    device = device_model(ref, config, result.indices)
    device.load_state_dict(extract(state, ref, config, result.indices), strict=True)
    with torch.no_grad():
        assert device(device.example_input(2)).shape[-1] == device.num_classes
    trained = [k for k in state if int(k.split(".")[1]) >= frozen]
    assert all(device.state_dict()[k].shape == state[k].shape for k in trained)


def test_nothing_to_approximate():
    state = cnn_state()
    config = TrainConfig(4, frozen_prefix=1)
    base = index_sets(CNN, config)
    assert toa(state, CNN, config, base, s=0.5).indices == base
    assert toa(state, CNN, config.with_(frozen_prefix=3), base, s=1.0).saved_bytes == 0
