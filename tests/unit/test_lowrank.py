"""Low-rank training (Heterogeneous LoRA, FedHM): the cost arithmetic, the rank each group gets, the
heterogeneous-rank aggregation on hand-made tensors, SVD factors, and the device model against the cost
model's prediction of what autograd keeps."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest
import torch

from edgefl.cost.model import cost, low_rank_layer
from edgefl.cost.profile import LayerProfile
from edgefl.device_runtime.trainers.memory import measured
from edgefl.device_runtime.trainers.objectives import Objective
from edgefl.engines.local import torch_trainer
from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, get_strategy
from edgefl.server import lowrank
from edgefl.server.submodel import aggregate, device_model, embed, ensure_aux, entries, extract, index_sets
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build

pytestmark = pytest.mark.usefixtures("one_thread")

LM = ModelRef.of("transformer", layers=2, embed=24, heads=2, context=16, vocab=82)


def layer(linears, params=1000):
    return LayerProfile(kind="Block", params=params, param_bytes=4 * params, buffer_bytes=0, output_shape=(16, 24),
                        output_bytes=0, forward_flops=5000.0, activation_bytes=700, carried_bytes=0,
                        output_saved_bytes=0, linears=tuple(linears))


def test_low_rank_layer_arithmetic():
    # two linears 8x4 (bias) and 4x8 (no bias), 3 rows per sample; 1000 - 32 - 8 - 32 = 928 other parameters
    base = layer([(8, 4, 3, True), (4, 8, 3, False)])
    lora, frozen, no_wgrad = low_rank_layer(base, "lora", 2)
    assert lora.params == 1000 - 32 - 8 - 32 + 2 * 12 + 2 * 12          # LayerNorms etc. + adapters r(P+Q)
    assert frozen == 4 * (32 + 8 + 32) and no_wgrad == 2 * 3 * 32 * 2      # W and b frozen: no weight gradient
    assert lora.activation_bytes == 700 + 4 * (3 * 2 + 3 * 2)               # each adapter's rank-2 intermediate
    assert lora.forward_flops == 5000 + 2 * 3 * 2 * 12 * 2
    factor, frozen, no_wgrad = low_rank_layer(base, "factor", 2)
    assert factor.params == 1000 - 64 + 2 * 24 and frozen == 0 and no_wgrad == 0
    assert factor.forward_flops == 5000 - 2 * 3 * 64 + 2 * 3 * 2 * 24
    assert factor.activation_bytes == lora.activation_bytes


def test_rank_prices_a_trained_suffix(store):
    prof = store.full(LM)
    full = cost(prof, TrainConfig(4, frozen_prefix=1, batch_size=4))
    r1, r4 = (cost(prof, TrainConfig(4, frozen_prefix=1, batch_size=4, rank=r)) for r in (1, 4))
    # LoRA trains fewer parameters but keeps every activation full training keeps, and more
    assert r1.upload_bytes < r4.upload_bytes < full.upload_bytes
    assert full.activation_bytes < r1.activation_bytes < r4.activation_bytes
    assert r4.weights_frozen_bytes > full.weights_frozen_bytes            # the blocks' W and b stay frozen
    assert r4.download_bytes == r4.weights_frozen_bytes + r4.upload_bytes
    assert r1.flops_per_sample < r4.flops_per_sample and r1.flops_per_sample < full.flops_per_sample
    head = prof.layers[-1]
    blocks = sum(l.params for l in prof.layers[1:3])
    linear = sum(p * q + p for l in prof.layers[1:3] for p, q, _, _ in l.linears)
    adapters = sum(4 * (p + q) for l in prof.layers[1:3] for p, q, _, _ in l.linears)
    assert r4.trained_params == blocks - linear + adapters + head.params


def fleet_for(strategy: str, budgets: dict[str, str]):
    lines = "\n".join(f"    {g}: {{count: 1, memory_budget: 4GiB, upload_budget: {b}, runtime: torch}}"
                      for g, b in budgets.items())
    fleet = parse_fleet("fleet:\n  groups:\n" + lines)
    ctx = PlanContext(fleet, LM, batch_size=4)
    return ctx, fleet, verify(get_strategy(strategy).plan(ctx), fleet)


@pytest.mark.parametrize("method,mode", [("lora", "lora"), ("fedhm", "factor")])
def test_each_group_gets_the_largest_rank_that_fits(store, method, mode):
    ctx = PlanContext(parse_fleet("fleet: {groups: {x: {count: 1, memory_budget: 4GiB}}}"), LM, batch_size=4)
    up = {r: ctx.cost(ctx.config(frozen_prefix=1, rank=r, rank_mode=mode), "torch").upload_bytes for r in (3, 4, 7, 8)}
    ctx, fleet, plan = fleet_for(method, {"three": (up[3] + up[4]) // 2, "seven": (up[7] + up[8]) // 2, "tiny": 100})
    ranks = {g: (p.steps[0].config.rank if p.steps else None) for g, p in plan.groups.items()}
    assert ranks == {"three": 3, "seven": 7, "tiny": None}
    assert plan.groups["tiny"].excluded and "upload" in plan.groups["tiny"].reason
    for g in ("three", "seven"):   # r fits, r + 1 does not (CAFF eq. 6)
        c = plan.groups[g].steps[0].config
        assert c.rank_mode == mode and c.frozen_prefix == 1 and ctx.fits(c, fleet.group(g))
        assert not ctx.fits(c.with_(rank=c.rank + 1), fleet.group(g))


def test_fedhm_trains_in_full_where_it_fits_and_lora_never_does(store):
    _, _, plan = fleet_for("fedhm", {"rich": "1GB"})
    assert plan.groups["rich"].steps[0].config.rank is None
    _, _, plan = fleet_for("lora", {"rich": "1GB"})
    assert plan.groups["rich"].steps[0].config.rank == 24          # capped at the smallest side of a weight


def hand_state(P=3, Q=2):
    """A one-linear model's state as the server holds it under LoRA: base, adapters at rank 2, merged W."""
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    base = torch.arange(P * Q, dtype=torch.float32).reshape(P, Q)
    return {"layers.1.fc.weight": base + b @ a, lowrank.lora_key("layers.1.fc", "A"): a,
            lowrank.lora_key("layers.1.fc", "B"): b, lowrank.lora_key("layers.1.fc", "base"): base}


