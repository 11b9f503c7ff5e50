"""The MQTT wire: one paho-mqtt 2.x client speaking MQTT 5 with a persistent session.

Persistent: clean_start False and a session expiry, so QoS 1 messages for a client that is away (a
device rebooting, a coordinator restarting) wait at the broker. paho's queue bound is set before the
connect (it cannot change afterwards); the broker's maximum packet size comes from its CONNACK and every
publish is checked against it first. paho reconnects by itself; subscriptions are renewed and the
reconnect callbacks (presence) run on every new connection.
"""
from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Iterable, Optional

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefl.errors import TransportError
from edgefl.transport.mqtt_config import check_ca_file, parse_broker_url, read_credentials
from edgefl.transport.wire import MQTT_MAX_PACKET, Wire, log, publish_packet_bytes


class MqttWire(Wire):
    def __init__(self, url: str, client_id: str, *, credentials: Optional[str | Path] = None,
                 ca_file: Optional[str | Path] = None, will: Optional[tuple[str, bytes]] = None,
                 session_expiry_s: int = 86_400, keepalive_s: int = 30, connect_timeout_s: float = 10.0,
                 max_packet_size: Optional[int] = None, max_inflight: int = 20, max_queued: int = 100_000):
        address = parse_broker_url(url)
        login = read_credentials(credentials)
        ca = check_ca_file(ca_file, address)
        super().__init__(client_id, min(max_packet_size or MQTT_MAX_PACKET, MQTT_MAX_PACKET))
        self.url = address.url
        self._filters: list[str] = []
        self._lock = threading.Condition()
        self._unacked: set[int] = set()
        self._early: set[int] = set()           # PUBACKs that beat the publish call's return
        self._up = self._ending = False
        self._refused: Optional[str] = None
        self._connack = threading.Event()
        self._subacks: dict[int, list[str]] = {}  # SUBACK mid -> refusals

        c = self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        c.max_queued_messages_set(max_queued)   # only before connect
        c.max_inflight_messages_set(max_inflight)
        c.reconnect_delay_set(1, 8)
        if login is not None:
            c.username_pw_set(login.username, login.password)
        if address.tls:
            c.tls_set(ca_certs=str(ca) if ca else None)
        if will is not None:
            c.will_set(will[0], will[1], qos=1, retain=True)
        c.on_connect, c.on_disconnect = self._connected, self._disconnected
        c.on_message, c.on_publish, c.on_subscribe = self._message, self._published, self._subscribed
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = session_expiry_s
        try:
            c.connect(address.host, address.port, keepalive_s, clean_start=False, properties=props)
        except ssl.SSLError as exc:
            raise TransportError(f"cannot connect to the broker at {self.url}: TLS: {exc.reason or exc}; give the "
                                 "broker's CA certificate with --ca-file") from None
        except OSError as exc:
            raise TransportError(f"cannot connect to the broker at {self.url}: {exc.strerror or exc}; is it "
                                 "running, and is the URL (mqtt:// or mqtts://, port) right?") from None
        c.loop_start()
        if not self._connack.wait(connect_timeout_s) or self._refused:
            self._stop(c.disconnect)
            why = self._refused or f"no answer within {connect_timeout_s:g} s"
            raise TransportError(f"the broker at {self.url} did not accept {client_id!r}: {why}"
                                 + ("; check --credentials" if self._refused else ""))

    # ------------------------------------------------------------------ paho callbacks (network thread)
    def _connected(self, client, userdata, flags, reason, props) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            self._connack.set()
            return
        limit = getattr(props, "MaximumPacketSize", None)
        if limit:
            self.max_packet_size = min(self.max_packet_size, int(limit))
        receive_max = getattr(props, "ReceiveMaximum", None)
        if receive_max and receive_max < client.max_inflight_messages:   # paho does not honour it
            log.warning("%s: the broker takes %d messages in flight, fewer than the %d configured here",
                        self.client_id, receive_max, client.max_inflight_messages)
        first = not self._connack.is_set()
        self._up = True
        self._connack.set()
        if not first:
            if self._filters:
                client.subscribe([(f, 1) for f in self._filters])
            self._connected_again()

    def _disconnected(self, client, userdata, flags, reason, props) -> None:
        self._up = False
        if reason.is_failure and not self._ending:
            log.info("%s: connection to %s lost (%s); reconnecting", self.client_id, self.url, reason)

    def _message(self, client, userdata, msg) -> None:
        props = len(msg.properties.pack()) if msg.properties is not None else 1
        self._deliver(msg.topic, msg.payload, publish_packet_bytes(msg.topic, len(msg.payload), msg.qos, props))

    def _published(self, client, userdata, mid, reason, props) -> None:
        with self._lock:
            if mid in self._unacked:
                self._unacked.discard(mid)
            else:
                self._early.add(mid)
            self._lock.notify_all()

    def _subscribed(self, client, userdata, mid, reasons, props) -> None:
        with self._lock:
            self._subacks[mid] = [str(r) for r in reasons if r.is_failure]
            self._lock.notify_all()

    # ----------------------------------------------------------------------------------- Wire
    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        # never hold our lock across client.publish: paho calls on_publish holding its own
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
            raise TransportError(f"{self.client_id}: paho's outgoing queue is full ({self._client.max_queued_messages}"
                                 f" messages): the broker at {self.url} is not keeping up; {topic} not sent")
        with self._lock:
            if info.mid in self._early:
                self._early.discard(info.mid)
            else:
                self._unacked.add(info.mid)

    def subscribe(self, filters: Iterable[str], timeout_s: float = 10.0) -> None:
        filters = [f for f in filters if f not in self._filters]
        if not filters:
            return
        self._filters += filters
        rc, mid = self._client.subscribe([(f, 1) for f in filters])
        with self._lock:
            granted = rc == mqtt.MQTT_ERR_SUCCESS and self._lock.wait_for(lambda: mid in self._subacks, timeout_s)
            refused = self._subacks.pop(mid, [])
        if not granted or refused:
            why = ", ".join(refused) or (mqtt.error_string(rc) if rc else f"no SUBACK within {timeout_s:g} s")
            raise TransportError(f"{self.client_id}: the broker at {self.url} did not grant {filters} ({why})")

    def flush(self, timeout_s: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: not self._unacked, timeout_s)

    @property
    def connected(self) -> bool:
        return self._up

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        self._ending = True
        self._client.disconnect()
        self._client.loop_stop()
        self._up = False

    def abort(self) -> None:
        def shut() -> None:
            sock = self._client.socket()
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)   # no DISCONNECT: the broker sends the will
                except OSError:
                    pass
        self._stop(shut)

    def _stop(self, how) -> None:
        self._ending = True
        # paho's own flag, set first: otherwise its loop sleeps out a reconnect delay before it sees loop_stop
        self._client._thread_terminate = True
        how()
        self._client.loop_stop()
        self._up = False
