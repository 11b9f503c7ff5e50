"""A process's own peak memory, read from /proc/self/status (Linux): what the training child measures of
itself, as a whole and per phase of its round."""
from __future__ import annotations


def vm_status(field: str) -> int:
    """A /proc/self/status memory field (VmHWM, VmRSS) in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class PhasePeaks:
    """The peak RSS of each phase of a round (load, train, upload), by resetting VmHWM after each (Linux >= 4.0:
    /proc/self/clear_refs); the process's peak is the largest. Once a reset is refused, the later phases' own
    peaks are not known (None); the whole peak still is."""

    def __init__(self) -> None:
        self.peaks: dict[str, int | None] = {}
        self.whole = 0
        self.split = True

    def end(self, phase: str) -> None:
        peak = vm_status("VmHWM")
        self.whole = max(self.whole, peak)
        self.peaks[phase] = peak if self.split else None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.split = False