def test_heterogeneous_ranks_aggregate_per_component_and_merge():
    state = hand_state()
    A, B = lowrank.lora_key("layers.1.fc", "A"), lowrank.lora_key("layers.1.fc", "B")
    # device 1 (rank 1, 10 examples) and device 2 (rank 2, 30 examples)
    p1, m1 = lowrank.place(state, {(A, "A"): torch.tensor([[10.0, 20.0]]), (B, "B"): torch.tensor([[2.0], [2.0], [2.0]])}, 1)
    p2, m2 = lowrank.place(state, {(A, "A"): torch.tensor([[30.0, 40.0], [50.0, 60.0]]),
                                   (B, "B"): torch.tensor([[4.0, 5.0], [4.0, 5.0], [4.0, 5.0]])}, 2)
    assert m1[A].tolist() == [[True, True], [False, False]] and m1[B].tolist() == [[True, False]] * 3
    new = aggregate(state, [(10, p1, m1), (30, p2, m2)], "trained")
    # component 0: weighted mean of both devices; component 1: only device 2 trained it
    assert torch.allclose(new[A], torch.tensor([[25.0, 35.0], [50.0, 60.0]]))
    assert torch.allclose(new[B], torch.tensor([[3.5, 5.0]] * 3))
    assert torch.equal(new[lowrank.lora_key("layers.1.fc", "base")], state[lowrank.lora_key("layers.1.fc", "base")])
    assert torch.allclose(new["layers.1.fc.weight"], state[lowrank.lora_key("layers.1.fc", "base")] + new[B] @ new[A])
    # nobody trained anything: the merge leaves W as it was
    assert torch.allclose(aggregate(state, [], "trained")["layers.1.fc.weight"], state["layers.1.fc.weight"])


def test_placing_a_wrong_rank_is_rejected():
    from edgefl.errors import ReportRejected
    state = hand_state()
    with pytest.raises(ReportRejected, match="shape"):
        lowrank.place(state, {(lowrank.lora_key("layers.1.fc", "A"), "A"): torch.zeros(2, 2)}, 1)


def test_adapters_grow_without_moving_the_model_and_in_any_order():
    model = build(LM)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    lo, hi = (TrainConfig(4, frozen_prefix=1, rank=r) for r in (2, 5))
    one = ensure_aux(ensure_aux(state, LM, [lo]), LM, [hi])
    other = ensure_aux(state, LM, [hi])
    key = "layers.1.attn.q"
    assert one[lowrank.lora_key(key, "A")].shape == (5, 24) and one[lowrank.lora_key(key, "B")].shape == (24, 5)
    assert torch.equal(one[lowrank.lora_key(key, "A")], other[lowrank.lora_key(key, "A")])
    assert not torch.count_nonzero(one[lowrank.lora_key(key, "B")])
    assert torch.equal(lowrank.merge(one)[f"{key}.weight"], state[f"{key}.weight"])


