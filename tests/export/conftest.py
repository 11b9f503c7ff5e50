import pytest

from export_cases import ExportCache


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(backend, ref, config) -> ArtifactSet, exported once per session."""
    return ExportCache(tmp_path_factory.mktemp("artifacts"))
