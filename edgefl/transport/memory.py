"""In-memory transport. Devices live in this process and attach in one of two ways:

* emulation: objects (or proxies to worker processes) with a `handle(instruction, weights) ->
  DeviceReport` method, made by `device_factory`; tensors are passed by reference, not copied. A
  device runs when its report is collected, not when it is sent to: the coordinator then holds one
  upload at a time, as it would with devices that train while it waits;
* device links: `connect(device_id)` gives a device its connection to an in-process broker (the
  `MemoryHub`), over which it speaks exactly the MQTT protocol (chunked artifacts, flat float32
  buffers, presence) through `edgefl.device_runtime.link.DeviceLink`. The transport contract suite runs
  this path and the MQTT one with the same tests.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

from edgefl import topics
from edgefl.errors import TransportError
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.protocol import envelopes
from edgefl.protocol.chunks import CHUNK_SIZE, WINDOW
from edgefl.protocol.memory_wire import MemoryHub, MemoryWire
from edgefl.protocol.wire import MQTT_MAX_PACKET
from edgefl.transport.endpoint import COORDINATOR_ID, GRACE_S, WireTransport


class InMemoryTransport(WireTransport):
    def __init__(self, device_factory: Optional[Callable[[str], Any]] = None, *,
                 max_packet_size: int = MQTT_MAX_PACKET, chunk_size: int = CHUNK_SIZE, window: int = WINDOW,
                 grace_s: float = GRACE_S):
        self.hub = MemoryHub(max_packet_size)
        super().__init__(self.hub.connect(COORDINATOR_ID), chunk_size, window, grace_s)
        self._factory = device_factory
        self._devices: dict[str, Any] = {}
        self._pending: dict[int, list[tuple[RoundInstruction, Mapping[str, Any]]]] = {}
        self.bytes_down = 0
        self.bytes_up = 0

    def connect(self, device_id: str) -> MemoryWire:
        """A device's connection to the in-process broker (persistent session; its will marks it offline)."""
        topics.check_device_id(device_id)
        return self.hub.connect(device_id, will=(topics.presence(device_id), envelopes.presence(False, device_id)))

    def device(self, device_id: str):
        if device_id not in self._devices:
            self._devices[device_id] = self._factory(device_id)
        return self._devices[device_id]

    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        if self._factory is None:
            return super().send(instruction, weights, artifacts)
        self._pending.setdefault(instruction.round, []).append((instruction, weights))

    def collect(self, round: int, expected: Iterable[str], timeout_s: float | None,
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        if self._factory is None:
            return super().collect(round, expected, timeout_s, on_report)
        reports, pending = [], self._pending.pop(round, [])[::-1]
        while pending:      # popped one by one: a device's weights are let go once it has run
            instruction, weights = pending.pop()
            report = self.device(instruction.device_id).handle(instruction, weights)
            del weights
            self.bytes_down += report.download_bytes
            self.bytes_up += report.upload_bytes
            if on_report is not None:
                on_report(report)
            reports.append(report)
        missing = set(expected) - {r.device_id for r in reports}
        if missing and timeout_s is None:
            raise TransportError(f"round {round}: no report from {sorted(missing)[:3]} (in-memory devices never time out)")
        return reports
