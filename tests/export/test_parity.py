"""Exported artifacts compute what torch computes (the issue's parity bar).

For ResNet-20 (frozen prefix 0, 4, 7; head width 0.25 and 1), the transformer LM (frozen 0 and 2), the
CNN (frozen 1: a trained convolution before a max pool) and DenseNet-40 (frozen 0 at width 0.25: average-pool
transitions; frozen 20: a suffix input read by a BN and a concatenation), per
runtime backend: the prefix's output vs torch (rel. error <= 1e-5); one SGD step of the suffix on the
same batch vs torch.optim.SGD on the eager suffix (momentum, weight decay, BN statistics and counters;
rel. error of every updated trainable tensor <= 1e-4); one AdamW step vs torch.optim.AdamW (ORT <= 1e-3);
and the trained tensors, uploaded as the flat buffer and placed into the global state, load into the
global model and reproduce the runtime's eval loss. ExecuTorch on every case: `pytest -m slow`.
"""
import numpy as np
import pytest
import torch
from export_cases import (CNN, DENSENET, EXPORTS, LM, RESNET, backend_params, cnn_config, densenet_config, global_state,
                          lm_config, resnet_config)

from edgefl.device_runtime.trainers.base import trainer_class
from edgefl.export.split import split
from edgefl.manifest import flatten, unflatten
from edgefl.server.submodel import device_model, embed, entries, extract, index_sets
from edgefl.zoo import build

pytestmark = EXPORTS

CASES = ([(RESNET, resnet_config(k, s), f"resnet20-frozen{k}-width{s:g}") for k in (0, 4, 7) for s in (0.25, 1.0)]
         + [(LM, lm_config(k), f"transformer-frozen{k}") for k in (0, 2)]
         + [(CNN, cnn_config(1), "cnn-frozen1")]
         + [(DENSENET, densenet_config(0, 0.25), "densenet40-frozen0-width0.25"),
            (DENSENET, densenet_config(20), "densenet40-frozen20")])
# An ExecuTorch export of a ResNet-20 suffix takes about a minute (its toolchain runs Python passes over
# every graph node): the default suite checks it on one config of each model, `-m slow` on all of them.
ET_DEFAULT = {"resnet20-frozen4-width0.25", "transformer-frozen2", "cnn-frozen1"}
PARAMS = [pytest.param(runtime.values[0], ref, config, id=f"{name}-{runtime.values[0]}",
                       marks=[*runtime.marks, *([pytest.mark.slow] if runtime.values[0] == "executorch"
                                                and name not in ET_DEFAULT else [])])
          for runtime in backend_params(["ort", "executorch"]) for ref, config, name in CASES]
LR = 0.1


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def reference(ref, config):
    """The eager torch device model split as the pipeline splits it, on the pipeline's example batch."""
    torch.manual_seed(0)
    return split(ref, config, global_state(ref), index_sets(ref, config))


def torch_step(parts, config, lr):
    opt = (torch.optim.SGD(parts.suffix.parameters(), lr=lr, momentum=0.9, weight_decay=1e-5)
           if config.optimizer == "sgd" else torch.optim.AdamW(parts.suffix.parameters(), lr=lr))
    parts.suffix.train()
    loss, _ = parts.suffix(*parts.suffix_example)
    loss.backward()
    opt.step()
    return float(loss.detach())


@pytest.fixture(scope="module", autouse=True)
def one_thread_module(one_thread):
    yield


@pytest.mark.parametrize("runtime, ref, config", PARAMS)
def test_runtime_matches_torch(runtime, ref, config, exported):
    artifacts = exported(runtime, ref, config)
    trainer = trainer_class(runtime)(artifacts)
    parts = reference(ref, config)
    x, y = parts.input_example.numpy(), parts.labels_example.numpy()

    # the prefix's inference graph
    for got, want in zip(trainer.prefix_features(x), parts.features(parts.input_example), strict=True):
        assert got.shape == tuple(want.shape)
        assert rel(got, want) <= 1e-5

    # one SGD step on the same batch
    before = {k: v.copy() for k, v in trainer.trained_tensors().items()}
    loss = trainer.train_step(x, y, LR)
    torch_loss = torch_step(parts, config, LR)
    assert loss == pytest.approx(torch_loss, rel=1e-5)
    after, want = trainer.trained_tensors(), parts.suffix.state_dict()
    assert list(after) == [e.name for e in artifacts.suffix.trainable]
    moved = 0
    for e in artifacts.suffix.trainable:
        target = want[e.local].numpy()
        assert after[e.name].shape == target.shape and after[e.name].dtype == target.dtype, e.name
        if e.kind == "counter":
            assert after[e.name] == target == before[e.name] + 1, e.name
        else:
            assert rel(after[e.name], target) <= 1e-4, (e.name, rel(after[e.name], target))
            moved += not np.array_equal(after[e.name], before[e.name])
    assert moved == sum(e.kind != "counter" for e in artifacts.suffix.trainable)   # the step changed every tensor

    # trained tensors -> flat upload buffer -> global names -> global model; the eval loss comes back
    uploaded = unflatten(artifacts.suffix.trainable, flatten(artifacts.suffix.trainable, after))
    state, indices = global_state(ref), index_sets(ref, config)
    device_key = {e.key: e.device_key for e in entries(ref, config)}
    placed, mask = embed(state, {device_key[k]: torch.from_numpy(v) for k, v in uploaded.items()}, ref, config, indices)
    new_global = {**state, **placed}
    build(ref).load_state_dict(new_global, strict=True)
    model = device_model(ref, config, indices)
    model.load_state_dict(extract(new_global, ref, config, indices), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(parts.input_example)
        logits = model.aux(logits) if config.aux_head else logits
        torch_eval = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), parts.labels_example))
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(torch_eval, rel=1e-5)


@pytest.mark.parametrize("ref, config", [pytest.param(RESNET, resnet_config(4, 0.25, "adamw"), id="resnet20-frozen4"),
                                         pytest.param(LM, lm_config(2, "adamw"), id="transformer-frozen2")])
def test_ort_adamw_step_matches_torch(ref, config, exported):
    artifacts = exported("ort", ref, config)
    trainer = trainer_class("ort")(artifacts)
    parts = reference(ref, config)
    lr = 1e-3
    trainer.train_step(parts.input_example.numpy(), parts.labels_example.numpy(), lr)
    torch_step(parts, config, lr)
    after, want = trainer.trained_tensors(), parts.suffix.state_dict()
    worst = max(rel(after[e.name], want[e.local].numpy()) for e in artifacts.suffix.trainable if e.kind != "counter")
    assert worst <= 1e-3
