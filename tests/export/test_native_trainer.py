"""The native ExecuTorch trainer (edgefl-et-train) trains a set exactly as edgefl's Python trainers do:

* parity over 10 steps on the same batches (the `--steps` schedule of `ArtifactTrainer.fit`): native vs the
  Python ExecuTorch trainer vs torch's eager suffix, on CNN frozen 1 (a trained conv before a max pool),
  ResNet-20 frozen 4 width 0.25 (train-mode BN) and the transformer frozen 2 with AdamW (an LM: N*T
  targets): trained tensors rel. err <= 1e-5 (AdamW <= 1e-4), the same loss sequence to 1e-5;
* the agent's schedule (`--epochs`, numpy's permutation bit for bit) reaches the worker's tensors;
* local data is read a batch at a time: 15,000 examples cost no more memory than 300;
* bad input (an operator the shipped kernels lack, a truncated program, data of the wrong shape, labels
  out of range) is one line naming the file, exit 2, and no upload file.
"""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from export_cases import CNN, EXPORTS, LM, RESNET, available, cnn_config, global_state, lm_config, resnet_config

from edgefl.device_runtime.trainers.base import trainer_class
from edgefl.export.split import split
from edgefl.manifest import Manifest, flatten
from edgefl.server.submodel import index_sets

pytestmark = [EXPORTS, pytest.mark.skipif(not available("executorch"), reason="executorch is not installed"),
              pytest.mark.usefixtures("one_thread")]
LR, STEPS, SEED = 0.05, 10, 5
# AdamW at SGD's 0.05 throws the LM's loss from 4.6 to 7.5 in five steps, where float32 rounding decides the
# digits compared: its usual rate
ADAMW_LR = 1e-3
# the contract suite's sets (an ExecuTorch export of a ResNet-20 suffix takes a minute or two): SGD with
# train-mode BN on ResNet-20, AdamW on the LM
CASES = [pytest.param(CNN, cnn_config(1), 1e-5, id="cnn-frozen1"),
         pytest.param(RESNET, resnet_config(4, 0.25), 1e-5, id="resnet20-frozen4-width0.25"),
         pytest.param(LM, lm_config(2, "adamw"), 1e-4, id="transformer-frozen2-adamw")]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def local_data(artifacts, folder, examples: int, seed: int = 0):
    """x.npy and y.npy for the set's model: inputs of its shape and dtype, targets in its classes."""
    spec = (artifacts.prefix or artifacts.suffix).inputs[0]
    labels = artifacts.suffix.inputs[-1]
    classes = artifacts.suffix.outputs[1].shape[-1]
    rng = np.random.default_rng(seed)
    shape = (examples, *spec.shape[1:])
    x = rng.integers(0, classes, shape) if spec.dtype == "int64" else rng.standard_normal(shape).astype(np.float32)
    per_example = labels.shape[0] // artifacts.suffix.batch_size
    y = rng.integers(0, classes, (examples, per_example) if per_example > 1 else examples)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return folder, x, y


def native(binary, *args, check=True):
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return proc


def fit_batches(examples: int, batch: int, steps: int, seed: int):
    """ArtifactTrainer.fit's batches: sorted slices of successive permutations."""
    rng, batches = np.random.default_rng(seed), []
    order, start = rng.permutation(examples), 0
    while len(batches) < steps:
        if start + batch > examples:
            order, start = rng.permutation(examples), 0
        batches.append(np.sort(order[start:start + batch]))
        start += batch
    return batches


def rate(config) -> float:
    return LR if config.optimizer == "sgd" else ADAMW_LR


