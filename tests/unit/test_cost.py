"""The cost model's arithmetic on real profiles."""
from dataclasses import replace

import pytest

from edgefl.cost.constants import DEFAULTS
from edgefl.cost.model import config_cost, cost
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef

CNN = ModelRef.of("cnn")
RESNET = ModelRef.of("resnet20")


def test_components_add_up_and_optimizer_slots(store):
    p = store.full(CNN)
    sgd = cost(p, TrainConfig(num_layers=4, batch_size=16), "torch")
    adamw = cost(p, TrainConfig(num_layers=4, batch_size=16, optimizer="adamw"), "torch")
    trained_param_bytes = sum(l.param_bytes for l in p.layers)
    assert sgd.gradient_bytes == trained_param_bytes
    assert sgd.optimizer_bytes == trained_param_bytes
    assert adamw.optimizer_bytes == 2 * trained_param_bytes
    assert sgd.peak_memory_bytes == sgd.runtime_baseline_bytes + sgd.training_bytes
    assert sgd.runtime_baseline_bytes == DEFAULTS["torch"].baseline_bytes
    assert cost(p, TrainConfig(num_layers=4), "ort").runtime_baseline_bytes == DEFAULTS["ort"].baseline_bytes


def test_activations_scale_with_batch_and_vanish_when_frozen(store):
    p = store.full(RESNET)
    a8, a16, a32 = (cost(p, TrainConfig(num_layers=20, batch_size=b), "torch").activation_bytes for b in (8, 16, 32))
    # per-sample bytes times the batch plus a per-batch part (BN statistics): exactly affine in the batch
    assert a32 - a16 == 2 * (a16 - a8) > 0
    assert 0 <= 2 * a8 - a16 < a8 / 100
    previous = None
    for k in range(20):
        c = cost(p, TrainConfig(num_layers=20, frozen_prefix=k), "torch")
        if previous is not None:
            assert c.activation_bytes <= previous.activation_bytes
            assert c.upload_bytes <= previous.upload_bytes
            assert c.flops_per_sample <= previous.flops_per_sample
            assert c.peak_memory_bytes <= previous.peak_memory_bytes
        assert c.weights_frozen_bytes == sum(l.param_bytes + l.buffer_bytes for l in p.layers[:k])
        previous = c


def test_flops_frozen_forward_only_trained_three_times(store):
    p = store.full(CNN)
    fwd = [l.forward_flops for l in p.layers]
    full = cost(p, TrainConfig(num_layers=4), "torch")
    # the first trained layer needs no input gradient: forward + weight gradient only
    assert full.flops_per_sample == pytest.approx(3 * sum(fwd) - fwd[0])
    frozen2 = cost(p, TrainConfig(num_layers=4, frozen_prefix=2), "torch")
    assert frozen2.flops_per_sample == pytest.approx(fwd[0] + fwd[1] + 2 * fwd[2] + 3 * fwd[3])
    # conv5x5 1->32 on 28x28 (padding 2): 2 * 28*28*32 * 25 FLOPs
    assert fwd[0] == 2 * 28 * 28 * 32 * 25


def test_upload_is_trained_tensors_only(store):
    p = store.full(RESNET)
    c = cost(p, TrainConfig(num_layers=20, frozen_prefix=19), "torch")
    assert c.upload_bytes == p.layers[19].param_bytes + p.layers[19].buffer_bytes
    assert c.trained_params == p.layers[19].params
    assert c.download_bytes == sum(l.param_bytes + l.buffer_bytes for l in p.layers)


def test_head_width_shrinks_memory_and_upload(store):
    wide = TrainConfig(num_layers=20, frozen_prefix=3, head_start=4, head_width=1.0)
    narrow = wide.with_(head_width=0.25)
    cw = cost(store.full(RESNET), wide, "torch")
    cn = cost(store.profile(RESNET, narrow.widths), narrow, "torch")
    assert cn.activation_bytes < cw.activation_bytes
    assert cn.upload_bytes < cw.upload_bytes / 4


def test_aux_head_adds_its_weights_and_drops_later_layers(store):
    p = store.full(RESNET)
    aux = store.aux(RESNET, None, 7, "linear")
    c = cost(p, TrainConfig(num_layers=20, frozen_prefix=1, trained_end=7, aux_head="linear"), "torch", aux)
    layers = p.layers
    assert c.trained_params == sum(l.params for l in layers[1:7]) + aux.params
    assert c.download_bytes == sum(l.param_bytes + l.buffer_bytes for l in layers[:7]) + aux.param_bytes + aux.buffer_bytes
    with pytest.raises(ValueError):
        cost(p, TrainConfig(num_layers=20, frozen_prefix=1, trained_end=7, aux_head="linear"), "torch")


def test_trainconfig_rejects_nonsense():
    with pytest.raises(ValueError):
        TrainConfig(num_layers=4, frozen_prefix=5)
    with pytest.raises(ValueError):
        TrainConfig(num_layers=4, trained_end=2)           # stops early without a head
    with pytest.raises(ValueError):
        TrainConfig(num_layers=4, head_width=0.5)          # scaled without saying where
    c = TrainConfig(num_layers=4, frozen_prefix=1, head_start=2, head_width=0.5)
    assert TrainConfig.from_json(c.to_json()) == c
    assert c.hash() == TrainConfig.from_json(c.to_json()).hash()



def test_hidden_layer_bytes_are_priced_only_when_a_layer_before_the_last_trains(store):
    p = store.full(RESNET)
    k = DEFAULTS["executorch"].for_model("resnet20")
    assert k.hidden_bytes > 0
    head_only = cost(p, TrainConfig(num_layers=20, frozen_prefix=19), "executorch")
    last_two = cost(p, TrainConfig(num_layers=20, frozen_prefix=18), "executorch")
    assert not head_only.terms.hidden and last_two.terms.hidden
    without_hidden = replace(k, hidden_bytes=0)
    assert last_two.terms.peak(k) - last_two.terms.peak(without_hidden) == k.hidden_bytes
    # a ProFL step that ends before the classifier trains hidden layers whatever its prefix
    step = TrainConfig(num_layers=20, frozen_prefix=18, trained_end=19, aux_head="linear")
    assert config_cost(store, RESNET, step, "executorch").terms.hidden
