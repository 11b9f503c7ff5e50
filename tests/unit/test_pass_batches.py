"""A pass's batches never end on a single example (edgefl.trainconfig.pass_batches), in the emulation's torch
trainer as on the devices: batch norm cannot normalise one example over VGG-11's 1x1 maps."""
from __future__ import annotations

import numpy as np
import pytest

from edgefl.trainconfig import TrainConfig, pass_batches


@pytest.mark.parametrize("examples, batch, starts", [
    (64, 32, [0, 32]), (65, 32, [0, 32]), (66, 32, [0, 32, 64]), (33, 32, [0]), (1, 32, []), (31, 32, [0]),
    (5, 1, [0, 1, 2, 3, 4]), (0, 32, [])])
def test_a_remainder_of_one_example_is_skipped(examples, batch, starts):
    assert list(pass_batches(examples, batch)) == starts


def test_vgg_trains_on_a_share_one_past_a_whole_batch():
    """A Dirichlet share of 33 examples at batch 32 stopped the VGG-11 emulation (torch: "Expected more than 1
    value per channel when training")."""
    from edgefl.engines.local import torch_trainer
    from edgefl.zoo import ModelRef, build

    ref = ModelRef.of("vgg11bn", num_classes=10, input_shape=(1, 32, 32))
    model = build(ref)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(33, 1, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=33)
    losses = torch_trainer(ref).train(model, TrainConfig(num_layers=len(model.layers), batch_size=32), x, y,
                                      lr=0.01, seed=0)
    assert len(losses) == 1 and np.isfinite(losses[0])
