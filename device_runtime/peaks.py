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


M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter number (malloc.h)


def return_large_buffers(threshold: int = 128 * 1024) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mapping, given back when freed. glibc's
    default raises that threshold to the size of each large buffer freed, so a round's upload chunks and weights
    came from the heap after the first round and stayed resident between rounds, fragmented (measured on the
    Python agent: 65 MiB held after each round instead of 47, peaks 65 instead of 61 MiB). Fixing the threshold
    turns that adjustment off. False where the C library has no mallopt (not glibc): nothing changes there."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
