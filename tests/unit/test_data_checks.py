"""Local data is checked before anything trains on it (edgefl.device_runtime.local_data): what holds for any
model (numbers, no NaN or infinity, integer labels from 0, -100 ignored), and what the artifact set's
manifests say the model takes (per-example shape, dtype, targets per example, labels below its classes).
Each refusal is one line naming the file and the fix; the checks read a bounded chunk at a time."""
import tracemalloc

import numpy as np
import pytest

from edgefl.device_runtime.local_data import ModelInput, check_layout, check_values, open_local_data
from edgefl.errors import ConfigError
from edgefl.manifest import ArtifactSet, IOSpec, Manifest

IMAGE = (3, 8, 8)


def artifact_set(tmp_path, *, input_shape=("batch", *IMAGE), dtype="float32", classes=10, labels=("rows",),
                 batch=8) -> ArtifactSet:
    """The manifests of a set as the exporters write them: the first input is the model's, the suffix's last
    input its labels, its second output the logits (rows x classes)."""
    def manifest(kind, inputs, outputs):
        return Manifest(kind=kind, backend="ort", versions={}, model={"name": "m"}, config={}, config_hash="c",
                        files=(), inputs=inputs, outputs=outputs, batch_size=batch)
    prefix = manifest("prefix", (IOSpec("input", input_shape, dtype),), (IOSpec("features0", ("batch", 16), "float32"),))
    suffix = manifest("suffix", (IOSpec("features0", ("batch", 16), "float32"), IOSpec("labels", labels, "int64")),
                      (IOSpec("loss", (), "float32"), IOSpec("logits", ("rows", classes), "float32")))
    return ArtifactSet(tmp_path, suffix, tmp_path / "prefix", prefix)


def write(folder, x, y):
    folder.mkdir(exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return open_local_data(folder)


def images(n=6):
    return np.random.default_rng(0).standard_normal((n, *IMAGE)).astype(np.float32)


def refused(call, *needles):
    with pytest.raises(ConfigError) as info:
        call()
    line = str(info.value)
    assert "\n" not in line
    for needle in needles:
        assert needle in line, line
    return line


def test_data_that_fits_passes_and_minus_100_marks_an_ignored_target(tmp_path):
    model = ModelInput.of(artifact_set(tmp_path))
    assert (model.row_shape, model.dtype, model.targets, model.classes) == (IMAGE, np.float32, 1, 10)
    x, y = write(tmp_path / "ok", images(), np.array([0, 9, -100, 3, 4, 5]))
    check_layout(x, y, model)
    check_values(x, y, model.classes)

    lm = ModelInput.of(artifact_set(tmp_path, input_shape=("batch", 16), dtype="int64", classes=80))
    assert (lm.row_shape, lm.targets, lm.classes) == ((16,), 16, 80)   # a token model predicts every position
    tokens = np.random.default_rng(0).integers(0, 80, (5, 16))
    targets = np.where(np.arange(80).reshape(5, 16) % 7 == 0, -100, tokens)
    x, y = write(tmp_path / "lm", tokens, targets.reshape(-1))          # flat targets: 16 per example
    check_layout(x, y, lm)
    check_values(x, y, lm.classes)


def test_a_fixed_labels_input_gives_the_targets_per_example(tmp_path):
    """ExecuTorch programs have a fixed batch: their labels input says how many targets a batch has."""
    model = ModelInput.of(artifact_set(tmp_path, input_shape=(1, 16), dtype="int64", classes=80, labels=(128,)))
    assert model.targets == 16
    x, y = write(tmp_path / "d", np.zeros((4, 16), np.int64), np.zeros(4, np.int64))
    refused(lambda: check_layout(x, y, model), str(tmp_path / "d" / "y.npy"), "1 targets per example",
            "trains on 16", "(4, 16)")


@pytest.mark.parametrize("case", ["nan", "inf", "float-labels", "negative-label", "complex-x"])
def test_what_no_model_takes_is_refused_naming_the_file(case, tmp_path):
    x, y = images(), np.arange(6) % 10
    expect = []
    if case == "nan":
        x[3, 1, 2, 2] = np.nan
        expect = ["x.npy", "example 3", "NaN or infinity"]
    elif case == "inf":
        x[5, 0, 0, 0] = -np.inf
        expect = ["x.npy", "example 5", "NaN or infinity"]
    elif case == "float-labels":
        y = y.astype(np.float64)
        expect = ["y.npy", "float64", "save y as int64"]
    elif case == "negative-label":
        y[4] = -3
        expect = ["y.npy", "-3", "example 4", "-100 to ignore"]
    else:
        x = x.astype(np.complex64)
        expect = ["x.npy", "complex64", "float32"]
    rows = write(tmp_path / case, x, y)
    line = refused(lambda: check_values(*rows), *expect)
    assert str(tmp_path / case) in line


@pytest.mark.parametrize("case", ["label-57", "uint8-images", "float-tokens", "shape", "two-labels-per-image",
                                  "one-label-per-window"])
def test_data_the_model_does_not_take_is_refused_naming_the_file(case, tmp_path):
    image_model = ModelInput.of(artifact_set(tmp_path))
    token_model = ModelInput.of(artifact_set(tmp_path, input_shape=("batch", 16), dtype="int64", classes=80))
    x, y, model = images(), np.arange(6) % 10, image_model
    if case == "label-57":
        y[2] = 57
        expect = ["y.npy", "target 57 of example 2", "10 classes", "0..9"]
    elif case == "uint8-images":
        x = np.random.default_rng(0).integers(0, 256, (6, *IMAGE)).astype(np.uint8)
        expect = ["x.npy", "uint8", "float32", "/ 255", "edgefl data export"]
    elif case == "float-tokens":
        x, model = np.zeros((6, 16), np.float32), token_model
        y = np.zeros((6, 16), np.int64)
        expect = ["x.npy", "float32", "token ids", "int64"]
    elif case == "shape":
        x = np.zeros((6, 1, 28, 28), np.float32)
        expect = ["x.npy", "(1, 28, 28)", "(3, 8, 8)"]
    elif case == "two-labels-per-image":
        y = np.arange(12) % 10
        expect = ["y.npy", "2 targets per example", "trains on 1", "(6,)"]
    else:
        x, y, model = np.zeros((6, 16), np.int64), np.zeros(6, np.int64), token_model
        expect = ["y.npy", "1 targets per example", "trains on 16", "(6, 16)"]
    rows = write(tmp_path / case, x, y)

    def both():
        check_layout(*rows, model)
        check_values(*rows, model.classes)
    line = refused(both, *expect)
    assert str(tmp_path / case) in line


def test_x_and_y_with_different_example_counts_are_refused(tmp_path):
    refused(lambda: write(tmp_path / "d", images(6), np.zeros((3, 4), np.int64)), "y.npy", "3 rows",
            "x has 6 examples", "one row of targets per example")


def test_the_checks_hold_a_bounded_chunk_not_the_share(tmp_path):
    """16 MiB of images with a NaN in the last one: found, with well under 2 MiB held at any time."""
    x = np.zeros((5462, 3, 16, 16), np.float32)
    x[-1, 2, 15, 15] = np.nan
    rows = write(tmp_path / "big", x, np.zeros(len(x), np.int64))
    del x
    tracemalloc.start()
    try:
        refused(lambda: check_values(*rows), "example 5461", "NaN")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak
