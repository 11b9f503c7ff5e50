"""The device's sha256-addressed artifact cache: a file is trusted only while it hashes to its name, and a
partial fetch survives a crash with exactly the chunks that are really on disk."""
import hashlib
import os

import pytest

from edgefl.device_runtime.cache import ArtifactCache
from edgefl.device_runtime.link import DeviceLink
from edgefl.errors import TransportError
from edgefl.protocol.chunks import describe
from edgefl.transport.memory import InMemoryTransport

CHUNK = 1024


def test_a_cached_file_that_no_longer_matches_its_name_is_dropped(tmp_path):
    cache = ArtifactCache(tmp_path)
    path = cache.put(b"weights")
    assert cache.get(path.name) == path
    path.write_bytes(b"weightz")
    assert cache.get(path.name) is None and not path.exists()


def test_a_partial_fetch_resumes_with_the_chunks_on_disk_and_rechecks_them_at_the_end(tmp_path):
    data = os.urandom(5 * CHUNK + 10)
    manifest = describe(data, CHUNK)
    part = ArtifactCache(tmp_path).partial(manifest.id)
    part.start(manifest)
    for seq in (0, 2, 1):
        assert part.accept(seq, data[seq * CHUNK:(seq + 1) * CHUNK]) == "ok"
    assert part.accept(2, data[2 * CHUNK:3 * CHUNK]) == "dup"
    assert part.accept(3, b"x" * CHUNK) == "bad"
    with open(f"{part.data_path}.held", "a") as f:
        f.write("4")                                    # a crash in the middle of recording chunk 4

    part = ArtifactCache(tmp_path).partial(manifest.id)  # a new process
    assert part.manifest == manifest and part.held == {0, 1, 2} and part.missing() == [3, 4, 5]
    for seq in (3, 4, 5):
        part.accept(seq, data[seq * CHUNK:(seq + 1) * CHUNK])
    with open(part.data_path, "r+b") as f:              # chunk 1 rots on disk before the end
        f.seek(CHUNK)
        f.write(bytes([data[CHUNK] ^ 0xFF]))            # a changed byte (a fixed one matches 1 time in 256)
    assert part.finish() is None and part.missing() == [1]
    part.accept(1, data[CHUNK:2 * CHUNK])
    path = part.finish()
    assert path.read_bytes() == data and path.name == hashlib.sha256(data).hexdigest()
    assert list((tmp_path / "partial").iterdir()) == []


def test_a_partial_in_chunks_the_broker_no_longer_carries_starts_over(tmp_path):
    data = os.urandom(20_000)
    before = InMemoryTransport(max_packet_size=64_000, chunk_size=8_000)
    artifact = before.ship("pi", data)
    first = DeviceLink(before.connect("pi"), "pi", tmp_path)

    def cut(held, total):
        first.abort()
    with pytest.raises(TransportError, match="closed"):
        first.fetch(artifact, timeout_s=5, progress=cut)
    assert ArtifactCache(tmp_path).partial(artifact).manifest.chunk_size == 8_000

    after = InMemoryTransport(max_packet_size=8_000, chunk_size=8_000)   # a smaller broker limit now
    after.ship("pi", data)
    link = DeviceLink(after.connect("pi"), "pi", tmp_path)
    assert link.fetch(artifact, timeout_s=5).read_bytes() == data
    assert link.stats.chunks_accepted == -(-len(data) // after.artifacts.chunk_size)
