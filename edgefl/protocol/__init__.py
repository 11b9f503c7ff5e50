"""What both ends of the device protocol share: the coordinator's (edgefl.transport) and the device's
(edgefl.device_runtime.link). The topics are edgefl.topics.

`wire` (one client connection as the protocol uses it, with the broker's packet limit checked), `mqtt_wire`
(paho-mqtt 2.x, MQTT 5), `memory_wire` (an in-process stand-in for the broker), `envelopes` (the JSON
messages), `chunks` (artifacts in sha256-checked chunks), `tensors` (tensors as one flat buffer),
`broker_address` (mqtt:// and mqtts:// URLs).
"""
from edgefl import lazy_exports

_WHERE = {
    "Wire": ".wire", "MqttWire": ".mqtt_wire", "MemoryHub": ".memory_wire", "MemoryWire": ".memory_wire",
    "pack": ".tensors", "unpack": ".tensors", "ChunkManifest": ".chunks", "BrokerAddress": ".broker_address",
    "parse_broker_url": ".broker_address",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
