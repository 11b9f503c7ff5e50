"""A failed connection says what is most likely wrong and the fix (issue: operating a served run), against
real mosquitto listeners: mqtt:// on a TLS port, mqtts:// on a plain one, a CA that does not verify the
broker, and a broker that does not answer MQTT 5 (the embedded one)."""
from __future__ import annotations

import re

import pytest
from mosquitto import Mosquitto, make_tls

from edgefl.errors import TransportError
from edgefl.protocol.mqtt_wire import MqttWire


@pytest.fixture(scope="module")
def listeners(tmp_path_factory):
    root = tmp_path_factory.mktemp("brokers")
    with Mosquitto(root / "tls", tls=True) as tls, Mosquitto(root / "plain") as plain:
        yield tls, plain, root


def connect(url, **kw):
    with pytest.raises(TransportError) as caught:
        MqttWire(url, "probe-client", connect_timeout_s=2, **kw)
    return str(caught.value)


def test_plain_mqtt_on_a_tls_port_says_use_mqtts(listeners):
    tls, _, _ = listeners
    message = connect(f"mqtt://127.0.0.1:{tls.port}")
    assert message.endswith(f"port {tls.port} is a TLS listener: use mqtts://127.0.0.1:{tls.port} (and --ca-file with "
                            "the broker's CA certificate)"), message


def test_tls_on_a_plain_port_says_use_mqtt(listeners):
    _, plain, _ = listeners
    message = connect(f"mqtts://localhost:{plain.port}")
    assert f"port {plain.port} may be a plain MQTT listener: use mqtt://localhost:{plain.port}" in message, message


def test_a_ca_that_does_not_verify_the_broker_is_named_as_such(listeners):
    tls, _, root = listeners
    (root / "other").mkdir(exist_ok=True)
    other_ca = make_tls(root / "other")[0]
    message = connect(f"mqtts://localhost:{tls.port}", ca_file=other_ca)
    assert re.search(f"its certificate does not verify against the CA in --ca-file {other_ca} "
                     r"\(.*CERTIFICATE_VERIFY_FAILED\); give the CA certificate of this broker's deployment", message), \
        message
    assert "give the broker's CA certificate with --ca-file" not in message      # it was given
    without = connect(f"mqtts://localhost:{tls.port}")
    assert "does not verify against this machine's CAs" in without and "with --ca-file" in without, without
    MqttWire(f"mqtts://localhost:{tls.port}", "probe-client", ca_file=tls.ca_file).close()    # the right one


def test_a_broker_that_drops_an_mqtt5_connect_is_named(tmp_path):
    """amqtt (the embedded broker) closes an MQTT 5 CONNECT without a CONNACK; a stand-in that does the same."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def drop_every_client():
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            client.recv(1024)
            client.close()
    threading.Thread(target=drop_every_client, daemon=True).start()
    try:
        message = connect(f"mqtt://127.0.0.1:{port}")
    finally:
        server.close()
    assert "closed the connection without answering MQTT 5" in message and "run mosquitto" in message, message
