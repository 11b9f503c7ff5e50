"""Submodel extraction and embedding: every zoo model reports its channel spaces, extract feeds a device
model that loads strictly under every index mode, embed places updates back exactly where they came from,
and index selection follows HeteroFL (prefix), FedRolex (SLT eq. 3) and Federated Dropout (random)."""
from __future__ import annotations

import pytest
import torch
from zoo_inputs import small

from edgefl.errors import ConfigError, ReportRejected
from edgefl.server.submodel import IndexSets, device_model, embed, ensure_aux, extract, index_sets
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef, build, model_names
from edgefl.zoo.base import scaled
from edgefl.zoo.spaces import size, tensor_dims

pytestmark = pytest.mark.usefixtures("one_thread")


def global_state(ref: ModelRef) -> dict:
    torch.manual_seed(0)
    return build(ref).state_dict()


def configs(ref: ModelRef) -> list[TrainConfig]:
    """Whole-model scaling in every index mode, an SLT step (frozen prefix, one full layer, 1/4 head) and
    depth-limited training with both auxiliary heads (ProFL / FeDepth / DepthFL)."""
    model = build(ref)
    L, cut = len(model.layers), model.cut_points[len(model.cut_points) // 2]
    out = [TrainConfig(L, head_start=0, head_width=0.5, index_mode=m) for m in ("prefix", "rolling", "random")]
    out.append(TrainConfig(L, frozen_prefix=cut - 1, head_start=cut, head_width=0.25))
    out += [TrainConfig(L, frozen_prefix=1, trained_end=cut, aux_head=k, head_start=0, head_width=0.5,
                        index_mode=m) for k, m in (("linear", "rolling"), ("conv", "random"))]
    return out


def _local(dim, widths) -> int:
    return sum(scaled(s.size, widths[s.layer]) * s.inner for s in dim)


@pytest.mark.parametrize("name", model_names())
def test_channel_dims_describe_every_scaled_dimension(name):
    ref = small(name)
    full = build(ref)
    L = len(full.layers)
    widths = [1.0] * (L // 2) + [0.25] * (L - L // 2)
    scaled_model = build(ref, widths)
    dims, full_state = full.channel_dims(), full.state_dict()

    assert scaled_model.channel_dims() == dims                       # the description is width-free
    for key, t in scaled_model.state_dict().items():
        for d, dim in enumerate(dims[key]):
            assert full_state[key].shape[d] == (size(dim) if dim else t.shape[d]), (key, d)
            assert t.shape[d] == (_local(dim, widths) if dim else full_state[key].shape[d]), (key, d)
    for b in full.cut_points[:2]:
        head, full_head = scaled_model.aux_head(b, "conv"), full.aux_head(b, "conv")
        for key, t in head.state_dict().items():
            for d, dim in enumerate(tensor_dims(full_head)[key]):
                assert t.shape[d] == (_local(dim, widths) if dim else full_head.state_dict()[key].shape[d])


@pytest.mark.parametrize("name", model_names())
def test_extract_loads_strictly_into_the_device_model(name):
    ref = small(name)
    state = global_state(ref)
    for config in configs(ref):
        indices = index_sets(ref, config, round=5, device_seed=3)
        device = device_model(ref, config, indices)

        device.load_state_dict(extract(state, ref, config, indices), strict=True)

        x = device.example_input(2)
        with torch.no_grad():
            out = device(x)
            if config.aux_head:
                out = device.aux(out)
        assert out.shape[-1] == device.num_classes, config


@pytest.mark.parametrize("name", ["resnet20", "densenet40", "transformer", "cnn"])
def test_embed_inverts_extract_on_what_the_device_trained(name):
    ref = small(name)
    state = global_state(ref)
    for config in configs(ref)[2:]:
        indices = index_sets(ref, config, round=2, device_seed=1)
        sent = extract(state, ref, config, indices)
        update = {k: v + 1 for k, v in sent.items()}

        placed, mask = embed(state, update, ref, config, indices)

        base = ensure_aux(state, ref, [config])
        trained = {k for k in sent if k.startswith("aux.") or int(k.split(".")[1]) >= config.frozen_prefix}
        assert sum(int(m.sum()) for m in mask.values()) == sum(sent[k].numel() for k in trained)
        for key, p in placed.items():
            assert torch.equal(p[mask[key]], base[key][mask[key]] + 1), key
            assert torch.equal(p[~mask[key]], base[key][~mask[key]]), key
        again = extract({**base, **placed}, ref, config, indices)
        assert all(torch.equal(again[k], update[k]) for k in trained)
        assert all(torch.equal(again[k], sent[k]) for k in sent.keys() - trained)   # frozen: never uploaded
        assert len(placed) == len(trained)


@pytest.mark.parametrize("name", model_names())
def test_full_width_device_computes_the_global_output(name):
    ref = small(name)
    torch.manual_seed(1)
    model = build(ref).eval()
    L = len(model.layers)
    for config in [TrainConfig(L, frozen_prefix=L // 2, head_start=L // 2, head_width=1.0, index_mode="random"),
                   TrainConfig(L, head_start=0, head_width=1.0, index_mode="rolling")]:
        indices = index_sets(ref, config, round=7, device_seed=2)
        assert indices.kept == {}
        device = device_model(ref, config, indices).eval()
        device.load_state_dict(extract(model.state_dict(), ref, config, indices), strict=True)
        x = model.example_input(2)
        with torch.no_grad():
            assert torch.equal(device(x), model(x))


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("mode", ["rolling", "random"])
def test_scaled_device_computes_the_global_model_with_the_rest_zeroed(name, mode):
    # Zero every global entry the device does not hold: dropped channels then feed nothing, so the global
    # model computes what the device does. Only the attention scale 1/sqrt(head_dim) sees the narrower
    # head, so the device takes the global scale.
    ref = small(name)
    torch.manual_seed(2)
    model = build(ref).eval()
    L = len(model.layers)
    config = TrainConfig(L, head_start=0, head_width=0.5, index_mode=mode)
    indices = index_sets(ref, config, round=5, device_seed=4)
    state = model.state_dict()
    device = device_model(ref, config, indices).eval()
    device.load_state_dict(extract(state, ref, config, indices), strict=True)
    _, mask = embed(state, extract(state, ref, config, indices), ref, config, indices)
    model.load_state_dict({k: torch.where(mask[k], v, torch.zeros_like(v)) for k, v in state.items()})
    for full, narrow in zip(model.layers, device.layers, strict=True):
        if hasattr(full, "attn"):
            narrow.attn.scale = full.attn.scale

    x = model.example_input(2)
    with torch.no_grad():
        torch.testing.assert_close(device(x), model(x), rtol=1e-4, atol=1e-5)


def test_aux_heads_start_from_a_seeded_init():
    ref = small("resnet20")
    state = global_state(ref)
    config = TrainConfig(20, frozen_prefix=3, trained_end=7, aux_head="conv")
    indices = index_sets(ref, config)

    first, second = extract(state, ref, config, indices), extract(state, ref, config, indices)

    aux = [k for k in first if k.startswith("aux.")]
    assert aux and all(torch.equal(first[k], second[k]) for k in aux)
    assert "aux.7.conv.0.0.weight" in ensure_aux(state, ref, [config])


def eq3(r: int, M: int, s: float) -> set[int]:
    """SLT eq. 3, case by case."""
    k, rh = int(s * M), r % M
    if rh + k <= M:
        return set(range(rh, rh + k))
    return set(range(rh, M)) | set(range(0, rh + k - M))


def test_rolling_window_is_slt_eq3_with_wrap_around():
    ref = ModelRef.of("transformer", embed=24, heads=3, layers=1, context=8)    # per-head dimension M = 8
    config = TrainConfig(3, head_start=0, head_width=0.5, index_mode="rolling")

    assert index_sets(ref, config, round=6).kept["L1.head"] == (0, 1, 6, 7)
    for r in range(20):
        kept = index_sets(ref, config, round=r).kept
        assert set(kept["L1.head"]) == eq3(r, 8, 0.5)
        assert set(kept["L1.mlp"]) == eq3(r, 96, 0.5)


def test_random_indices_are_drawn_per_device_and_round():
    ref = small("cnn")
    config = TrainConfig(4, head_start=0, head_width=0.25, index_mode="random")
    draw = index_sets(ref, config, round=3, device_seed=1).kept

    assert draw == index_sets(ref, config, round=3, device_seed=1).kept
    assert draw != index_sets(ref, config, round=4, device_seed=1).kept
    assert draw != index_sets(ref, config, round=3, device_seed=2).kept
    assert {k: len(v) for k, v in draw.items()} == {"L0": 8, "L1": 16, "L2": 128}
    assert all(list(v) == sorted(set(v)) for v in draw.values())


def test_prefix_keeps_the_first_channels_and_full_layers_keep_all():
    ref = small("resnet20")
    config = TrainConfig(20, frozen_prefix=4, head_start=5, head_width=0.5)     # head starts mid-stage
    indices = index_sets(ref, config)

    assert indices.kept["stream0"] == tuple(range(8)) and indices.kept["L5"] == tuple(range(8))
    assert "L3" not in indices.kept
    with pytest.raises(ConfigError, match="stream0"):
        index_sets(ref, config.with_(index_mode="rolling"))


def test_embed_rejects_a_malformed_update():
    ref = small("cnn")
    state = global_state(ref)
    config = TrainConfig(4, frozen_prefix=2, head_start=0, head_width=0.5)
    indices = index_sets(ref, config)
    update = extract(state, ref, config, indices)
    with pytest.raises(ReportRejected, match="shape"):
        embed(state, {**update, "layers.3.weight": torch.zeros(10, 512)}, ref, config, indices)
    del update["layers.3.bias"]
    with pytest.raises(ReportRejected, match="lacks"):
        embed(state, update, ref, config, indices)
    with pytest.raises(ValueError, match="keeps"):
        extract(state, ref, config, IndexSets(config.widths, {}))
