"""Transports move instructions and weights down and reports up. The round loop talks only to this
interface; emulation uses the in-memory one, deployment the MQTT one."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable

from edgefl.messages import DeviceReport, RoundInstruction


class Transport(ABC):
    @abstractmethod
    def send(self, instruction: RoundInstruction, weights: dict[str, Any]) -> None:
        """Deliver one device's instruction and the tensors it needs."""

    @abstractmethod
    def collect(self, round: int, expected: Iterable[str], timeout_s: float | None) -> list[DeviceReport]:
        """Reports for `round` from the expected devices, until all arrive or the timeout passes."""

    def close(self) -> None:
        pass
