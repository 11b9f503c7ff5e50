"""The device's link over MQTT: `DeviceLink` on a paho connection whose client id is the device id, with
a persistent session (instructions and chunks sent while the device is away wait at the broker) and a
retained last will on `fl/v1/presence/<device>` that marks it offline when the connection is lost.

Connecting checks that the broker takes this device's publishes on its own `up/` (the PUBACK's reason
code: mosquitto refuses what its ACL denies with 0x87 and drops it): another device's login connects
fine but is heard by nobody, so it fails here with the device id and the credentials file. Over MQTT 3.1.1
(the embedded broker) a PUBACK has no reason code: the check is not made, and the log says so."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from edgefl import topics
from edgefl.device_runtime.link import DeviceLink
from edgefl.errors import TransportError
from edgefl.protocol import envelopes
from edgefl.protocol.mqtt_wire import MqttWire
from edgefl.protocol.wire import log

LOST = "its connection was lost (last will)"   # what its presence says when the broker sends the will


class MqttLink(DeviceLink):
    def __init__(self, url: str, device_id: str, credentials: Optional[str | Path], cache_dir: str | Path, *,
                 ca_file: Optional[str | Path] = None, session_expiry_s: int = 86_400, stall_s: float = 5.0,
                 resend_after_s: float = 60.0, max_packet_size: Optional[int] = None, receipt_s: float = 30.0,
                 cache_budget_bytes: Optional[int] = None, group_wait_s: Optional[float] = None):
        """`url`: mqtt://HOST:PORT or mqtts://HOST:PORT; `credentials`: this device's JSON login file (or
        None for a broker without logins); `cache_dir`: the sha256-addressed artifact cache; the rest as
        DeviceLink's."""
        topics.check_device_id(device_id)
        wire = MqttWire(url, device_id, credentials=credentials, ca_file=ca_file, session_expiry_s=session_expiry_s,
                        will=(topics.presence(device_id), envelopes.presence(False, device_id, reason=LOST)),
                        max_packet_size=max_packet_size)
        refusal = wire.confirm(topics.hello(device_id), envelopes.dumps({"device": device_id}))
        if refusal is not None:
            wire.close()
            login = f"--credentials {credentials}" if credentials is not None else "no --credentials (anonymous)"
            raise TransportError(f"{device_id}: the broker at {wire.url} refused its publish on its own up/ topic "
                                 f"({refusal}): {login} is not {device_id}'s login, so nobody would hear it; give "
                                 f"credentials/{device_id}.json from 'edgefl broker config'")
        if not wire.can_confirm:
            log.info("%s: the broker at %s speaks MQTT 3.1.1: whether this login may publish on %s's up/ topic is not "
                     "checked (the login check needs MQTT 5)", device_id, wire.url, device_id)
        super().__init__(wire, device_id, cache_dir, stall_s=stall_s, resend_after_s=resend_after_s,
                         receipt_s=receipt_s, cache_budget_bytes=cache_budget_bytes, group_wait_s=group_wait_s)
