"""Transports move instructions and weights down and reports up. The round loop talks only to this
interface; emulation uses the in-memory one, deployment the MQTT one (`edgefl.transport.mqtt`). Both speak
the same device protocol (`edgefl.transport.endpoint`); its topics are in `edgefl.topics`."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Mapping, Optional

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

    def close(self) -> None:
        pass
