"""Transports move instructions and weights down and reports up. The round loop talks only to this
interface; emulation uses the in-memory one (`memory`), deployment the MQTT one (`mqtt`), the Ray engine
`ray_transport`. The in-memory and MQTT ones are the coordinator's end of the same device protocol
(`endpoint`, with `artifact_server` and `uploads`); what both ends share is edgefl.protocol, the topics
edgefl.topics."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Mapping, Optional

from edgefl import lazy_exports
from edgefl.messages import DeviceReport, RoundInstruction


class Transport(ABC):
    @abstractmethod
    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        """Deliver one device's instruction and the tensors it needs; `artifacts` (role -> id) names
        artifacts shipped to it beforehand (transports that ship them)."""

    @abstractmethod
    def collect(self, round: int, expected: Iterable[str], timeout_s: float | None,
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        """Reports for `round` from the expected devices, until all arrive or the timeout passes.
        `on_report` sees each report as it arrives (the coordinator journals it before the round ends)."""

    def resuming(self, round: int) -> None:
        """The round loop resumes at `round` (a restarted coordinator): devices may have answered it before
        its instruction goes out again; a transport that can hold those answers does."""

    def close(self) -> None:
        pass


_WHERE = {"WireTransport": ".endpoint", "InMemoryTransport": ".memory", "MqttTransport": ".mqtt",
          "RayTransport": ".ray_transport"}
__all__ = ["Transport", *sorted(_WHERE)]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
