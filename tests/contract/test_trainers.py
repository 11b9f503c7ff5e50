"""The artifact Trainer contract (edgefl.device_runtime.trainers.base), one suite for every runtime: ort,
torch (torch.export programs) and executorch once its backend and trainer exist. Each runtime trains
sets exported by the same pipeline from the same global weights, so they must also agree with each
other after a step."""
import shutil
import tracemalloc

import numpy as np
import pytest
import torch
from export_cases import EXPORTS, LM, RESNET, available, backend_params, global_state, lm_config, resnet_config

from edgefl.device_runtime.trainers.base import ArtifactTrainer, trainer_class
from edgefl.export.backends import get_backend
from edgefl.export.pipeline import refresh_weights
from edgefl.export.split import split
from edgefl.server.submodel import extract, index_sets

pytestmark = EXPORTS

RUNTIMES = ("ort", "torch", "executorch")
CASES = [pytest.param(RESNET, resnet_config(4, 0.25), id="resnet20-frozen4-width0.25"),
         pytest.param(LM, lm_config(2, "adamw"), id="transformer-frozen2-adamw")]


@pytest.fixture(scope="module", autouse=True)
def threads(one_thread):
    yield


def batch(ref, config, n=None):
    parts = split(ref, config, global_state(ref), index_sets(ref, config))
    x, y = parts.input_example.numpy(), parts.labels_example.numpy()
    return (x, y) if n is None else (x[:n], y[: n * (len(y) // len(x))])


def make(runtime, ref, config, exported) -> ArtifactTrainer:
    return trainer_class(runtime)(exported(runtime, ref, config))


# The Python ExecuTorch trainer on the ResNet-20 set (229 s of a loaded CI run, most of it that trainer's steps)
# runs with -m slow: tests/export/test_native_trainer.py trains the same set with it as the native trainer's
# reference, and the transformer keeps this runtime's contract in the default run.
SLOW = {("resnet20-frozen4-width0.25", "executorch")}
PAIRS = [pytest.param(case.values[0], case.values[1], runtime.values[0], id=f"{case.id}-{runtime.values[0]}",
                      marks=[*case.marks, *runtime.marks,
                             *([pytest.mark.slow] if (case.id, runtime.values[0]) in SLOW else [])])
         for runtime in backend_params(RUNTIMES) for case in CASES]


@pytest.mark.parametrize("ref, config, runtime", PAIRS)
class TestContract:
    def test_a_trainer_loads_evaluates_and_trains(self, runtime, ref, config, exported, tmp_path):
        # one trainer through its life (loading programs is what costs time): load, read, evaluate, train
        trainer = make(runtime, ref, config, exported)
        m = trainer.manifest
        x, y = batch(ref, config)

        # loaded: exactly the global weights' slice, named, shaped and ordered as the manifest says
        tensors = trainer.trained_tensors()
        assert list(tensors) == [e.name for e in m.trainable]
        want = extract(global_state(ref), ref, config, index_sets(ref, config))
        for e in m.trainable:
            assert tensors[e.name].shape == e.shape and tensors[e.name].dtype == np.dtype(e.dtype), e.name
            np.testing.assert_array_equal(tensors[e.name], want[e.local].numpy(), err_msg=e.name)
        # the upload is filled straight from the trainer's buffers: one copy of the trained tensors at the
        # round's end, not a copy of each and then their concatenation (numpy reports its buffers to tracemalloc)
        tracemalloc.start()
        try:
            upload = trainer.upload_buffer()
            allocated = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert upload.nbytes == m.upload_bytes and upload.nbytes <= allocated < 1.5 * upload.nbytes
        # a round writes it to its file a tensor at a time: at most one tensor's copy, never the whole buffer
        tracemalloc.start()
        try:
            written = trainer.write_upload(tmp_path / "upload.npy")
            allocated = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        largest = max(4 * e.numel for e in m.trainable)
        assert written == upload.nbytes and allocated < largest + 64 * 1024, (allocated, largest, written)
        np.testing.assert_array_equal(np.load(tmp_path / "upload.npy"), upload)

        # the prefix's features have the prefix manifest's shapes
        outputs = trainer.artifacts.prefix.outputs
        assert [f.shape for f in trainer.prefix_features(x)] == [(len(x), *o.shape[1:]) for o in outputs]

        # evaluate: read-only, batched (here with a partial last batch), a mean over every target
        rows = len(y) // len(x)
        xe, ye = np.concatenate([x, x[:3]]), np.concatenate([y, y[: 3 * rows]])
        first, second = trainer.evaluate(xe, ye), trainer.evaluate(xe, ye)
        assert first == second and 0 <= first["accuracy"] <= 1 and first["examples"] == len(xe)
        for k, v in trainer.trained_tensors().items():
            np.testing.assert_array_equal(v, tensors[k])
        per_example = [trainer.eval_batch(xe[i:i + 1], ye[i * rows:(i + 1) * rows])[0] for i in range(len(xe))]
        assert first["loss"] == pytest.approx(float(np.mean(per_example)), rel=1e-5)

        # steps learn on a fixed batch and advance the BN counters
        losses = [trainer.train_step(x, y, 0.02 if config.optimizer == "sgd" else 2e-3) for _ in range(4)]
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]
        assert trainer.steps == 4
        after = trainer.trained_tensors()
        for e in m.trainable:
            if e.kind == "counter":
                assert int(after[e.name]) == int(tensors[e.name]) + 4
            else:
                assert not np.array_equal(after[e.name], tensors[e.name]), e.name

    def test_refreshed_weights_load(self, runtime, ref, config, exported, tmp_path):
        folder = shutil.copytree(exported(runtime, ref, config).folder, tmp_path / "set")
        gen = torch.Generator().manual_seed(3)
        new = {k: (v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v + 2)
               for k, v in global_state(ref).items()}
        refreshed = refresh_weights(folder, new, get_backend(runtime))
        trainer = trainer_class(runtime)(refreshed)
        want = extract(new, ref, config, index_sets(ref, config))
        for e in refreshed.suffix.trainable:
            np.testing.assert_array_equal(trainer.trained_tensors()[e.name], want[e.local].numpy(), err_msg=e.name)


@pytest.mark.parametrize("ref, config", CASES)
def test_runtimes_agree_after_a_step(ref, config, exported):
    built = [r for r in RUNTIMES if available(r)]
    assert {"ort", "torch"} <= set(built)
    x, y = batch(ref, config)
    results = {}
    for runtime in built:
        trainer = make(runtime, ref, config, exported)
        loss = trainer.train_step(x, y, 0.05 if config.optimizer == "sgd" else 1e-3)
        results[runtime] = (loss, trainer.trained_tensors(), trainer.evaluate(x, y)["loss"])
    base_loss, base, base_eval = results.pop("torch")
    for runtime, (loss, tensors, evaluated) in results.items():
        assert loss == pytest.approx(base_loss, rel=1e-5) and evaluated == pytest.approx(base_eval, rel=1e-4)
        tol = 1e-3 if config.optimizer == "adamw" else 1e-4
        for name, t in tensors.items():
            want = base[name].astype(np.float64)
            err = np.linalg.norm(t.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-12)
            assert err <= tol, (runtime, name, err)
