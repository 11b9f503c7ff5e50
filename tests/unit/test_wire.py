"""What a Wire guarantees its owner whatever the broker (edgefl.protocol.wire)."""
import time

from edgefl.protocol.memory_wire import MemoryHub


def test_messages_that_arrive_before_the_handler_is_set_reach_it_in_order():
    """A persistent session's queue arrives right after connecting, already acknowledged: a device link that
    sets its handler a moment later must still get its instruction."""
    hub = MemoryHub()
    hub.connect("pi").subscribe(["fl/v1/dev/pi/down/#"])
    hub.disconnect(hub._sessions["pi"].wire, lost=False)          # the session stays, the device is away
    for i in range(3):
        hub.publish(f"fl/v1/dev/pi/down/instruction/{i}", bytes([i]), retain=False)
    wire = hub.connect("pi")
    deadline = time.monotonic() + 5
    while wire._session.pending and time.monotonic() < deadline:   # delivered with nobody listening yet
        time.sleep(0.01)
    assert not wire._session.pending
    got = []
    wire.on_message(lambda topic, payload, size: got.append((topic, payload)))
    hub.publish("fl/v1/dev/pi/down/instruction/3", b"\x03", retain=False)
    deadline = time.monotonic() + 5
    while len(got) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [(f"fl/v1/dev/pi/down/instruction/{i}", bytes([i])) for i in range(4)]
