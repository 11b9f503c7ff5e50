import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # test helpers (zoo_inputs)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "export"))  # export_cases

# one profile cache for the whole session, never the user's
os.environ.setdefault("EDGEFL_CACHE", tempfile.mkdtemp(prefix="edgefl-test-cache-"))
# the native trainer's builds and SDK downloads: shared by test runs and xdist workers (builds are keyed
# by a hash of the sources and locked), never the user's device cache
os.environ.setdefault("EDGEFL_DEVICE_HOME", os.path.join(tempfile.gettempdir(), "edgefl-test-device-home"))


@pytest.fixture(scope="session")
def store():
    from edgefl.cost.profile_store import ProfileStore
    return ProfileStore()


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(backend, ref, config) -> ArtifactSet, exported once per session: the contract, parity and
    backend suites share their sets (an ExecuTorch export of a ResNet-20 suffix takes about a minute).
    Under pytest-xdist a session is a worker: modules that use it are marked `EXPORTS` (export_cases), one
    group that --dist loadgroup keeps in one worker."""
    from export_cases import ExportCache
    return ExportCache(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture(scope="session")
def native_trainer():
    """The native ExecuTorch trainer built for this machine (once per source version; device processes the
    tests start find it through EDGEFL_DEVICE_HOME)."""
    from edgefl.device_runtime import native
    return native.build()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the long sweeps, deselected by default; run them with -m slow")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU, deselected by default; run them with -m cuda")


@pytest.fixture(scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only spins, and on a busy 2-core machine it made
    the sweeps 10x slower."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)       # before xdist's own, which names each test's group in its node id
def pytest_collection_modifyitems(config, items):
    """--dist loadgroup spreads a module's tests over both workers, and a module-scoped fixture then runs
    once per worker (the README demo's fleet, a Ray cluster: 15-50 s each). The tests of a module that
    use a fixture set up once for that module share one worker, unless a group already names theirs."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::")[0]
        shared = [d for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
                  if d.scope == "module" and d.baseid == module]
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))
