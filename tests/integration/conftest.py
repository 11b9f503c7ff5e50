import dataclasses

import numpy as np
import pytest
from emulation_inputs import FLEET, small_budget


@pytest.fixture(scope="session")
def fleet_text() -> str:
    return FLEET.format(small=small_budget())


@pytest.fixture(scope="module")
def data():
    """A seeded Fashion-MNIST subset: 1200 training and 500 test examples."""
    from edgefl.data import load_dataset

    def subset(ds, n, seed):
        keep = np.sort(np.random.default_rng(seed).permutation(len(ds.y))[:n])
        return dataclasses.replace(ds, x=ds.x[keep], y=ds.y[keep])
    return (subset(load_dataset("fashion-mnist", split="train"), 1200, 0),
            subset(load_dataset("fashion-mnist", split="test"), 500, 1))
