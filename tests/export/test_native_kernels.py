"""edgefl's kernels in the native trainer (device_runtime/native/src/fast_kernels.cpp) train as the kernels the
executorch wheel ships: on the parity suite's sets 10 steps with `--kernels edgefl` and `--kernels shipped` give
losses and trained tensors within the parity suite's tolerance (a trained conv before a max pool, train-mode BN at
head width 0.25, the transformer). Not bit for bit: edgefl's convolutions and matrix products are a GEMM built for
AVX2 + FMA (gemm.h), the shipped ones direct loops and a GEMM built for SSE2; before them, with copies and
reductions only, the convolutional sets were bit-identical and the transformer 2e-7 apart in a loss. The edgefl
run's report shows its kernels served the program's calls (a key that never matched would leave the shipped
kernels doing all the work). Both keep edgefl's max pool backward, whose shipped kernel returns wrong gradients."""
import numpy as np
import pytest
from export_cases import CNN, EXPORTS, LM, RESNET, available, cnn_config
from test_native_trainer import CASES, SEED, STEPS, local_data, native, rate, rel

pytestmark = [EXPORTS, pytest.mark.skipif(not available("executorch"), reason="executorch is not installed"),
              pytest.mark.usefixtures("one_thread")]


def train(binary, artifacts, data, config, kernels: str, out):
    return native(binary, "--artifacts", artifacts.folder, "--data", data, "--steps", STEPS, "--lr", rate(config),
                  "--seed", SEED, "--losses", "--out", out, "--kernels", kernels)


@pytest.mark.parametrize("ref, config, tolerance", CASES)
def test_edgefl_kernels_train_as_the_shipped_ones(ref, config, tolerance, exported, native_trainer,
                                                                tmp_path):
    artifacts = exported("executorch", ref, config)
    data, _, _ = local_data(artifacts, tmp_path / "data", 3 * artifacts.suffix.batch_size + 5)
    ours = train(native_trainer, artifacts, data, config, "edgefl", tmp_path / "edgefl.npy")
    shipped = train(native_trainer, artifacts, data, config, "shipped", tmp_path / "shipped.npy")
    assert ours["kernels"] == "edgefl" and shipped["kernels"] == "shipped"
    assert len(ours["losses"]) == STEPS
    np.testing.assert_allclose(ours["losses"], shipped["losses"], rtol=1e-5)
    trained, reference = np.load(tmp_path / "edgefl.npy"), np.load(tmp_path / "shipped.npy")
    assert rel(trained, reference) <= tolerance
    # --kernels shipped keeps edgefl's fix of the max pool's backward (its shipped kernel adds into a buffer it never
    # zeroes: the CNN's one pool runs it) and edgefl's own batch norm operators (the ResNet's, no shipped kernel
    # exists), nothing else
    calls, kept = ours["edgefl_kernel_calls"], shipped["edgefl_kernel_calls"]
    fixed = kept.pop("max_pool2d_backward")
    norms = kept.pop("batch_norm"), kept.pop("batch_norm_backward")
    assert not any(kept.values()) and fixed == (STEPS if ref is CNN else 0), fixed
    assert norms == (calls["batch_norm"], calls["batch_norm_backward"]) and (norms[0] >= STEPS) == (ref is RESNET)
    assert norms[0] == norms[1] and norms[0] % STEPS == 0, norms      # each BN once a step, each way
    # every set's graph multiplies matrices (linear layers as bmm/mm) and transposes (autograd's products); the
    # convolutional sets train convolutions (and their backward), the transformer has none
    assert calls["bmm"] + calls["mm"] >= STEPS and calls["permute_copy"] > 0, calls
    assert ref is LM or calls["convolution"] >= STEPS and calls["convolution_backward"] >= STEPS, calls
    assert ref is not CNN or calls["max_pool2d"] == calls["max_pool2d_backward"] == STEPS, calls
    assert sum(calls.values()) >= 4 * STEPS, calls


def test_an_unknown_kernel_set_is_one_line(exported, native_trainer, tmp_path):
    artifacts = exported("executorch", CNN, cnn_config(1))
    data, _, _ = local_data(artifacts, tmp_path / "data", 20)
    proc = native(native_trainer, "--artifacts", artifacts.folder, "--data", data, "--kernels", "fast", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kernels" in lines[0] and "edgefl or shipped" in lines[0], proc.stderr
