"""The MQTT transport: the coordinator's end of the device protocol over a real broker (paho-mqtt 2.x,
MQTT 5, QoS 1, persistent session). Topics: `edgefl.topics`; what travels and how:
`edgefl.transport.endpoint` (instructions, reports, presence) and `edgefl.transport.artifact_server`
(1 MiB chunks, per-chunk sha256, a window acknowledged by the device, resume after reconnect).

    transport = MqttTransport("mqtts://broker:8883", credentials="credentials/coordinator.json",
                              ca_file="tls/ca.crt")
    transport.wait_online(["pi-1", "pi-2"], timeout_s=60)
    prefix = transport.ship("pi-1", Path("artifacts/abc/prefix/model.onnx"))
    transport.send(instruction, weights, artifacts={"prefix": prefix})
    reports = transport.collect(round, ["pi-1"], timeout_s=300)

Connecting checks the login with a round trip through the broker (`WireTransport.check_access`): a device's
login in the coordinator's place fails here, naming the file, instead of serving rounds nobody can hear.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from edgefl.errors import TransportError
from edgefl.protocol.chunks import CHUNK_SIZE, WINDOW
from edgefl.protocol.mqtt_wire import MqttWire
from edgefl.credentials import read_credentials
from edgefl.transport.endpoint import COORDINATOR_ID, GRACE_S, WireTransport


class MqttTransport(WireTransport):
    def __init__(self, url: str, credentials: Optional[str | Path] = None, *, ca_file: Optional[str | Path] = None,
                 client_id: Optional[str] = None, chunk_size: int = CHUNK_SIZE, window: int = WINDOW,
                 session_expiry_s: int = 86_400, max_packet_size: Optional[int] = None, grace_s: float = GRACE_S,
                 resuming: int = 0):
        """`url`: mqtt://HOST:PORT or mqtts://HOST:PORT; `credentials`: a JSON file {"username", "password"};
        `ca_file`: the broker's CA certificate for mqtts (the system's CAs otherwise); `max_packet_size`:
        a limit to respect below the one the broker announces; `client_id`: default the login's username (a
        broker of `edgefl broker config` binds every client id to its login), else COORDINATOR_ID; `grace_s`,
        `resuming`: WireTransport's."""
        if client_id is None:
            client_id = read_credentials(credentials, "--credentials").username if credentials else COORDINATOR_ID
        wire = MqttWire(url, client_id, credentials=credentials, ca_file=ca_file, session_expiry_s=session_expiry_s,
                        max_packet_size=max_packet_size)
        try:
            super().__init__(wire, chunk_size, window, grace_s, resuming)
            self.url = wire.url
            self.check_access()
        except TransportError as exc:
            wire.abort()
            login = f"--credentials {credentials}" if credentials is not None else "no --credentials (anonymous)"
            raise TransportError(f"{login}: not the coordinator's login at {wire.url}: {exc}; use "
                                 "credentials/coordinator.json from 'edgefl broker config'") from None
