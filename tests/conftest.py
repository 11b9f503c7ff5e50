import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # test helpers (zoo_inputs)

# one profile cache for the whole session, never the user's
os.environ.setdefault("EDGEFL_CACHE", tempfile.mkdtemp(prefix="edgefl-test-cache-"))


@pytest.fixture(scope="session")
def store():
    from edgefl.profile import ProfileStore
    return ProfileStore()


@pytest.fixture(scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only spins, and on a busy 2-core machine it made
    the sweeps 10x slower."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
