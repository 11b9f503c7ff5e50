"""Peak memory of a process tree, sampled: what a system really holds, workers and daemons included.

`TreeSampler` sums the resident set size of its root processes and all their descendants every
`interval` seconds on a background thread, keeps the peak (and the most processes seen at once) and a
timeline of the CPU seconds the tree has used (each process counted to the last value seen, so processes
that have ended keep their share), and calls `on_tick()` each time, so a caller can watch files the
measured system writes with the same clock. `cpu_at(t)` interpolates the timeline: the CPU spent between
two moments of a run, which on a machine shared with other work says more than the wall time between them.
Summed RSS counts pages shared between processes (the torch libraries each worker maps) once per process:
that is the memory a machine must have for the processes to stay resident side by side.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Optional

import psutil


def tree(roots: Iterable[int]) -> list[psutil.Process]:
    """The live processes among `roots` and their descendants, each once."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                found.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def tree_usage(roots: Iterable[int], cpu: Optional[dict] = None) -> tuple[int, int]:
    """(summed RSS in bytes, number of processes) of the trees under `roots`; zombies count nothing.
    `cpu`, when given, is updated with each process's CPU seconds (user + system) keyed by (pid, start)."""
    total, count = 0, 0
    for p in tree(roots):
        try:
            with p.oneshot():
                total += p.memory_info().rss
                if cpu is not None:
                    t = p.cpu_times()
                    cpu[(p.pid, p.create_time())] = t.user + t.system
            count += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return total, count


class TreeSampler:
    def __init__(self, roots: Iterable[int] = (), interval: float = 0.2,
                 on_tick: Optional[Callable[[], None]] = None):
        self.roots, self.interval, self.on_tick = list(roots), interval, on_tick
        self.peak_bytes, self.peak_processes, self.samples = 0, 0, 0
        self.cpu: dict = {}
        self.timeline: list[tuple[float, float]] = []       # (time.time(), CPU seconds used so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, pid: int) -> None:
        self.roots.append(pid)

    def _sample(self) -> None:
        total, count = tree_usage(self.roots, self.cpu)
        self.timeline.append((time.time(), sum(self.cpu.values())))
        self.peak_bytes = max(self.peak_bytes, total)
        self.peak_processes = max(self.peak_processes, count)
        self.samples += 1
        if self.on_tick is not None:
            self.on_tick()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def cpu_at(self, t: float) -> float:
        """CPU seconds the tree had used at time `t` (time.time()), interpolated between samples."""
        points = self.timeline
        if not points or t <= points[0][0]:
            return points[0][1] if points else 0.0
        for (t0, c0), (t1, c1) in zip(points, points[1:]):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        return points[-1][1]

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stop_tree(pid: int, timeout: float = 10.0) -> None:
    """Terminate process `pid` and every descendant it has now (SIGTERM, then SIGKILL after `timeout`)."""
    procs = tree([pid])
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
