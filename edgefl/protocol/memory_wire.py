"""An in-process stand-in for an MQTT broker, with the behaviour the protocol relies on: QoS 1 delivery
in publish order, persistent sessions that queue messages while their client is away and redeliver a
message whose handling a lost connection interrupted, retained messages, last wills, session takeover
and a packet size limit. Each connection delivers on its own thread, as paho's network loop does."""
from __future__ import annotations

import threading
from collections import deque
from typing import Iterable, Optional

from edgefl.errors import TransportError
from edgefl.protocol.wire import MQTT_MAX_PACKET, Wire, publish_packet_bytes
from edgefl.topics import matches


class _Session:
    def __init__(self, persistent: bool):
        self.persistent = persistent
        self.filters: set[str] = set()
        self.pending: deque[tuple[str, bytes]] = deque()
        self.wire: Optional[MemoryWire] = None


class MemoryHub:
    def __init__(self, max_packet_size: int = MQTT_MAX_PACKET):
        self.max_packet_size = max_packet_size
        self._cond = threading.Condition()
        self._sessions: dict[str, _Session] = {}
        self._retained: dict[str, bytes] = {}

    def connect(self, client_id: str, will: Optional[tuple[str, bytes]] = None, persistent: bool = True) -> "MemoryWire":
        """A connection; `will` (topic, payload) is published retained if it is lost without a close."""
        with self._cond:
            session = self._sessions.get(client_id)
            if session is not None and session.wire is not None:
                session.wire._open = False       # session takeover: the older connection is dropped
            if session is None or not persistent:
                session = self._sessions[client_id] = _Session(persistent)
            wire = MemoryWire(self, session, client_id, will)
            session.wire = wire
            if session.pending:
                wire._start()
            self._cond.notify_all()
        return wire

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        with self._cond:
            if retain:
                if payload:
                    self._retained[topic] = payload
                else:
                    self._retained.pop(topic, None)
            for session in self._sessions.values():
                if any(matches(f, topic) for f in session.filters):
                    session.pending.append((topic, payload))
                    if session.wire is not None:
                        session.wire._start()
            self._cond.notify_all()

    def subscribe(self, session: _Session, filters: Iterable[str]) -> None:
        """As MQTT does: the retained messages a filter matches come on every subscribe, a repeated one too."""
        with self._cond:
            filters = list(filters)
            session.filters.update(filters)
            for topic, payload in self._retained.items():
                if any(matches(f, topic) for f in filters):
                    session.pending.append((topic, payload))
            if session.pending and session.wire is not None:
                session.wire._start()
            self._cond.notify_all()

    def unsubscribe(self, session: _Session, filters: Iterable[str]) -> None:
        with self._cond:
            session.filters.difference_update(filters)

    def disconnect(self, wire: "MemoryWire", lost: bool) -> None:
        with self._cond:
            session = wire._session
            if session.wire is wire:
                session.wire = None
                if not session.persistent:
                    self._sessions = {k: s for k, s in self._sessions.items() if s is not session}
            wire._open = False
            self._cond.notify_all()
        if lost and wire.will is not None:
            self.publish(*wire.will, retain=True)


class MemoryWire(Wire):
    def __init__(self, hub: MemoryHub, session: _Session, client_id: str, will: Optional[tuple[str, bytes]]):
        super().__init__(client_id, hub.max_packet_size)
        self.hub, self._session, self.will = hub, session, will
        self._open = True
        self._thread: Optional[threading.Thread] = None

    def _start(self) -> None:  # called with the hub's lock held
        if self._thread is None and self._open:
            self._thread = threading.Thread(target=self._run, name=f"memory-wire-{self.client_id}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        cond = self.hub._cond
        while True:
            with cond:
                while self._open and not self._session.pending:
                    cond.wait()
                if not self._open:
                    return
                item = self._session.pending[0]
            self._deliver(item[0], item[1], publish_packet_bytes(item[0], len(item[1])))
            with cond:  # acknowledged only once handled: a connection lost meanwhile gets it again
                if self._open and self._session.pending and self._session.pending[0] is item:
                    self._session.pending.popleft()

    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        if not self._open:
            raise TransportError(f"{self.client_id}: the connection is closed; open a new one")
        self.hub.publish(topic, bytes(payload), retain)

    def subscribe(self, filters: Iterable[str]) -> None:
        self.hub.subscribe(self._session, filters)

    def unsubscribe(self, filters: Iterable[str]) -> None:
        self.hub.unsubscribe(self._session, filters)

    def flush(self, timeout_s: float) -> bool:
        return True   # a publish is in the receivers' queues when it returns

    @property
    def connected(self) -> bool:
        return self._open

    def _end(self, lost: bool) -> None:
        self.hub.disconnect(self, lost)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close(self) -> None:
        self._end(lost=False)

    def abort(self) -> None:
        self._end(lost=True)
