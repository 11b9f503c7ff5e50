"""What DepthFL's extra exits and m-FeDepth's distillation copies add to the predicted cost, and that the
prediction holds for what the torch trainer really runs."""
from __future__ import annotations

import pytest
from emulation_inputs import CNN, FLEET, small_budget

from edgefl.cost.model import cost
from edgefl.data import load_dataset
from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice
from edgefl.engines.local import torch_trainer
from edgefl.fleet import parse_fleet
from edgefl.messages import RoundInstruction
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, get_strategy
from edgefl.server.global_model import TorchServerModel
from edgefl.trainconfig import OPTIMIZER_STATE_SLOTS, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exits_add_their_heads(store):
    p = store.full(CNN)
    exits = [store.aux(CNN, None, b, "linear") for b in (1, 2)]
    plain = cost(p, TrainConfig(4, batch_size=16))
    with_exits = cost(p, TrainConfig(4, batch_size=16, exits=(1, 2)), exits=exits)
    heads = sum(e.param_bytes for e in exits)
    assert heads > 0
    assert with_exits.gradient_bytes - plain.gradient_bytes == heads
    assert with_exits.optimizer_bytes - plain.optimizer_bytes == OPTIMIZER_STATE_SLOTS["sgd"] * heads
    assert with_exits.upload_bytes - plain.upload_bytes == heads + sum(e.buffer_bytes for e in exits)
    assert with_exits.download_bytes - plain.download_bytes == with_exits.upload_bytes - plain.upload_bytes
    assert with_exits.trained_params - plain.trained_params == sum(e.params for e in exits)
    # forward, weight gradients and input gradients of each exit
    assert with_exits.flops_per_sample - plain.flops_per_sample == pytest.approx(3 * sum(e.forward_flops for e in exits))
    assert with_exits.activation_bytes > plain.activation_bytes
    with pytest.raises(ValueError, match="exit profile"):
        cost(p, TrainConfig(4, exits=(1, 2)))


def test_copies_multiply_the_trained_part_only(store):
    p = store.full(CNN)
    one = cost(p, TrainConfig(4, frozen_prefix=1, batch_size=16))
    two = cost(p, TrainConfig(4, frozen_prefix=1, batch_size=16, copies=2))
    assert two.weights_trained_bytes == 2 * one.weights_trained_bytes
    assert two.gradient_bytes == 2 * one.gradient_bytes and two.optimizer_bytes == 2 * one.optimizer_bytes
    assert (two.weights_frozen_bytes, two.upload_bytes, two.download_bytes) == (
        one.weights_frozen_bytes, one.upload_bytes, one.download_bytes)     # one frozen prefix, copy 1 uploaded
    frozen_forward = p.layers[0].forward_flops
    assert two.flops_per_sample - frozen_forward == pytest.approx(2 * (one.flops_per_sample - frozen_forward))
    logits = 16 * p.layers[-1].output_bytes
    assert two.activation_bytes == 2 * one.activation_bytes + 2 * 2 * logits   # + each KL's two probability maps


def plan(method: str):
    fleet = parse_fleet(FLEET.format(small=small_budget()))
    ctx = PlanContext(fleet, CNN, rounds=3, batch_size=32)
    return ctx, fleet, verify(get_strategy(method).plan(ctx), fleet)


def test_depthfl_and_mfedepth_plans_price_their_extras():
    ctx, fleet, depthfl = plan("depthfl")
    for name, g in depthfl.groups.items():
        step = g.steps[0]
        assert step.config.exits == tuple(b for b in (1, 2) if b < step.config.end)
        assert step.predicted == ctx.cost(step.config, g.runtime)
        if step.config.exits:
            assert step.predicted.gradient_bytes > ctx.cost(step.config.with_(exits=()), g.runtime).gradient_bytes
    ctx, fleet, fedepth = plan("fedepth")
    big = fedepth.groups["big"]
    assert big.flags == ("mutual-distillation",)
    assert all(c.copies == 2 for c in big.steps[0].sequence)
    assert all(c.copies == 1 for c in fedepth.groups["small"].steps[0].sequence)
    single = ctx.cost(big.steps[0].sequence[0].with_(copies=1), big.runtime)
    assert big.memory_budget_bytes >= big.steps[0].predicted.peak_memory_bytes > single.peak_memory_bytes


@pytest.mark.parametrize("method", ["depthfl", "fedepth"])
def test_measured_activations_match_the_prediction(method):
    """The big group's device of each plan (DepthFL: depth 4 with exits at 1 and 2; m-FeDepth: two copies)
    measures what autograd keeps in its first batch (the trainer's memory middleware)."""
    ctx, fleet, planned = plan(method)
    strategy = get_strategy(method)
    train = load_dataset("fashion-mnist", split="train")
    step = strategy.configure_round(planned, 1, "big")
    for config in step.sequence or (step.config,):
        predicted = ctx.cost(config, "torch")
        options = {**strategy.trainer_options(1, step, planned.groups["big"]),
                   "memory_check": (predicted.peak_memory_bytes, predicted.activation_bytes)}
        instruction = RoundInstruction(round=1, device_id="big-0", config=config, weights_version=0, seed=7, lr=0.05,
                                       options=tuple(sorted(options.items())))
        trainer = torch_trainer(CNN)
        server = TorchServerModel(CNN, None, trainer, seed=0)
        device = EmulatedDevice("big-0", trainer, train.x[:64], train.y[:64])
        report = device.handle(instruction, server.weights_for(instruction, 1).weights)
        assert report.ok, report.reason
        assert report.activation_bytes == pytest.approx(predicted.activation_bytes, rel=0.01)
        assert report.upload_bytes == predicted.upload_bytes