def torch_run(ref, config, artifacts, x, y):
    """The eager device model, split as the exporter splits it, trained on fit's batches."""
    torch.manual_seed(0)
    parts = split(ref, config, global_state(ref), index_sets(ref, config))
    opt = (torch.optim.SGD(parts.suffix.parameters(), lr=rate(config), momentum=0.9, weight_decay=1e-5)
           if config.optimizer == "sgd" else torch.optim.AdamW(parts.suffix.parameters(), lr=rate(config)))
    parts.suffix.train()
    losses = []
    for idx in fit_batches(len(x), artifacts.suffix.batch_size, STEPS, SEED):
        features = parts.features(torch.from_numpy(x[idx]))
        loss, _ = parts.suffix(*features, torch.from_numpy(np.asarray(y[idx]).reshape(-1)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    state = parts.suffix.state_dict()
    tensors = {e.name: state[e.local].numpy() for e in artifacts.suffix.trainable}
    return losses, flatten(artifacts.suffix.trainable, tensors)


@pytest.mark.parametrize("ref, config, tolerance", CASES)
def test_native_matches_the_python_trainer_and_torch(ref, config, tolerance, exported, native_trainer, tmp_path):
    artifacts = exported("executorch", ref, config)
    data, x, y = local_data(artifacts, tmp_path / "data", 3 * artifacts.suffix.batch_size + 5)
    report = native(native_trainer, "--artifacts", artifacts.folder, "--data", data, "--steps", STEPS,
                    "--lr", rate(config), "--seed", SEED, "--losses", "--out", tmp_path / "upload.npy")
    assert report["trainer"] == "native" and report["torch_loaded"] is False and report["steps"] == STEPS
    upload = np.load(tmp_path / "upload.npy")

    python = trainer_class("executorch")(artifacts)
    initial = python.upload_buffer().copy()
    python_losses = python.fit(x, y, rate(config), STEPS, SEED)
    torch_losses, torch_upload = torch_run(ref, config, artifacts, x, y)

    assert upload.shape == python.upload_buffer().shape == torch_upload.shape
    np.testing.assert_allclose(report["losses"], python_losses, rtol=1e-5)
    np.testing.assert_allclose(report["losses"], torch_losses, rtol=1e-5)
    assert rel(upload, python.upload_buffer()) <= tolerance
    assert rel(upload, torch_upload) <= tolerance
    assert rel(upload, initial) > 100 * tolerance                  # it trained


@pytest.mark.parametrize("max_examples", [None, 24])
def test_the_agents_schedule_matches_the_worker(max_examples, exported, native_trainer, tmp_path):
    """--epochs is the device worker's schedule: numpy's default_rng(seed).permutation per epoch, cut to the
    plan's examples (--max-examples), unsorted batches, the remainder skipped; the native run and the
    Python worker reach the same upload."""
    from edgefl.device_runtime.native import trainer_argv

    artifacts = exported("executorch", CNN, cnn_config(1))
    data, _, _ = local_data(artifacts, tmp_path / "data", 45)
    argv = trainer_argv(native_trainer, artifacts.folder, data, tmp_path / "native.npy", lr=0.05, seed=7, epochs=2,
                        threads=1, max_examples=max_examples)
    report = native(*argv)
    spec = {"artifacts": str(artifacts.folder), "data": str(data), "lr": 0.05, "seed": 7, "epochs": 2, "threads": 1,
            "runtime": "executorch", "out": str(tmp_path / "python.npy"), "max_examples": max_examples}
    proc = subprocess.run([sys.executable, "-m", "edgefl.device_runtime.worker", json.dumps(spec)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    worker = json.loads(proc.stdout.strip().splitlines()[-1])
    used = max_examples or 45
    assert report["examples"] == worker["examples"] == used
    assert report["steps"] == worker["steps"] == 2 * (used // artifacts.suffix.batch_size)
    assert report["loss_last"] == pytest.approx(worker["loss_last"], rel=1e-6)
    assert rel(np.load(tmp_path / "native.npy"), np.load(tmp_path / "python.npy")) <= 1e-6


def test_peak_memory_does_not_grow_with_the_data(exported, native_trainer, tmp_path):
    artifacts = exported("executorch", CNN, cnn_config(1))
    peaks = {}
    for n in (300, 15_000):
        data, _, _ = local_data(artifacts, tmp_path / f"data{n}", n)
        peaks[n] = native(native_trainer, "--artifacts", artifacts.folder, "--data", data, "--steps", 20,
                          "--eval-examples", 64)["peak_rss_bytes"]
    assert (15_000 * 8 * 8 * 4) > 2 * 2**20                      # the larger share alone would show
    assert abs(peaks[15_000] - peaks[300]) <= 2 * 2**20, peaks


def _broken_copy(artifacts, tmp_path, name: str, data: bytes, fix_manifest: bool):
    """A copy of the set with the file of `name` replaced by `data` (and the manifest updated to match when
    `fix_manifest`: the runtime, not the sha256 check, must then catch it)."""
    folder = tmp_path / "set"
    shutil.copytree(artifacts.folder, folder)
    (folder / name).write_bytes(data)
    if fix_manifest:
        m = Manifest.read(folder, verify=False)
        m.with_files(folder, {f.name: f.role for f in m.files}).write(folder)
    return folder


def _error(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgefl-et-train: error: "), proc.stderr
    return lines[0]


def _missing_operator_program() -> bytes:
    """A program calling aten::lgamma, which the shipped kernels do not register."""
    from executorch.exir import EdgeCompileConfig, to_edge

    class Gamma(torch.nn.Module):
        def forward(self, x):
            return torch.lgamma(x)
    program = torch.export.export(Gamma(), (torch.ones(2),))
    return to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch().buffer


@pytest.mark.parametrize("case", ["missing-operator", "truncated", "truncated-unverified", "wrong-shape",
                                  "label-out-of-range"])
def test_bad_input_is_one_line_and_writes_nothing(case, exported, native_trainer, tmp_path):
    artifacts = exported("executorch", CNN, cnn_config(1))
    data, x, y = local_data(artifacts, tmp_path / "data", 20)
    folder, expect = artifacts.folder, []
    program = (artifacts.folder / "suffix.pte").read_bytes()
    if case == "missing-operator":
        folder = _broken_copy(artifacts, tmp_path, "suffix.pte", _missing_operator_program(), fix_manifest=True)
        expect = ["suffix.pte", "aten::lgamma"]
    elif case == "truncated":
        folder = _broken_copy(artifacts, tmp_path, "suffix.pte", program[: len(program) // 2], fix_manifest=False)
        expect = ["suffix.pte", "truncated"]
    elif case == "truncated-unverified":
        folder = _broken_copy(artifacts, tmp_path, "suffix.pte", program[: len(program) // 2], fix_manifest=True)
        expect = ["suffix.pte", "cannot load the program"]
    elif case == "wrong-shape":
        np.save(data / "x.npy", np.zeros((20, 1, 9, 9), np.float32))
        expect = ["x.npy", "(1, 9, 9)", "(1, 8, 8)"]
    else:
        np.save(data / "y.npy", np.full(20, 57))
        expect = ["y.npy", "57", "10 classes"]
    out = tmp_path / "upload.npy"
    line = _error(native(native_trainer, "--artifacts", folder, "--data", data, "--out", out, check=False))
    for word in expect:
        assert word in line, line
    assert not out.exists() and not (tmp_path / "upload.npy.partial").exists()


def test_edgefl_device_trains_natively_with_torch_and_executorch_blocked(exported, native_trainer, tmp_path):
    """What a Raspberry Pi runs: edgefl-device with neither torch nor the executorch Python package."""
    artifacts = exported("executorch", CNN, cnn_config(1))
    data, _, _ = local_data(artifacts, tmp_path / "data", 40)
    code = ("import sys; sys.modules['torch'] = None; sys.modules['executorch'] = None\n"
            "from edgefl.device_runtime.cli import main\n"
            f"sys.exit(main(['train', '--artifacts', {str(artifacts.folder)!r}, '--data', {str(data)!r}, "
            "'--steps', '5', '--format', 'json']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["trainer"] == "native" and report["torch_loaded"] is False and report["steps"] == 5
    assert report["loss_before"] is not None and report["peak_rss_bytes"] < 64 * 2**20
    phases = report["phase_peak_rss_bytes"]             # as the Python trainers report them
    assert sorted(phases) == ["load", "train", "upload"] and max(phases.values()) == report["peak_rss_bytes"]


def test_an_unbuilt_native_trainer_says_how_to_build_it(exported, tmp_path, monkeypatch, capsys):
    from edgefl.device_runtime.cli import main
    artifacts = exported("executorch", CNN, cnn_config(1))
    data, _, _ = local_data(artifacts, tmp_path / "data", 20)
    monkeypatch.setenv("EDGEFL_DEVICE_HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("EDGEFL_ET_TRAIN", raising=False)
    assert main(["train", "--artifacts", str(artifacts.folder), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "edgefl-device build-native" in err[0] and "--trainer python" in err[0], err
