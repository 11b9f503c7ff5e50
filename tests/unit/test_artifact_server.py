"""The coordinator's side of chunked delivery, message by message: a window of chunks in flight, a bad
chunk sent again, a top-up that does not resend what is in flight, a resend that does, and refusals."""
import os
import time

from edgefl import topics
from edgefl.protocol import envelopes
from edgefl.protocol.memory_wire import MemoryHub
from edgefl.transport.artifact_server import ArtifactServer


def setup(window=2, chunks=5):
    hub = MemoryHub()
    server = ArtifactServer(hub.connect("coordinator"), chunk_size=1024, window=window)
    seen = []
    device = hub.connect("d1")
    device.on_message(lambda topic, payload, wire: seen.append((topics.parse(topic), payload)))
    device.subscribe(topics.device_filters("d1"))
    artifact = server.offer("d1", os.urandom(chunks * 1024))
    return server, artifact, seen


def sent(seen, count):
    deadline = time.monotonic() + 5
    while len(seen) < count:
        assert time.monotonic() < deadline, seen
        time.sleep(0.01)
    time.sleep(0.05)   # and nothing more arrives
    out = [t.seq if t.kind == "chunk" else t.kind for t, _ in seen]
    sent.payloads = [p for _, p in seen]
    seen.clear()
    return out


def test_window_acks_bad_chunks_top_ups_and_resends():
    server, artifact, seen = setup()
    server.handle("d1", envelopes.want(artifact, None, None, resend=True))
    assert sent(seen, 3) == ["manifest", 0, 1]                       # the manifest, then a window of 2
    server.handle("d1", envelopes.bad(artifact, 1))
    assert sent(seen, 1) == [1] and server.chunks_resent == 1        # a bad chunk goes again
    server.handle("d1", envelopes.got(artifact, 0))
    server.handle("d1", envelopes.got(artifact, 0))                  # a repeated acknowledgement moves nothing
    assert sent(seen, 1) == [2]
    server.handle("d1", envelopes.want(artifact, 1024, [1, 2, 3, 4], resend=False))
    assert sent(seen, 0) == []                                       # 1 and 2 are in flight: nothing resent
    server.handle("d1", envelopes.want(artifact, 1024, [1, 2, 3, 4], resend=True))
    assert sent(seen, 2) == [1, 2]                                   # presumed lost: sent again
    for seq in (1, 2, 3, 4):
        server.handle("d1", envelopes.got(artifact, seq))
    assert sent(seen, 2) == [3, 4] and server.active_transfers == 0


def test_what_was_not_offered_or_no_longer_is_refused():
    server, artifact, seen = setup()
    other = server.offer("d2", b"for d2 only")
    server.handle("d1", envelopes.want(other, None, None, resend=True))
    assert sent(seen, 1) == ["manifest"] and "not offered" in envelopes.loads(sent.payloads[0], "")["error"]
    newer = server.offer("d1", b"next round", slot="weights")
    server.offer("d1", b"the round after", slot="weights")         # replaces `newer` in its slot
    assert not server.offered("d1", newer) and server.offered("d1", artifact)