def test_lora_device_starts_from_the_global_model_and_embeds_back_exactly():
    torch.manual_seed(0)
    state = ensure_aux(build(LM).state_dict(), LM, [TrainConfig(4, frozen_prefix=1, rank=4)])
    for key in [k for k in state if k.endswith(".B")]:
        state[key] = torch.randn_like(state[key]) * 0.1            # a trained global adapter
    state = lowrank.merge(state)
    global_model = build(LM).eval()
    global_model.load_state_dict({k: v for k, v in state.items() if not k.startswith("aux.")}, strict=True)
    x = torch.randint(0, 82, (2, 16))
    for r, same in ((4, True), (2, False)):
        config = TrainConfig(4, frozen_prefix=1, rank=r)
        device = device_model(LM, config, index_sets(LM, config))
        sent = extract(state, LM, config, index_sets(LM, config))
        device.load_state_dict(sent, strict=True)
        with torch.no_grad():
            assert torch.allclose(device.eval()(x), global_model(x), atol=1e-5) == same   # truncation drops components
        trained = {e.device_key: sent[e.device_key] for e in entries(LM, config)
                   if e.layer >= 1 and not e.frozen}
        placed, mask = embed(state, trained, LM, config, index_sets(LM, config))
        assert not any(k.endswith(".weight") and "attn" in k and not k.startswith("aux.") for k in placed)  # W frozen
        for key, p in placed.items():
            assert torch.equal(p, state[key]), key                 # untouched entries round-trip exactly
        assert mask[lowrank.lora_key("layers.1.attn.q", "A")].sum() == r * 24


def test_fedhm_factors_are_the_truncated_svd_and_rebuild_w():
    torch.manual_seed(0)
    state = build(LM).state_dict()
    w = state["layers.1.mlp.0.weight"]                              # 96 x 24
    for z in (3, 24, 30):
        config = TrainConfig(4, frozen_prefix=1, rank=z, rank_mode="factor")
        sent = extract(state, LM, config, index_sets(LM, config))
        u, v = sent["layers.1.mlp.0.weight_u"], sent["layers.1.mlp.0.weight_v"]
        assert u.shape == (96, z) and v.shape == (z, 24)
        s = torch.linalg.svdvals(w.double())
        error = torch.linalg.matrix_norm((u @ v - w).double())
        assert error == pytest.approx(float(s[z:].square().sum().sqrt()), abs=1e-4)   # Eckart-Young
        trained = {e.device_key: sent[e.device_key] for e in entries(LM, config) if e.layer >= 1 and not e.frozen}
        placed, mask = embed(state, trained, LM, config, index_sets(LM, config))
        assert mask["layers.1.mlp.0.weight"].all()
        assert torch.allclose(placed["layers.1.mlp.0.weight"], u @ v, atol=1e-6)
        assert torch.allclose(placed["layers.1.mlp.0.weight"], w, atol=1e-5) == (z >= 24)


@pytest.mark.parametrize("config", [TrainConfig(4, frozen_prefix=1, rank=3, batch_size=4),
                                    TrainConfig(4, frozen_prefix=1, rank=5, rank_mode="factor", batch_size=4)])
def test_the_device_keeps_what_the_cost_model_predicts(store, config):
    predicted = cost(store.full(LM), config)
    trainer = torch_trainer(LM)
    model = device_model(LM, config, index_sets(LM, config))
    model.load_state_dict(extract(build(LM).state_dict(), LM, config, index_sets(LM, config)), strict=True)
    kept = []
    objective = measured(Objective({}, trainer, 0), kept.append)
    x, y = torch.randint(0, 82, (8, 16)).numpy(), torch.randint(0, 82, (8,)).numpy()
    trainer.train(model, config, x, y, lr=0.01, seed=0, objective=objective)
    assert kept[0] == predicted.activation_bytes
    trained = trainer.trained_names(model, config, objective.heads(config))
    state = model.state_dict()
    # what the device uploads, less the blocks' causal masks (buffers the cost model counts, never in a state dict)
    masks = sum(b.numel() * 4 for b in build(LM).buffers())
    assert sum(state[n].numel() * 4 for n in trained) == predicted.upload_bytes - masks
    assert not any(n.endswith("attn.q.weight") for n in trained) or config.rank_mode == "factor"


def test_new_fields_keep_old_hashes_and_are_checked():
    plain = TrainConfig(6, frozen_prefix=2, head_start=3, head_width=0.5)
    legacy = {k: v for k, v in asdict(plain).items() if k not in ("rank", "rank_mode", "exits", "copies")}
    assert plain.hash() == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:16]
    assert "rank" not in plain.to_json() and "exits" not in plain.to_json()
    ranked = TrainConfig(6, frozen_prefix=1, rank=4, rank_mode="factor", exits=[2, 3], copies=2)
    assert TrainConfig.from_json(json.loads(json.dumps(ranked.to_json()))) == ranked and ranked.hash() != plain.hash()
    assert list(ranked.rank_layers) == [1, 2, 3, 4]
    for bad in (dict(rank=0), dict(rank_mode="factor"), dict(rank=2, head_start=0, head_width=0.5),
                dict(rank=2, frozen_prefix=5), dict(exits=(3, 2)), dict(exits=(6,)), dict(copies=0)):
        with pytest.raises(ValueError):
            TrainConfig(6, **bad)
