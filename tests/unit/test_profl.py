"""ProFL's rules as its paper states them: blocks by residual stage with the stem inside block 1 and VGG11_bn in
two blocks (sec. 4.1); each round drawn from the clients that can afford the current block, those that can
afford no block training the output layer (sec. 3, 4.1); the Map and composed output modules (sec. 3.2)."""
import numpy as np
import pytest
import torch

from edgefl.fleet import parse_fleet
from edgefl.planning.progress import slopes
from edgefl.planning.strategies import PlanContext
from edgefl.planning.strategies.profl import OutputModuleChange, ProFL, block_ends
from edgefl.server.coordinator import Coordinator, LoopSettings
from edgefl.server.output_modules import compose
from edgefl.server.submodel import ensure_aux
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

pytestmark = pytest.mark.usefixtures("one_thread")

ANY = "fleet:\n  groups:\n    a: {count: 2, memory_budget: 1GiB, runtime: torch}\n"
RESNET = ModelRef.of("resnet20", input_shape=(3, 8, 8))


def test_resnet_blocks_are_its_residual_stages_with_the_stem_in_the_first():
    ctx = PlanContext(parse_fleet(ANY), RESNET)
    assert ctx.full_profile.stages == (1, 7, 13, 19)        # the stem (layer 0) ends its own stage
    assert block_ends(ctx, None) == [7, 13, 20]
    notes = ProFL().plan(ctx).notes
    assert notes[0] == "blocks end at layers [7, 13, 20]; 5 steps (shrinking 2, growing 3)"


def test_vgg11_bn_in_two_blocks_is_its_first_four_convolutions_and_its_last_four():
    ctx = PlanContext(parse_fleet(ANY), ModelRef.of("vgg11bn", input_shape=(3, 32, 32)))
    assert ctx.num_layers == 9 and block_ends(ctx, 2) == [4, 9]


# CNN on Fashion-MNIST, ORT (so the Python agent), batch 32: blocks end at [1, 2, 4]; training them peaks at 125.2,
# 123.6 and 155.5 MiB, the output layers of their output modules at 114.7, 113.9 and 119.9 MiB (edgefl's cost model)
FLEET = """
fleet:
  groups:
    big: {count: 4, memory_budget: 1GiB, runtime: ort}
    mid: {count: 5, memory_budget: 142MiB, runtime: ort}
    tiny: {count: 6, memory_budget: 121MiB, runtime: ort}
"""


@pytest.fixture(scope="module")
def planned():
    fleet = parse_fleet(FLEET)
    strategy = ProFL()
    plan = strategy.plan(PlanContext(fleet, ModelRef.of("cnn"), rounds=50, batch_size=32))
    return fleet, strategy, plan


def test_a_round_draws_only_from_the_clients_that_can_afford_the_current_block(planned):
    fleet, strategy, plan = planned
    order = strategy.order(plan)
    labels = [next(s.label for g in plan.groups.values() for s in g.steps if s.rounds == key) for key in order]
    assert [label.split(":")[0] for label in labels] == ["shrink block 3/3", "shrink block 2/3", "grow block 1/3",
                                                         "grow block 2/3", "grow block 3/3"]
    mid = {s.rounds for s in plan.groups["mid"].steps}
    assert mid == set(order[1:4])                 # mid affords blocks 1 and 2, not block 3
    coordinator = Coordinator(fleet, plan, strategy, None, None, LoopSettings(rounds=50, clients_per_round=8),
                              examples=lambda d: 1)
    for step, pool in [(0, {"big", "tiny"}), (2, {"big", "mid", "tiny"}), (4, {"big", "tiny"})]:
        strategy.current = step
        assert strategy.pool(plan, 1) == pool
        drawn = {coordinator.group_of[d] for r in range(1, 21) for d in coordinator.sample(r)}
        assert drawn == pool
        assert all(len(coordinator.sample(r)) == 8 for r in range(1, 4))
    strategy.current = 0


def test_a_client_that_can_afford_no_block_trains_only_the_output_layer(planned):
    from edgefl.device_runtime.trainers.torch_trainer import TorchTrainer
    from edgefl.engines.local import torch_trainer
    from edgefl.messages import RoundInstruction

    _, strategy, plan = planned
    tiny = plan.groups["tiny"].steps
    assert len(tiny) == 5 and all(s.label.endswith("output layer only") for s in tiny)
    assert all("output layer only" not in s.label for g in ("big", "mid") for s in plan.groups[g].steps)
    step = tiny[2]                                       # grow block 1: the output module after layer 1
    assert (step.config.frozen_prefix, step.config.end, step.config.aux_head) == (1, 1, "conv")
    options = strategy.trainer_options(1, step, plan.groups["tiny"])
    assert options == {"output_layer_only": 1}
    assert strategy.trainer_options(1, plan.groups["big"].steps[2], plan.groups["big"]) == {}
    assert tiny[-1].config.frozen_prefix == 3 and strategy.trainer_options(1, tiny[-1]) == {}   # the classifier

    ref = ModelRef.of("cnn")
    state = ensure_aux(build(ref).state_dict(), ref, [step.config])
    instruction = RoundInstruction(round=1, device_id="tiny-0", config=step.config, weights_version=0, seed=3,
                                   lr=0.05, options=tuple(sorted(options.items())))
    trainer: TorchTrainer = torch_trainer(ref)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 64)
    tensors, _, _ = trainer.run(instruction, {k: v for k, v in state.items()}, x, y)
    head = sorted({k.split(".")[3] for k in state if k.startswith("aux.1.conv.")})
    assert head == ["0", "1"]                            # its conv, then its pool + linear
    assert sorted(tensors) == ["aux.1.conv.1.fc.bias", "aux.1.conv.1.fc.weight"]
    assert not torch.equal(tensors["aux.1.conv.1.fc.weight"], state["aux.1.conv.1.fc.weight"])

    # the server expects the output layer alone and places it: a report of it is not rejected as incomplete
    from edgefl.messages import DeviceReport
    from edgefl.server.global_model import TorchServerModel

    server = TorchServerModel(ref, None, trainer, seed=0, initial=build(ref).state_dict())
    delivery = server.weights_for(instruction, 3)
    assert sorted(delivery.handle[1]) == sorted(tensors)
    report = DeviceReport(round=1, device_id="tiny-0", config_hash="", status="ok", examples=64, tensors=tensors)
    examples, placed, _ = server.contribution(report, instruction, delivery.handle)
    assert examples == 64 and sorted(placed) == sorted(tensors)
    assert torch.equal(placed["aux.1.conv.1.fc.weight"], tensors["aux.1.conv.1.fc.weight"])
    # an exported artifact set trains the whole output module: a served device is expected to upload all of it
    from edgefl.engines.deployed import as_exported

    exported = server.weights_for(as_exported(instruction), 3).handle[1]
    assert set(tensors) < set(exported) and {k.split(".")[3] for k in exported} == {"0", "1"}


