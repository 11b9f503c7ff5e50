"""The MQTT wire: one paho-mqtt 2.x client speaking MQTT 5 with a persistent session, or MQTT 3.1.1 where
the broker does not answer MQTT 5.

Persistent: clean_start False and a session expiry, so QoS 1 messages for a client that is away (a
device rebooting, a coordinator restarting) wait at the broker. paho's queue bound is set before the
connect (it cannot change afterwards); the broker's maximum packet size comes from its CONNACK and every
publish is checked against it first. paho reconnects by itself; subscriptions are renewed and the
reconnect callbacks (presence) run on every new connection.

The broker's PUBACK says whether it took a publish: mosquitto answers one its ACL denies with 0x87 (Not
authorized) and drops it, so `confirm` waits for that answer where a caller must know (a login's first
publish), and any refusal is logged with its topic. A failed connect says what the wrong part most likely
is: TLS against a plain port or the reverse, a CA that does not verify the broker, a broker that answers
neither MQTT 5 nor 3.1.1.

MQTT 3.1.1, for the embedded broker (amqtt 0.12.1): it never answers an MQTT 5 CONNECT, nor closes it.
Measured: it reads one as a 3.1.1 CONNECT whose fields run past the packet and waits for bytes that never
come; its log says why only once the client gives up. So a broker that is silent for FALLBACK_AFTER_S (a
CONNACK takes one round trip), drops the MQTT 5 CONNECT or answers it "Unsupported protocol version" gets a
second connect speaking 3.1.1, within the same connect timeout: a connection to the embedded broker takes
those seconds longer, and an MQTT 5 broker slower than that to answer is spoken to in 3.1.1 too. The
fallback is logged (a warning, once per broker and process) and `protocol` says what was spoken.
What 3.1.1 lacks, and what stands in for it:
- session expiry: the session is kept with clean_session False, for as long as the broker keeps it (amqtt:
  until it stops; it holds sessions in memory only);
- the broker's maximum packet size: its CONNACK has none, so the limit stays the one configured here (or
  the protocol's); the embedded broker has no limit of its own;
- PUBACK reason codes: a 3.1.1 PUBACK only says the broker got the message, also one its ACL then drops, so
  `confirm` answers None (taken) and `can_confirm` is False: a caller must not claim the check was made
  (a round trip through the broker, as the coordinator's check_access does, still tells);
- properties (the CONNACK's limits, a PUBLISH's): absent, so the packets counted have no properties field.
The will is the same in both.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefl.credentials import read_credentials
from edgefl.errors import TransportError
from edgefl.protocol.broker_address import BrokerAddress, check_ca_file, parse_broker_url
from edgefl.protocol.wire import MQTT_MAX_PACKET, Wire, log, publish_packet_bytes

MQTT5, MQTT311 = "5", "3.1.1"
FALLBACK_AFTER_S = 3.0      # silence after an MQTT 5 CONNECT that means 3.1.1 only (at most half the connect timeout)
_NOT_MQTT5 = 0x84           # CONNACK Unsupported Protocol Version (also paho's reading of a 3.1.1 broker's refusal)
_told: set[str] = set()     # brokers this process has logged speaking 3.1.1 to


class MqttWire(Wire):
    def __init__(self, url: str, client_id: str, *, credentials: Optional[str | Path] = None,
                 ca_file: Optional[str | Path] = None, will: Optional[tuple[str, bytes]] = None,
                 session_expiry_s: int = 86_400, keepalive_s: int = 30, connect_timeout_s: float = 10.0,
                 max_packet_size: Optional[int] = None, max_inflight: int = 20, max_queued: int = 100_000):
        address = parse_broker_url(url)
        login = read_credentials(credentials, "--credentials") if credentials is not None else None
        ca = check_ca_file(ca_file, address)
        super().__init__(client_id, min(max_packet_size or MQTT_MAX_PACKET, MQTT_MAX_PACKET))
        self.url = address.url
        self.protocol = MQTT5                   # or MQTT311, when the broker does not answer MQTT 5
        self._filters: list[str] = []
        self._lock = threading.Condition()
        self._unacked: dict[int, str] = {}      # mid -> topic, until its PUBACK
        self._early: dict[int, str] = {}        # PUBACKs that beat the publish call's return: mid -> refusal
        self._answers: dict[int, str] = {}      # PUBACKs `confirm` waits for: mid -> refusal ("" = taken)
        self._watched: set[int] = set()
        self._up = self._ending = self._dropped = self._accepted = False
        self._refused: Optional[str] = None
        self._answer = threading.Event()        # a CONNACK, or the connection dropped before the first one
        self._subacks: dict[int, list[str]] = {}  # SUBACK mid -> refusals

        def connect(protocol: str, wait_s: float) -> bool:
            """True once the broker took the connection; False when it dropped it, does not speak `protocol` or
            said nothing within `wait_s`; TransportError when it refused the login."""
            v5 = protocol == MQTT5
            self.protocol, self._ending, self._dropped = protocol, False, False
            self._answer.clear()
            c = self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                           protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                           **({} if v5 else {"clean_session": False}))
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
            session = {}
            if v5:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = session_expiry_s
                session = {"clean_start": False, "properties": props}
            _connect(c, address, ca, keepalive_s, session)
            c.loop_start()
            self._answer.wait(wait_s)
            if self._accepted:
                return True
            self._stop(c.disconnect)
            if self._refused:
                raise TransportError(f"the broker at {self.url} did not accept {client_id!r}: {self._refused}; "
                                     "check --credentials")
            return False

        started = time.monotonic()
        if not connect(MQTT5, min(FALLBACK_AFTER_S, connect_timeout_s / 2)):
            dropped = self._dropped
            if not connect(MQTT311, max(0.0, connect_timeout_s - (time.monotonic() - started))):
                raise TransportError(f"the broker at {self.url} did not answer {client_id!r} within "
                                     f"{connect_timeout_s:g} s: {_silence(address, dropped and self._dropped)}")
            (log.debug if self.url in _told else log.warning)(
                "the broker at %s does not answer MQTT 5 (as the embedded broker does not): %s speaks MQTT 3.1.1 to "
                "it, without a session expiry, the broker's packet size limit or PUBACK reason codes (a publish its "
                "ACL drops looks taken)", self.url, client_id)
            _told.add(self.url)

    @property
    def can_confirm(self) -> bool:
        """Whether `confirm` can tell a refused publish from a taken one (MQTT 5 PUBACK reason codes)."""
        return self.protocol == MQTT5

    def check(self, topic: str, payload_bytes: int) -> int:
        size = super().check(topic, payload_bytes)    # the limit: an MQTT 5 packet, a byte larger at most
        return size if self.protocol == MQTT5 else publish_packet_bytes(topic, payload_bytes, properties_bytes=0)

    # ------------------------------------------------------------------ paho callbacks (network thread)
    def _connected(self, client, userdata, flags, reason, props) -> None:
        if reason.is_failure:
            if not (self.protocol == MQTT5 and reason.value == _NOT_MQTT5):    # that one: try 3.1.1
                self._refused = str(reason)
            self._answer.set()
            return
        if self.protocol == MQTT5:      # a 3.1.1 CONNACK has no properties: the limits stay as configured
            limit = getattr(props, "MaximumPacketSize", None)
            if limit:
                self.max_packet_size = min(self.max_packet_size, int(limit))
            receive_max = getattr(props, "ReceiveMaximum", None)
            if receive_max and receive_max < client.max_inflight_messages:   # paho does not honour it
                log.warning("%s: the broker takes %d messages in flight, fewer than the %d configured here",
                            self.client_id, receive_max, client.max_inflight_messages)
        first = not self._accepted
        self._up = self._accepted = True
        self._answer.set()
        if not first:
            if self._filters:
                client.subscribe([(f, 1) for f in self._filters])
            self._connected_again()

    def _disconnected(self, client, userdata, flags, reason, props) -> None:
        self._up = False
        if not self._accepted:      # before the first CONNACK `connect` decides what comes next, not paho
            client._thread_terminate = True     # no reconnect (its delay would hold up loop_stop a second)
            if not self._ending:                # the broker closed it, not `connect` giving up
                self._dropped = True
                self._answer.set()
        if reason.is_failure and not self._ending:
            log.info("%s: connection to %s lost (%s); reconnecting", self.client_id, self.url, reason)

    def _message(self, client, userdata, msg) -> None:
        props = len(msg.properties.pack()) if msg.properties is not None else 0    # 3.1.1: no properties field
        self._deliver(msg.topic, msg.payload, publish_packet_bytes(msg.topic, len(msg.payload), msg.qos, props))

    def _published(self, client, userdata, mid, reason, props) -> None:
        # MQTT 5 PUBACK reason: 0x87 Not authorized is how mosquitto says its ACL dropped the message (3.1.1: Success)
        refusal = str(reason) if reason.is_failure else ""
        with self._lock:
            if mid in self._unacked:
                topic = self._unacked.pop(mid)
                if refusal and mid not in self._watched:     # a watched one's caller says it better
                    log.warning("%s: the broker at %s refused a publish on %s: %s", self.client_id, self.url,
                                topic, refusal)
            else:
                self._early[mid] = refusal
            if mid in self._watched:
                self._answers[mid] = refusal
            self._lock.notify_all()

    def _subscribed(self, client, userdata, mid, reasons, props) -> None:
        with self._lock:
            self._subacks[mid] = [str(r) for r in reasons if r.is_failure]
            self._lock.notify_all()

    # ----------------------------------------------------------------------------------- Wire
    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        self._send(topic, payload, retain)

    def _confirm(self, topic: str, payload: bytes, timeout_s: float) -> tuple[bool, Optional[str]]:
        mid, answer = self._send(topic, payload, False, watch=True)
        with self._lock:
            if answer is None and self._lock.wait_for(lambda: mid in self._answers, timeout_s):
                answer = self._answers.pop(mid)
            self._watched.discard(mid)
        return answer is not None, answer or None

    def _send(self, topic: str, payload: bytes, retain: bool, watch: bool = False) -> tuple[int, Optional[str]]:
        """(mid, the broker's answer if it came already: "" taken, else why not; None: not yet)."""
        # never hold our lock across client.publish: paho calls on_publish holding its own
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
            raise TransportError(f"{self.client_id}: paho's outgoing queue is full ({self._client.max_queued_messages}"
                                 f" messages): the broker at {self.url} is not keeping up; {topic} not sent")
        with self._lock:
            if info.mid in self._early:
                refusal = self._early.pop(info.mid)
                if refusal and not watch:
                    log.warning("%s: the broker at %s refused a publish on %s: %s", self.client_id, self.url,
                                topic, refusal)
                return info.mid, refusal
            self._unacked[info.mid] = topic
            if watch:       # under the lock that _published takes: its answer cannot slip past
                self._watched.add(info.mid)
            return info.mid, None

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

    def unsubscribe(self, filters: Iterable[str]) -> None:
        filters = [f for f in filters if f in self._filters]
        if filters:
            self._filters = [f for f in self._filters if f not in filters]
            self._client.unsubscribe(filters)

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


def _connect(c: mqtt.Client, address: BrokerAddress, ca: Optional[Path], keepalive_s: int, session: dict) -> None:
    """paho's connect (TCP, TLS, the CONNECT sent), its failures said as what is most likely wrong."""
    try:
        c.connect(address.host, address.port, keepalive_s, **session)
    except ssl.SSLCertVerificationError as exc:
        against = f"the CA in --ca-file {ca}" if ca else "this machine's CAs"
        fix = ("give the CA certificate of this broker's deployment (tls/ca.crt of 'edgefl broker config')"
               if ca else "give the broker's CA certificate with --ca-file")
        raise TransportError(f"cannot connect to the broker at {address.url}: TLS: its certificate does not verify "
                             f"against {against} ({exc.verify_message or exc.reason}, "
                             f"{exc.reason or 'CERTIFICATE_VERIFY_FAILED'}); {fix}") from None
    except (ssl.SSLError, ConnectionResetError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
        hint = (f"; port {address.port} may be a plain MQTT listener: use mqtt://{address.host}:{address.port}"
                if address.tls else "")
        raise TransportError(f"cannot connect to the broker at {address.url}: {'TLS: ' if address.tls else ''}"
                             f"{why or exc}{hint or '; is the URL (mqtt:// or mqtts://, port) right?'}") from None
    except OSError as exc:
        if address.tls and _accepts_tcp(address):    # a TLS handshake nobody answers: a plain listener
            raise TransportError(f"cannot connect to the broker at {address.url}: TLS: {exc.strerror or exc}; port "
                                 f"{address.port} may be a plain MQTT listener: use "
                                 f"mqtt://{address.host}:{address.port}") from None
        raise TransportError(f"cannot connect to the broker at {address.url}: {exc.strerror or exc}; is it "
                             "running, and is the URL (mqtt:// or mqtts://, port) right?") from None


def _silence(address: BrokerAddress, dropped: bool) -> str:
    """Why a broker that took the TCP connection answered neither an MQTT 5 nor an MQTT 3.1.1 CONNECT, and the
    fix; `dropped`: it closed the connection both times."""
    if not address.tls and _speaks_tls(address):
        return (f"port {address.port} is a TLS listener: use mqtts://{address.host}:{address.port} (and --ca-file "
                "with the broker's CA certificate)")
    if dropped:
        return ("it closed the connection without answering MQTT 5 or 3.1.1: is it an MQTT broker, and is the URL "
                "(port) right? For the deployment folder of 'edgefl broker config', run mosquitto ('apt-get install "
                "mosquitto', then 'edgefl broker up')")
    return "is it an MQTT broker, and is the URL (mqtt:// or mqtts://, port) right?"


def _speaks_tls(address: BrokerAddress, timeout_s: float = 3.0) -> bool:
    """Whether the port completes a TLS handshake (certificate unchecked: this only asks what it speaks)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=address.host):
            return True
    except (OSError, ssl.SSLError):
        return False


def _accepts_tcp(address: BrokerAddress, timeout_s: float = 3.0) -> bool:
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout_s):
            return True
    except OSError:
        return False
