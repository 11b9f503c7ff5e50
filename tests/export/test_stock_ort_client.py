"""docs/artifact-format.md is enough to train an ORT set: a client written against ONNX Runtime alone
(stock_ort_client.py: no edgefl, no torch) trains exported sets for 10 steps on fixed batches and ends
where edgefl's own OrtTrainer ends: the same losses and the same upload buffer (rel. error <= 1e-5), then
the same eval loss. Cases: BN in trained layers (ResNet-20), a conv before a max pool (CNN), a language
model with flat N*T targets and ignored (-100) targets, and AdamW next to SGD.

AdamW sets carry ORT's optimizer graph; for SGD the client applies torch.optim.SGD's rule as the document
states it (section 6.1) to the gradients ORT leaves: its 10 SGD steps match torch.optim.SGD on the eager
suffix (rel. error <= 1e-4 per tensor), where the parity suite checks one step, before any momentum has
built up."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from export_cases import CNN, EXPORTS, LM, RESNET, cnn_config, global_state, lm_config, resnet_config
from stock_ort_client import StockOrtClient

from edgefl.device_runtime.trainers.base import IGNORE_INDEX, open_trainer
from edgefl.export.split import split
from edgefl.server.submodel import index_sets

pytestmark = [EXPORTS, pytest.mark.usefixtures("one_thread")]

CLIENT = Path(__file__).with_name("stock_ort_client.py")
STEPS, TOL = 10, 1e-5
CASES = [pytest.param(RESNET, resnet_config(4, 0.25), 0.05, id="resnet20-frozen4-width0.25"),
         pytest.param(CNN, cnn_config(1), 0.05, id="cnn-frozen1"),
         pytest.param(LM, lm_config(2), 0.05, id="transformer-frozen2"),
         pytest.param(RESNET, resnet_config(4, 0.25, "adamw"), 1e-3, id="resnet20-frozen4-width0.25-adamw"),
         pytest.param(LM, lm_config(2, "adamw"), 1e-3, id="transformer-frozen2-adamw")]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def batches(ref, config, n=STEPS):
    """`n` fixed batches (model inputs, flat int64 targets), one per seed; a quarter of the targets of
    every third batch ignored."""
    out = []
    for seed in range(n):
        parts = split(ref, config, global_state(ref), index_sets(ref, config), seed=seed)
        x, y = parts.input_example.numpy(), parts.labels_example.numpy().copy()
        if seed % 3 == 2:
            y[np.random.default_rng(seed).permutation(len(y))[: len(y) // 4]] = IGNORE_INDEX
        out.append((x, y))
    return out


def test_the_client_knows_nothing_of_edgefl_or_torch():
    imported = set()
    for node in ast.walk(ast.parse(CLIENT.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported and not {m for m in imported if m.split(".")[0] in ("edgefl", "torch")}, imported


@pytest.mark.parametrize("ref, config, lr", CASES)
def test_stock_client_trains_like_the_ort_trainer(ref, config, lr, exported):
    folder = exported("ort", ref, config).folder
    client, trainer = StockOrtClient(folder), open_trainer(folder, "ort")
    assert client.id == trainer.artifacts.suffix.id
    data = batches(ref, config)
    start = trainer.upload_buffer()

    theirs = [client.step(x, y, lr) for x, y in data]
    ours = [trainer.train_step(x, y, lr) for x, y in data]
    assert theirs == pytest.approx(ours, rel=TOL)

    buffer, want = client.upload(), trainer.upload_buffer()
    assert buffer.dtype == np.float32 and buffer.shape == want.shape
    errors, offset = {}, 0
    for e in trainer.manifest.trainable:                 # per tensor: a small one cannot hide in the total
        part = slice(offset, offset + e.numel)
        errors[e.name] = rel(buffer[part], want[part])
        assert not np.array_equal(want[part], start[part]), f"{e.name} never changed: nothing was compared"
        offset += e.numel
    worst = max(errors, key=errors.get)
    print(f"{folder.name}: upload rel. error {rel(buffer, want):.2e}, worst tensor {worst} {errors[worst]:.2e}, "
          f"losses max rel. {max(abs(a - b) / abs(b) for a, b in zip(theirs, ours)):.2e}")
    assert errors[worst] <= TOL, (worst, errors[worst])
    counters = [e for e in trainer.manifest.trainable if e.kind == "counter"]
    assert all(int(trainer.trained_tensors()[e.name]) == int(global_state(ref)[e.name]) + STEPS for e in counters)

    x, y = data[2]
    loss, logits = client.evaluate(x, y)
    want_loss, want_logits = trainer.eval_batch(x, y)
    assert loss == pytest.approx(want_loss, rel=TOL) and rel(logits, want_logits) <= TOL


@pytest.mark.parametrize("ref, config, lr", [c for c in CASES if c.values[1].optimizer == "sgd"])
def test_stock_client_sgd_is_torch_sgd(ref, config, lr, exported):
    client = StockOrtClient(exported("ort", ref, config).folder)
    parts = split(ref, config, global_state(ref), index_sets(ref, config))
    opt = torch.optim.SGD(parts.suffix.parameters(), lr=lr, momentum=0.9, weight_decay=1e-5)
    for x, y in batches(ref, config):
        loss = client.step(x, y, lr)
        opt.zero_grad()
        want, _ = parts.suffix(*parts.features(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-5)
    state, offset, buffer = parts.suffix.state_dict(), 0, client.upload()
    for t in client.manifest["trainable"]:
        got = buffer[offset:offset + int(np.prod(t["shape"], dtype=np.int64))]
        offset += got.size
        assert rel(got, state[t["local"]].numpy().ravel()) <= 1e-4, t["name"]
