"""The model zoo: every registry model builds, trains one step, scales by width and attaches its
auxiliary heads at every cut point; hand-computed parameter counts pin the architectures."""
from __future__ import annotations

import ast
import importlib
import inspect
import random

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from zoo_inputs import SMALL_INPUTS, small

from edgefl.zoo import ModelRef, build, model_names

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = {"resnet20": 20, "resnet32": 32, "resnet44": 44, "resnet56": 56, "densenet40": 40, "vgg11bn": 9,
          "cnn": 4, "transformer": 8, "vit": 8}


def out_shape(model, batch: int) -> tuple:
    if model.input_dtype == torch.long:                       # LM: logits per token, flattened
        return (batch * model.input_shape[0], model.num_classes)
    return (batch, model.num_classes)


def test_every_registry_model_is_covered():
    assert set(LAYERS) == set(model_names()) == set(SMALL_INPUTS)


@pytest.mark.parametrize("name", model_names())
def test_full_width_trains_one_step(name):
    torch.manual_seed(0)
    model = build(ModelRef.of(name))
    model.train()
    x, y = model.example_input(2), model.example_target(2)

    logits = model(x)
    F.cross_entropy(logits, y).backward()

    assert len(model.layers) == LAYERS[name]
    assert tuple(logits.shape) == out_shape(model, 2)
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def _conv(cin, cout, k, bias=False):
    return cin * cout * k * k + (cout if bias else 0)


def _norm(c):
    """BatchNorm or LayerNorm: a weight and a bias per channel."""
    return 2 * c


def _linear(cin, cout):
    return cin * cout + cout


def _resnet_params(n):
    """CIFAR ResNet-(6n+2): stem, n basic blocks per stage, 1x1 conv+BN projection where a stage starts."""
    total = _conv(3, 16, 3) + _norm(16)
    cin = 16
    for c in (16, 32, 64):
        for block in range(n):
            total += _conv(cin, c, 3) + _norm(c) + _conv(c, c, 3) + _norm(c)
            if cin != c:
                total += _conv(cin, c, 1) + _norm(c)
            cin = c
    return total + _linear(64, 10)


def _densenet_params(n=12, growth=12):
    total, c = _conv(3, 16, 3), 16
    for block in range(3):
        for _ in range(n):
            total += _norm(c) + _conv(c, growth, 3)     # BN-ReLU-Conv3x3, no bias
            c += growth
        if block < 2:
            total += _norm(c) + _conv(c, c, 1)          # transition, no compression
    return total + _norm(c) + _linear(c, 10)


def _block_params(embed, head_dim, heads, hidden):
    """Pre-LN block: 2 LayerNorms, q/k/v embed->heads*head_dim, proj back, MLP embed->hidden->embed."""
    inner = heads * head_dim
    return 2 * _norm(embed) + 3 * _linear(embed, inner) + _linear(inner, embed) + _linear(embed, hidden) + _linear(hidden, embed)


HAND_COUNTS = {
    # conv5x5 1->32 (bias) + conv5x5 32->64 (bias) + fc 64*7*7->512 + fc 512->10
    "cnn": (32 * 25 + 32) + (64 * 32 * 25 + 64) + (64 * 7 * 7 * 512 + 512) + (512 * 10 + 10),
    # convs 3x3 without bias (BN follows), BN weight + bias per channel, Linear(512 -> 10)
    "vgg11bn": sum(_conv(a, b, 3) + _norm(b) for a, b in
                   [(3, 64), (64, 128), (128, 256), (256, 256), (256, 512), (512, 512), (512, 512), (512, 512)])
               + _linear(512, 10),
    "resnet20": _resnet_params(3),
    "resnet56": _resnet_params(9),
    "densenet40": _densenet_params(),
    # token 80x96 + position 256x96, 6 blocks (2 LN, q/k/v/proj 96x96, MLP 96->384->96), final LN + 96->80
    "transformer": 80 * 96 + 256 * 96 + 6 * _block_params(96, 32, 3, 384) + _norm(96) + _linear(96, 80),
    # patch conv 4x4 3->192 (bias), cls, 65 positions, 6 blocks, LN + 192->10
    "vit": _conv(3, 192, 4, bias=True) + 192 + 65 * 192 + 6 * _block_params(192, 32, 6, 768) + _norm(192)
           + _linear(192, 10),
}


def test_hand_counts_are_the_known_figures():
    assert HAND_COUNTS["cnn"] == 1_663_370           # FedAvg paper, MNIST CNN
    assert HAND_COUNTS["resnet20"] == 272_474
    assert HAND_COUNTS["densenet40"] == 1_019_722


@pytest.mark.parametrize("name", sorted(HAND_COUNTS))
def test_full_width_parameter_count(name):
    model = build(ModelRef.of(name))
    assert sum(p.numel() for p in model.parameters()) == HAND_COUNTS[name]


def _first_and_last(model):
    first = next(m for m in model.layers[0].modules() if isinstance(m, (nn.Conv2d, nn.Embedding)))
    last = [m for m in model.layers[-1].modules() if isinstance(m, nn.Linear)][-1]
    return first, last


