"""One client connection to a broker, as the protocol uses it: QoS 1 publish (never retained except
presence), subscribe, a handler for what arrives, and the broker's packet size limit checked before
anything is published (paho does not check it: an oversize publish gets the client disconnected, and
it reconnects and resends forever). Two implementations: MQTT (paho) and an in-process hub.

Every message is counted in payload bytes and in wire bytes: the size of its MQTT 5 PUBLISH packet
(fixed header, topic, packet id, properties, payload), computed from the packet as framed.
"""
from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

from edgefl.errors import TransportError
from edgefl.units import format_bytes

log = logging.getLogger("edgefl.transport")

MQTT_MAX_PACKET = 268_435_460        # 1 header byte + 4 length bytes + the largest remaining length
Handler = Callable[[str, bytes, int], None]   # (topic, payload, wire bytes)


def _varint_len(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16_384 else 3 if n < 2_097_152 else 4


def publish_packet_bytes(topic: str, payload_bytes: int, qos: int = 1, properties_bytes: int = 1) -> int:
    """Bytes of one MQTT 5 PUBLISH packet. `properties_bytes` includes the property length varint (1 when
    there are none)."""
    remaining = 2 + len(topic.encode()) + (2 if qos else 0) + properties_bytes + payload_bytes
    return 1 + _varint_len(remaining) + remaining


@dataclass
class Traffic:
    messages: int = 0
    payload_bytes: int = 0
    wire_bytes: int = 0

    def add(self, payload_bytes: int, wire_bytes: int) -> None:
        self.messages += 1
        self.payload_bytes += payload_bytes
        self.wire_bytes += wire_bytes

    def copy(self) -> "Traffic":
        return replace(self)

    def since(self, earlier: "Traffic") -> "Traffic":
        return Traffic(self.messages - earlier.messages, self.payload_bytes - earlier.payload_bytes,
                       self.wire_bytes - earlier.wire_bytes)

    def to_json(self) -> dict:
        return {"messages": self.messages, "payload_bytes": self.payload_bytes, "wire_bytes": self.wire_bytes}


class Wire(ABC):
    """`sent` and `received` count every PUBLISH; handlers run on the wire's own receive thread, one
    message at a time, in arrival order."""

    def __init__(self, client_id: str, max_packet_size: int):
        self.client_id = client_id
        self.max_packet_size = max_packet_size
        self.sent, self.received = Traffic(), Traffic()
        self._handler: Optional[Handler] = None
        self._unhandled: list[tuple[str, bytes, int]] = []     # arrived before a handler was set
        self._handoff = threading.Lock()
        self._on_connect: list[Callable[[], None]] = []
        self._count_lock = threading.Lock()

    def on_message(self, handler: Handler) -> None:
        """Messages that arrived before (a persistent session's queue comes right after connecting, and
        QoS 1 has already acknowledged them) go to `handler` first, in order."""
        with self._handoff:
            while self._unhandled:
                self._call(handler, *self._unhandled.pop(0))
            self._handler = handler

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Called after the connection comes back (e.g. to announce presence again: the will has fired)."""
        self._on_connect.append(callback)

    def check(self, topic: str, payload_bytes: int) -> int:
        """The packet size of a publish, or TransportError when the broker would refuse it."""
        size = publish_packet_bytes(topic, payload_bytes)
        if size > self.max_packet_size:
            raise TransportError(f"{topic}: a {format_bytes(size)} packet exceeds the broker's max_packet_size of "
                                 f"{format_bytes(self.max_packet_size)}; not sent (raise max_packet_size in the broker "
                                 "config, or send less)")
        return size

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        size = self.check(topic, len(payload))
        self._publish(topic, payload, retain)
        with self._count_lock:
            self.sent.add(len(payload), size)

    def confirm(self, topic: str, payload: bytes, timeout_s: float = 10.0) -> Optional[str]:
        """Publish (QoS 1, not retained) and wait for the broker's answer: None when it took the message, else
        why it refused it (e.g. its ACL: 'Not authorized'); TransportError when no answer comes. A broker
        grants every subscription and filters at delivery, so only this tells a login what it may not write."""
        size = self.check(topic, len(payload))
        answered, refusal = self._confirm(topic, payload, timeout_s)
        with self._count_lock:
            self.sent.add(len(payload), size)
        if not answered:
            raise TransportError(f"{self.client_id}: the broker did not acknowledge a publish on {topic} within "
                                 f"{timeout_s:g} s")
        return refusal

    def _confirm(self, topic: str, payload: bytes, timeout_s: float) -> tuple[bool, Optional[str]]:
        # a broker without an ACL (the in-process hub) takes whatever it acknowledges
        self._publish(topic, payload, False)
        return self.flush(timeout_s), None

    def _deliver(self, topic: str, payload: bytes, wire_bytes: int) -> None:
        with self._count_lock:
            self.received.add(len(payload), wire_bytes)
        with self._handoff:
            handler = self._handler
            if handler is None:
                self._unhandled.append((topic, payload, wire_bytes))
                return
        self._call(handler, topic, payload, wire_bytes)

    def _call(self, handler: Handler, topic: str, payload: bytes, wire_bytes: int) -> None:
        try:
            handler(topic, payload, wire_bytes)
        except Exception:  # a bad message must not stop the receive thread
            log.exception("%s: handling a message on %s failed", self.client_id, topic)

    def _connected_again(self) -> None:
        for callback in self._on_connect:
            try:
                callback()
            except Exception:
                log.exception("%s: reconnect callback failed", self.client_id)

    @abstractmethod
    def _publish(self, topic: str, payload: bytes, retain: bool) -> None: ...

    @abstractmethod
    def subscribe(self, filters: Iterable[str]) -> None:
        """Subscribe (QoS 1) and wait until the broker has granted it."""

    @abstractmethod
    def unsubscribe(self, filters: Iterable[str]) -> None:
        """Stop receiving what `filters` (subscribed before) match; the broker's answer is not waited for."""

    @abstractmethod
    def flush(self, timeout_s: float) -> bool:
        """Wait until the broker has acknowledged everything published so far; False on timeout."""

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def close(self) -> None:
        """Flush and disconnect cleanly (no last will)."""

    @abstractmethod
    def abort(self) -> None:
        """Drop the connection without a DISCONNECT, as a crash or a lost network would: the broker
        publishes the last will and keeps the session for a later connection with the same client id."""
