import os
import tempfile

import pytest

# one profile cache for the whole session, never the user's
os.environ.setdefault("EDGEFL_CACHE", tempfile.mkdtemp(prefix="edgefl-test-cache-"))


@pytest.fixture(scope="session")
def store():
    from edgefl.profile import ProfileStore
    return ProfileStore()
