"""A runtime that pushes the frozen prefix through in chunks (calibration `prefix_batch`, manifest
`prefix_batch`) holds one chunk's working set: the cost model prices exactly that, and the device's chunked
prefix computes what the whole batch would."""
import dataclasses

import numpy as np
import pytest
from export_cases import LM, RESNET, lm_config, resnet_config

from edgefl.cost.constants import DEFAULTS
from edgefl.cost.model import cost, step_peak_bytes
from edgefl.device_runtime.trainers.base import in_chunks


@pytest.mark.parametrize("ref, config", [(RESNET, resnet_config(7)), (LM, lm_config(2))], ids=["resnet20", "transformer"])
@pytest.mark.parametrize("P", [1, 3])
def test_the_cost_model_prices_one_chunk_of_the_prefix(store, ref, config, P):
    profile = store.profile(ref, None)
    B, a, layers = config.batch_size, config.frozen_prefix, profile.layers
    whole = step_peak_bytes(profile, config)
    assert step_peak_bytes(profile, config, prefix_batch=B) == step_peak_bytes(profile, config, prefix_batch=10 * B) == whole
    # the trained part's timeline, and per frozen layer one chunk's working set plus the others' boundary state
    quiet = dataclasses.replace(profile, layers=tuple(dataclasses.replace(l, forward_peak_bytes=0) if i < a else l
                                                      for i, l in enumerate(layers)))
    chunked = max(P * layers[i].forward_peak_bytes + (B - P) * layers[a - 1].output_bytes for i in range(a))
    assert step_peak_bytes(profile, config, prefix_batch=P) == max(step_peak_bytes(quiet, config), chunked) <= whole
    unfrozen = config.with_(frozen_prefix=0)     # nothing frozen: nothing to chunk
    assert step_peak_bytes(profile, unfrozen, prefix_batch=P) == step_peak_bytes(profile, unfrozen)
    ort = DEFAULTS["ort"]
    assert (cost(profile, config, "ort").workspace_bytes
            <= cost(profile, config, "ort", constants=dataclasses.replace(ort, prefix_batch=0)).workspace_bytes)


def test_chunks_join_to_the_whole_batch():
    x = np.arange(2 * 11 * 3, dtype=np.float32).reshape(11, 2, 3)
    seen = []

    def run(part):
        seen.append(len(part))
        return [part * 2, part.sum(axis=(1, 2))]
    doubled, sums = in_chunks(run, x, 4)
    assert seen == [4, 4, 3]
    np.testing.assert_array_equal(doubled, x * 2)
    np.testing.assert_array_equal(sums, x.sum(axis=(1, 2)))