def _check_io_unscaled(model, ref_model):
    first, last = _first_and_last(model)
    ref_first, ref_last = _first_and_last(ref_model)
    if isinstance(first, nn.Conv2d):
        assert first.in_channels == ref_first.in_channels == model.input_shape[0]
    else:
        assert first.num_embeddings == ref_first.num_embeddings == model.num_classes
    assert last.out_features == ref_last.out_features == model.num_classes


@pytest.mark.parametrize("name", model_names())
def test_step_widths_build_and_run(name):
    ref = small(name)
    full = build(ref)
    L = len(full.layers)
    torch.manual_seed(0)
    x = full.example_input(1)
    for k in range(L + 1):
        model = build(ref, [1.0] * k + [0.25] * (L - k))
        with torch.no_grad():
            assert tuple(model(x).shape) == out_shape(full, 1), k
        _check_io_unscaled(model, full)
        assert (model.cut_points, model.stages) == (full.cut_points, full.stages)


@pytest.mark.parametrize("name", [n for n in model_names() if not n.startswith("resnet")])
def test_any_width_mix_builds_and_runs(name):
    # The ResNets are left out: a block cannot be wider than the residual stream it adds to
    # (resnet.BlockOut), so they take only widths that do not grow inside a stage.
    ref = small(name)
    L = LAYERS[name]
    rng = random.Random(name)
    for _ in range(3):
        model = build(ref, [rng.choice([0.25, 0.5, 0.75, 1.0]) for _ in range(L)])
        with torch.no_grad():
            assert tuple(model(model.example_input(1)).shape) == out_shape(model, 1)


@pytest.mark.parametrize("name", model_names())
def test_widths_are_validated(name):
    with pytest.raises(ValueError):
        build(small(name), [1.0] * (LAYERS[name] + 1))
    with pytest.raises(ValueError):
        build(small(name), [0.0] * LAYERS[name])


def test_widths_scale_hidden_sizes():
    cnn = build(ModelRef.of("cnn"), [0.5] * 4)
    assert [cnn.layers[0][0].out_channels, cnn.layers[1][0].out_channels, cnn.layers[2][1].out_features] == [16, 32, 256]
    dense = build(ModelRef.of("densenet40"), [1.0] + [0.5] * 39)
    assert dense.layers[1].body[2].out_channels == 6                 # growth 12 scaled
    transition = dense.layers[13][2]
    assert (transition.in_channels, transition.out_channels) == (16 + 12 * 6, 160 // 2)
    lm = build(ModelRef.of("transformer", context=16), [0.25] * 8)
    block = lm.layers[1]
    assert (block.attn.head_dim, block.attn.heads, block.hidden) == (8, 3, 96)
    assert block.attn.proj.out_features == 96                        # the residual width never scales


@pytest.mark.parametrize("name", model_names())
def test_aux_heads_at_every_cut_point(name):
    torch.manual_seed(0)
    model = build(small(name))
    x = model.example_input(2)
    L = len(model.layers)
    assert model.cut_points and all(0 < b < L for b in model.cut_points)
    assert list(model.stages) == sorted(set(model.stages)) and all(0 < b < L for b in model.stages)
    for b in model.cut_points:
        with torch.no_grad():
            state = model(x, 0, b)
        assert isinstance(state, torch.Tensor), b
        for kind in ("linear", "conv"):
            head = model.aux_head(b, kind)
            head.train()
            assert tuple(head(state).shape) == out_shape(model, 2), (b, kind)


@pytest.mark.parametrize("layers,stages", [(3, (2, 3, 4)), (6, (3, 5, 6, 7)), (9, (4, 6, 8, 10)),
                                           (12, (4, 7, 10, 13))])
def test_transformer_depths_and_stages(layers, stages):
    model = build(ModelRef.of("transformer", layers=layers, context=8))
    assert len(model.layers) == layers + 2
    assert model.stages == stages
    assert model.cut_points == tuple(range(1, layers + 2))


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = build(ModelRef.of("transformer", context=16))
    model.eval()
    assert any(name.endswith("mask") for name, _ in model.named_buffers())
    x = model.example_input(1)
    V = model.num_classes
    with torch.no_grad():
        base = model(x).reshape(1, 16, V)
        for t in (0, 5, 15):
            x2 = x.clone()
            x2[0, t] = (x[0, t] + 1) % V
            out = model(x2).reshape(1, 16, V)
            assert torch.equal(out[:, :t], base[:, :t]), t
            assert not torch.allclose(out[:, t], base[:, t]), t


_BANNED = {"chunk", "split", "scaled_dot_product_attention"}


@pytest.mark.parametrize("module", ["edgefl.zoo.transformer", "edgefl.zoo.blocks", "edgefl.zoo.vit"])
def test_transformers_avoid_ops_that_do_not_export(module):
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & _BANNED


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["transformer", "vit"])
def test_transformer_forward_calls_no_chunk_or_sdpa(name):
    model = build(small(name))
    calls = _Calls()
    with calls:
        model(model.example_input(1))
    assert not calls.names & _BANNED
    assert "softmax" in calls.names