def _head_mse(model, state, boundary, end, x):
    head = model.aux_head(boundary, "conv")
    head.load_state_dict({k[len(f"aux.{boundary}.conv."):]: v for k, v in state.items()
                          if k.startswith(f"aux.{boundary}.conv.")})
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("aux.")})
    model.eval(), head.eval()
    with torch.no_grad():
        h = model(x, 0, boundary)
        return float(torch.nn.functional.mse_loss(head[0](h), model(h, boundary, end)))


def test_the_map_distils_a_block_into_the_next_output_module_which_carries_the_rest():
    torch.manual_seed(0)
    model = build(RESNET)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = np.random.default_rng(0).standard_normal((128, 3, 8, 8)).astype(np.float32)
    L = 20

    # shrinking step 1 (block 3, the whole model) -> step 2 (block 2): the module after layer 13 is
    # [theta_{3,Conv}, theta_L], theta_{3,Conv} distilled from block 3, theta_L the model's classifier
    fresh = ensure_aux(state, RESNET, [TrainConfig(num_layers=L, frozen_prefix=13, trained_end=13, aux_head="conv")])
    before = _head_mse(model, fresh, 13, 19, torch.as_tensor(x))
    state, done = compose(state, RESNET, OutputModuleChange(L, 13, (13, L)), x, seed=0)
    assert done["mapped"] == [13, 20] and done["linear_carried"]
    after = _head_mse(model, state, 13, 19, torch.as_tensor(x))
    with torch.no_grad():
        h = model(torch.as_tensor(x), 0, 13)
        zero = float(model(h, 13, 19).pow(2).mean())     # what predicting nothing scores
    assert after < 0.55 * before and after < 0.75 * zero, (after, before, zero)
    assert done["map_mse"] == pytest.approx(after, rel=0.1)
    assert torch.equal(state["aux.13.conv.1.fc.weight"], state["layers.19.fc.weight"])

    # step 2 -> growing's first step (block 1): the module after layer 7 is [theta_{2,Conv}, theta_{3,Conv},
    # theta_L]: theta_{2,Conv} distilled from block 2, the rest as step 2 left them
    state["aux.13.conv.1.fc.weight"] += 1.0          # as if step 2 trained them
    state["aux.13.conv.0.0.weight"] += 1.0
    state, done = compose(state, RESNET, OutputModuleChange(13, 7, (7, 13)), x, seed=0)
    assert done["mapped"] == [7, 13] and done["convs_carried"] == [19] and done["linear_carried"]
    for k in [k for k in state if k.startswith("aux.13.conv.0.")]:
        assert torch.equal(state[k.replace("aux.13.conv.0.", "aux.7.conv.1.")], state[k])
    assert torch.equal(state["aux.7.conv.2.fc.weight"], state["aux.13.conv.1.fc.weight"])

    # growing's last step trains the whole model: theta_L goes back to the classifier
    state["aux.13.conv.1.fc.weight"] -= 2.0
    state, done = compose(state, RESNET, OutputModuleChange(13, L, None), x, seed=0)
    assert done == {"composed_from": 13, "composed_to": 20, "linear_carried": True}
    assert torch.equal(state["layers.19.fc.weight"], state["aux.13.conv.1.fc.weight"])


def test_the_schedule_switch_ends_each_step_with_its_share_of_the_rounds_and_movement_does_not():
    fleet = parse_fleet(FLEET)
    ctx = PlanContext(fleet, ModelRef.of("cnn"), rounds=50, batch_size=32)
    scheduled, moving = ProFL(switch="schedule"), ProFL()
    for strategy in (scheduled, moving):
        strategy.plan_ = strategy.plan(ctx)
    ends = [last for _, last in scheduled.order(scheduled.plan_)]
    assert ends == [10, 20, 30, 40, 50]
    flat = [np.zeros(3, np.float32)] * 12            # no movement at all: the paper's rule freezes at once
    assert [scheduled.step_ends(slopes(flat, moving.H, moving.window), r) for r in (9, 10)] == [False, True]
    assert moving.step_ends(slopes(flat, moving.H, moving.window), 1)
    assert not moving.step_ends(slopes(flat[:11], moving.H, moving.window), 10)
    with pytest.raises(ValueError, match="switch 'epochs'"):
        ProFL(switch="epochs")
