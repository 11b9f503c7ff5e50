"""What the ExecuTorch backend guarantees beyond the shared suites (parity: tests/export/test_parity.py;
trainer contract: tests/contract/test_trainers.py):

* its layer rewrites compute what torch's layers compute, gradients and BN statistics included, and keep
  the layers' state_dict (no export: fast);
* refreshing weights rewrites the weight files only, never the program, and the runtime then trains
  from the new values (no weight baked into the program);
* the training program takes the batch it was planned for and says so otherwise;
* a fresh device process finds the backend through the registry and trains (`edgefl-device train`).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from export_cases import EXPORTS, RESNET, available, global_state, resnet_config
from torch import nn
from zoo_inputs import small

pytestmark = [EXPORTS, pytest.mark.skipif(not available("executorch"), reason="executorch is not installed")]
CONFIG = resnet_config(4, 0.25)       # shared with the parity and contract suites: exported once per session


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


LAYERS = {
    "conv3x3": lambda: nn.Conv2d(5, 7, 3, 1, 1, bias=False),
    "conv3x3-stride2-bias": lambda: nn.Conv2d(5, 7, 3, 2, 1),
    "conv1x1-stride2": lambda: nn.Conv2d(5, 7, 1, 2, 0, bias=False),
    "conv3x5-mixed": lambda: nn.Conv2d(5, 7, (3, 5), (2, 1), (1, 2)),
}


@pytest.mark.parametrize("make_conv", LAYERS.values(), ids=LAYERS.keys())
def test_rewritten_layers_match_torch(make_conv):
    from edgefl.export.et_rewrites import StatBatchNorm2d, rewrite
    torch.manual_seed(0)
    model = nn.Sequential(make_conv(), nn.BatchNorm2d(7), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    x = torch.randn(4, 5, 9, 11)
    with torch.no_grad():
        model.eval()(x)                                   # materialise the lazy linear
        model[1].running_mean.uniform_(-1, 1), model[1].running_var.uniform_(0.5, 2)
    fast = rewrite(model).train()
    # the convolution stays one: the programs hold aten.convolution, which edgefl's kernels serve
    assert isinstance(fast[1], StatBatchNorm2d) and type(fast[0]) is nn.Conv2d
    assert {k: v.shape for k, v in fast.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, want = fast(xa), model.train()(xb)               # torch's BN updates its statistics in place
    assert rel(out.detach(), want.detach()) <= 1e-6
    (out ** 2).sum().backward()
    (want ** 2).sum().backward()
    assert rel(xa.grad, xb.grad) <= 1e-5
    for (name, p), q in zip(fast.named_parameters(), model.parameters(), strict=True):
        # a conv bias before train-mode BN has a zero gradient: only rounding noise to compare there
        assert float((p.grad - q.grad).norm()) <= 1e-5 * max(float(q.grad.norm()), 1.0), name
    for got, key in zip(fast[1].updates, ("running_mean", "running_var"), strict=True):
        assert rel(got, getattr(model[1], key)) <= 1e-6, key
    fast.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert rel(fast.eval()(x), model.eval()(x)) <= 1e-6


@pytest.mark.parametrize("name", ["resnet20", "transformer"])
def test_rewritten_models_keep_their_state_dict_and_outputs(name):
    from edgefl.export.et_rewrites import rewrite
    from edgefl.zoo import build
    torch.manual_seed(0)
    ref = small(name)
    model = build(ref).eval()
    fast = rewrite(model).eval()
    state, same = model.state_dict(), fast.state_dict()
    assert list(state) == list(same) and all(torch.equal(state[k], same[k]) for k in state)
    x = model.example_input(2)
    with torch.no_grad():
        assert rel(fast(x), model(x)) <= 1e-5


def test_refreshed_weights_train_from_the_new_values_with_the_same_program(exported, tmp_path):
    from edgefl.device_runtime.trainers.base import trainer_class
    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import refresh_weights
    from edgefl.export.split import split
    from edgefl.manifest import Manifest
    from edgefl.server.submodel import index_sets

    folder = shutil.copytree(exported("executorch", RESNET, CONFIG).folder, tmp_path / "set")
    before = {f.name: f.sha256 for f in Manifest.read(folder).files}
    program = (folder / "suffix.pte").read_bytes()
    gen = torch.Generator().manual_seed(5)
    new = {k: (v + 0.1 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v + 3)
           for k, v in global_state(RESNET).items()}
    refreshed = refresh_weights(folder, new, get_backend("executorch"))
    assert (folder / "suffix.pte").read_bytes() == program
    assert {f.name for f in refreshed.suffix.files if before[f.name] != f.sha256} == {"weights.ptd", "state.npz"}

    # a step from the refreshed weights is torch's step from the new global weights
    trainer = trainer_class("executorch")(refreshed)
    parts = split(RESNET, CONFIG, new, index_sets(RESNET, CONFIG))
    loss = trainer.train_step(parts.input_example.numpy(), parts.labels_example.numpy(), 0.1)
    opt = torch.optim.SGD(parts.suffix.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-5)
    want_loss, _ = parts.suffix(*parts.suffix_example)
    want_loss.backward()
    opt.step()
    assert loss == pytest.approx(float(want_loss), rel=1e-5)
    want = parts.suffix.state_dict()
    for e in refreshed.suffix.trainable:
        assert rel(trainer.trained_tensors()[e.name], want[e.local].numpy()) <= 1e-4, e.name


def test_training_takes_the_planned_batch(exported):
    from edgefl.device_runtime.trainers.base import trainer_class
    from edgefl.errors import ConfigError
    trainer = trainer_class("executorch")(exported("executorch", RESNET, CONFIG))
    x = np.zeros((CONFIG.batch_size - 1, 3, 8, 8), np.float32)
    with pytest.raises(ConfigError, match=f"exactly {CONFIG.batch_size} examples"):
        trainer.train_step(x, np.zeros(len(x), np.int64), 0.1)
    assert trainer.steps == 0


@pytest.mark.parametrize("trainer", ["native", "python"])
def test_a_fresh_device_process_trains_through_the_registry(trainer, exported, native_trainer, tmp_path):
    folder = exported("executorch", RESNET, CONFIG).folder
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((20, 3, 8, 8)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 10, 20))
    r = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", "train", "--artifacts", str(folder),
                        "--data", str(tmp_path), "--steps", "6", "--lr", "0.05", "--format", "json",
                        "--trainer", trainer], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["runtime"] == "executorch" and report["steps"] == 6
    assert report["trainer"] == trainer and report["torch_loaded"] is (trainer == "python")
    assert report["loss_after"] < report["loss_before"]
    assert report["peak_rss_bytes"] >= report["loaded_rss_bytes"] > 0


def test_a_changed_byte_names_the_file(exported, tmp_path):
    from edgefl.errors import ArtifactError
    from edgefl.manifest import ArtifactSet
    folder = shutil.copytree(exported("executorch", RESNET, CONFIG).folder, tmp_path / "set")
    weights = folder / "weights.ptd"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.ptd"):
        ArtifactSet.open(folder)
