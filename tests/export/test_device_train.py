"""The device side as a device runs it: real subprocesses, torch blocked for ORT, `edgefl-device train`."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from export_cases import EXPORTS, LM, RESNET, lm_config, resnet_config

pytestmark = EXPORTS

CONFIG = resnet_config(4, 0.25)


def device(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edgefl.device_runtime.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env or os.environ)


@pytest.mark.parametrize("ref, config", [(RESNET, CONFIG), (LM, lm_config(2, "adamw"))], ids=["resnet20", "transformer"])
def test_ort_trains_with_torch_blocked(ref, config, exported):
    folder = exported("ort", ref, config).folder
    code = ("import sys; sys.modules['torch'] = None\n"
            "import json, numpy as np\n"
            "from edgefl.device_runtime.trainers.base import open_trainer\n"
            f"t = open_trainer({str(folder)!r})\n"
            "rng = np.random.default_rng(0)\n"
            "lm = t.artifacts.prefix.inputs[0].dtype == 'int64'\n"
            "x = rng.integers(0, 80, (8, 16)) if lm else rng.standard_normal((8, 3, 8, 8)).astype('float32')\n"
            "y = rng.integers(0, 10, 8 * (16 if lm else 1))\n"
            "losses = [t.train_step(x, y, 0.01) for _ in range(5)]\n"
            "print(json.dumps({'losses': losses, 'steps': t.steps, 'loaded': sorted(m for m in ('torch', 'onnx') "
            "if sys.modules.get(m) is not None)}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["steps"] == 5 and out["loaded"] == []
    assert all(np.isfinite(out["losses"])) and out["losses"][-1] < out["losses"][0]   # same batch: it learns


def test_train_command_reports_what_it_measured(exported, tmp_path):
    a = exported("ort", RESNET, CONFIG)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((20, 3, 8, 8)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 10, 20))
    r = device("train", "--artifacts", a.folder, "--data", tmp_path, "--steps", 6, "--lr", 0.05, "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["runtime"] == "ort" and report["config_hash"] == CONFIG.hash() and report["steps"] == 6
    assert report["trained_tensor_bytes"] == a.suffix.upload_bytes
    assert report["peak_rss_bytes"] >= report["loaded_rss_bytes"] > 0
    phases = report["phase_peak_rss_bytes"]             # each phase's own peak: the process's is the largest
    assert list(phases) == ["load", "train", "upload"] and max(phases.values()) == report["peak_rss_bytes"]
    assert min(phases.values()) >= report["loaded_rss_bytes"] // 2
    assert report["mmap_threshold"] == 128 * 1024 and report["torch_loaded"] is False
    assert report["loss_after"] < report["loss_before"]        # 6 steps over 20 examples, evaluated on them
    assert report["predicted_peak_bytes"] == a.suffix.predicted["peak_memory_bytes"]
    table = device("train", "--artifacts", a.folder, "--data", tmp_path, "--steps", 1)
    assert table.returncode == 0 and "peak RSS" in table.stdout and "trained tensors" in table.stdout
    assert "peak by phase    load " in table.stdout and ", upload " in table.stdout


def test_ort_sessions_run_without_buffer_reuse_and_arena():
    # ORT lends a forward temporary's buffer to a backward tensor of its size and holds it through the gap:
    # the turn from forward to backward then holds every lent buffer (ViT: 273 -> 198 MiB above the loaded
    # process without; bench/ort_mem_reuse.py); its arena keeps what it grew
    from edgefl.device_runtime.trainers.ort_trainer import session_options
    options = session_options(1)
    assert not options.enable_mem_reuse and not options.enable_cpu_mem_arena


def test_the_device_policy_is_the_cost_models():
    from edgefl.cost.measure import MMAP_THRESHOLD as measured_under
    from edgefl.device_runtime.train_cmd import MMAP_THRESHOLD
    assert MMAP_THRESHOLD == measured_under


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_tampered_artifacts_exit_2_with_one_line(exported, tmp_path):
    folder = shutil.copytree(exported("ort", RESNET, CONFIG).folder, tmp_path / "set")
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((8, 3, 8, 8), np.float32), y=np.zeros(8, np.int64))
    path = folder / "training_model.onnx"
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    one_line_error(device("train", "--artifacts", folder, "--data", data), str(path), "sha256")
    (folder / "prefix" / "prefix.onnx").unlink()
    shutil.copy(exported("ort", RESNET, CONFIG).folder / "training_model.onnx", path)
    one_line_error(device("train", "--artifacts", folder, "--data", data), "prefix.onnx", "missing")
    shutil.copy(exported("ort", RESNET, CONFIG).folder / "prefix" / "prefix.onnx", folder / "prefix" / "prefix.onnx")
    (folder / "prefix" / "prefix.weights").unlink()       # the prefix's weights travel beside its graph
    one_line_error(device("train", "--artifacts", folder, "--data", data), "prefix.weights", "missing")


def test_bad_data_and_runtime_exit_2(exported, tmp_path):
    folder = exported("ort", RESNET, CONFIG).folder
    np.savez(tmp_path / "wrong.npz", x=np.zeros((4, 1, 28, 28), np.float32), y=np.zeros(4, np.int64))
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path / "wrong.npz"), "(1, 28, 28)", "(3, 8, 8)")
    np.savez(tmp_path / "nox.npz", y=np.zeros(4, np.int64))
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path / "nox.npz"), "no array 'x'")
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path / "absent"), "absent not found")
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path / "wrong.npz", "--runtime", "torch"),
                   "exported for ort")


@pytest.mark.parametrize("runtime", ["ort", "torch"])
def test_peak_memory_does_not_grow_with_the_local_data(runtime, exported, tmp_path):
    """Local data is read a batch at a time: 15,000 examples (11 MiB of inputs) cost what 300 do."""
    a = exported(runtime, RESNET, CONFIG)
    rng = np.random.default_rng(0)
    peaks = {}
    for n in (300, 15_000):
        folder = tmp_path / str(n)
        folder.mkdir()
        np.save(folder / "x.npy", rng.standard_normal((n, 3, 8, 8)).astype(np.float32))
        np.save(folder / "y.npy", rng.integers(0, 10, n))
        r = device("train", "--artifacts", a.folder, "--data", folder, "--steps", 20, "--format", "json")
        assert r.returncode == 0, r.stderr
        peaks[n] = json.loads(r.stdout)["peak_rss_bytes"]
    assert abs(peaks[15_000] - peaks[300]) <= 2 * 2**20, peaks


@pytest.mark.parametrize("case", ["label-57", "uint8-images", "nan"])
def test_data_the_model_cannot_take_exits_2_naming_the_file(case, exported, tmp_path):
    """Labels outside the classes trained to a loss of -3e30 and exit 0; uint8 images trained on 0..255."""
    folder = exported("ort", RESNET, CONFIG).folder
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 20)
    if case == "label-57":
        y[:] = 57
        file, expect = "y.npy", ["target 57 of example 0", "10 classes", "0..9"]
    elif case == "uint8-images":
        x = rng.integers(0, 256, x.shape).astype(np.uint8)
        file, expect = "x.npy", ["uint8", "float32", "/ 255", "edgefl data export"]
    else:
        x[11, 0, 4, 4] = np.nan
        file, expect = "x.npy", ["example 11", "NaN or infinity"]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path, "--steps", 2), str(tmp_path / file),
                   *expect)


def test_the_native_trainer_gets_only_data_its_model_takes(exported, native_trainer, tmp_path):
    """The native trainer converts uint8 to float32 as it reads: the Python side refuses such data first."""
    from export_cases import CNN, cnn_config
    artifacts = exported("executorch", CNN, cnn_config(1))
    shape = (20, *artifacts.prefix.inputs[0].shape[1:])
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(20, np.int64))
    one_line_error(device("train", "--artifacts", artifacts.folder, "--data", tmp_path, "--steps", 2),
                   str(tmp_path / "x.npy"), "uint8", "/ 255")


def _truncated(folder, name: str, into):
    """A copy of the set with file `name` cut in half and its manifest entry rewritten to match: what verification
    cannot catch (a set re-hashed after a partial copy, an export that died writing)."""
    import hashlib

    into = shutil.copytree(folder, into)
    path = into / name
    half = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(half)
    manifest = json.loads((into / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["name"] == name:
            entry.update(bytes=len(half), sha256=hashlib.sha256(half).hexdigest())
    (into / "manifest.json").write_text(json.dumps(manifest))
    return into


@pytest.mark.parametrize("runtime, trainer, name", [
    ("executorch", "python", "suffix.pte"), ("executorch", "python", "state.npz"),
    ("executorch", "native", "suffix.pte"), ("torch", "auto", "weights.npz"), ("ort", "auto", "eval_model.onnx")])
def test_a_damaged_file_that_matches_its_manifest_is_one_line_naming_it(runtime, trainer, name, exported,
                                                                        native_trainer, tmp_path):
    """Before (issue 40): the Python ExecuTorch trainer and the torch set's np.load died with tracebacks (exit 1)."""
    from export_cases import CNN, cnn_config
    artifacts = exported(runtime, CNN, cnn_config(1))
    folder = _truncated(artifacts.folder, name, tmp_path / "set")
    np.save(tmp_path / "x.npy", np.zeros((16, *artifacts.prefix.inputs[0].shape[1:]), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(16, np.int64))
    one_line_error(device("train", "--artifacts", folder, "--data", tmp_path, "--steps", 2, "--trainer", trainer),
                   str(folder / name) if trainer != "native" else str(folder / "suffix.pte"))


def test_no_examples_is_one_line_saying_so(exported, tmp_path):
    """Before: 'x has 0 examples and y 0 targets; y needs a whole number of targets per example'."""
    np.save(tmp_path / "x.npy", np.zeros((0, 3, 8, 8), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(0, np.int64))
    r = device("train", "--artifacts", exported("ort", RESNET, CONFIG).folder, "--data", tmp_path)
    one_line_error(r, f"--data {tmp_path / 'x.npy'}: no examples (x has 0 rows)", "edgefl data export")
