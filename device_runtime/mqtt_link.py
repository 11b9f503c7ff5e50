"""The device's link over MQTT: `DeviceLink` on a paho connection whose client id is the device id, with
a persistent session (instructions and chunks sent while the device is away wait at the broker) and a
retained last will on `fl/v1/presence/<device>` that marks it offline when the connection is lost."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from edgefl.transport import envelopes, topics
from edgefl.transport.mqtt_wire import MqttWire
from edgefl.device_runtime.link import DeviceLink


class MqttLink(DeviceLink):
    def __init__(self, url: str, device_id: str, credentials: Optional[str | Path], cache_dir: str | Path, *,
                 ca_file: Optional[str | Path] = None, session_expiry_s: int = 86_400, stall_s: float = 5.0,
                 resend_after_s: float = 60.0, max_packet_size: Optional[int] = None):
        """`url`: mqtt://HOST:PORT or mqtts://HOST:PORT; `credentials`: this device's JSON login file (or
        None for a broker without logins); `cache_dir`: the sha256-addressed artifact cache."""
        topics.check_device_id(device_id)
        wire = MqttWire(url, device_id, credentials=credentials, ca_file=ca_file, session_expiry_s=session_expiry_s,
                        will=(topics.presence(device_id), envelopes.presence(False, device_id)),
                        max_packet_size=max_packet_size)
        super().__init__(wire, device_id, cache_dir, stall_s=stall_s, resend_after_s=resend_after_s)
