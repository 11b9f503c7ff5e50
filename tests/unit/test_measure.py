"""edgefl.cost.measure: the device model, measured activation bytes vs the profile-based prediction, peak RSS."""
import pytest

pytest.importorskip("torch")

from edgefl.cost.measure import build_device_model, measure_activation_bytes, measure_peak  # noqa: E402
from edgefl.cost.model import cost  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.trainconfig import TrainConfig  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

RESNET = ModelRef.of("resnet20")
CNN = ModelRef.of("cnn")


def slt(L: int, k: int, s: float, batch: int = 4) -> TrainConfig:
    return TrainConfig(num_layers=L, frozen_prefix=k, head_start=min(k + 1, L - 1) if s < 1 else None,
                       head_width=s, batch_size=batch)


def predicted_activations(store, ref, config, aux=None) -> int:
    widths = None if config.head_width == 1 else config.widths
    return cost(store.profile(ref, widths), config, "torch", aux).activation_bytes


@pytest.mark.parametrize("k", [0, 7, 19])
@pytest.mark.parametrize("s", [0.25, 1.0])
def test_measured_activations_match_the_profile(store, k, s):
    config = slt(20, k, s)
    measured = measure_activation_bytes(RESNET, config)
    assert measured > 0
    assert predicted_activations(store, RESNET, config) == pytest.approx(measured, rel=0.05)


def test_aux_head_activations_match_the_profile(store):
    config = TrainConfig(num_layers=20, frozen_prefix=3, trained_end=7, aux_head="conv", batch_size=4)
    aux = store.aux(RESNET, None, 7, "conv")
    measured = measure_activation_bytes(RESNET, config)
    assert predicted_activations(store, RESNET, config, aux) == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("ref,L", [(RESNET, 20), (CNN, 4)])
def test_frozen_layers_keep_no_activations(ref, L):
    measured = [measure_activation_bytes(ref, TrainConfig(num_layers=L, frozen_prefix=k, batch_size=4))
                for k in range(L)]
    assert all(later <= earlier for earlier, later in zip(measured, measured[1:]))
    assert measured[-1] < measured[0]


def test_device_model_freezes_the_prefix_and_drops_cut_layers():
    config = TrainConfig(num_layers=20, frozen_prefix=3, trained_end=7, aux_head="linear", batch_size=4)
    model, head = build_device_model(RESNET, config)
    assert len(model.layers) == 7 and head is not None
    for i, layer in enumerate(model.layers):
        assert layer.training == (i >= 3)
        assert all(p.requires_grad == (i >= 3) for p in layer.parameters())
    assert head.training and all(p.requires_grad for p in head.parameters())


def test_peak_of_a_fresh_process():
    m = measure_peak(CNN, TrainConfig(num_layers=4, frozen_prefix=2, batch_size=2), steps=1, warmup=0)
    assert m["baseline_rss_bytes"] > 0 and m["peak_rss_growth_bytes"] > 0 and m["step_seconds"] > 0
    assert m["peak_rss_growth_bytes"] < m["peak_rss_bytes"]
    assert m["peak_rss_bytes"] == m["baseline_rss_bytes"] + m["peak_rss_growth_bytes"]


def test_unmeasured_runtime_is_a_clear_error():
    with pytest.raises(EdgeflError, match="not implemented"):
        measure_peak(CNN, TrainConfig(num_layers=4), runtime="ort")


FAULTS_OF_CHURN = """
import resource, sys
import numpy as np
from edgefl.cost.measure import configure_allocator
assert configure_allocator(*map(int, sys.argv[1:]))
for _ in range(3):
    np.ones(2**20, np.float32)          # warm-up: a 4 MiB block allocated and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    np.ones(2**20, np.float32)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_allocator_thresholds_decide_whether_a_freed_block_is_mapped_again():
    import subprocess
    import sys

    def faults(*thresholds: int) -> int:
        out = subprocess.run([sys.executable, "-c", FAULTS_OF_CHURN, *map(str, thresholds)], capture_output=True,
                             text=True, check=True)
        return int(out.stdout)

    # fixed at 128 KiB each 4 MiB block is a fresh mapping, its 1,024 pages faulted in again (the kernel may
    # map a few per fault: 25,700 faults for the 50 blocks here); kept in the heap it is not
    assert faults(128 * 1024) > 50 * 200
    assert faults(32 * 2**20, 64 * 2**20) < 1024
