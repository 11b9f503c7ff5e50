"""In-memory transport: devices are objects in this process (or proxies to worker processes) with a
`handle(instruction, weights) -> DeviceReport` method. Tensors are passed by reference, not copied."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from edgefl.errors import TransportError
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.transport import Transport


class InMemoryTransport(Transport):
    def __init__(self, device_factory: Callable[[str], Any]):
        self._factory = device_factory
        self._devices: dict[str, Any] = {}
        self._pending: dict[int, list[DeviceReport]] = {}
        self.bytes_down = 0
        self.bytes_up = 0

    def device(self, device_id: str):
        if device_id not in self._devices:
            self._devices[device_id] = self._factory(device_id)
        return self._devices[device_id]

    def send(self, instruction: RoundInstruction, weights: dict[str, Any]) -> None:
        report = self.device(instruction.device_id).handle(instruction, weights)
        self.bytes_down += report.download_bytes
        self.bytes_up += report.upload_bytes
        self._pending.setdefault(instruction.round, []).append(report)

    def collect(self, round: int, expected: Iterable[str], timeout_s: float | None) -> list[DeviceReport]:
        reports = self._pending.pop(round, [])
        missing = set(expected) - {r.device_id for r in reports}
        if missing and timeout_s is None:
            raise TransportError(f"round {round}: no report from {sorted(missing)[:3]} (in-memory devices never time out)")
        return reports
