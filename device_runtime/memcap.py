"""Hold a training process to a memory budget, as the device it stands in for would (`--enforce-memory`).

Where this machine lets us make a memory cgroup (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`;
usually as root), the child runs in one of its own and the kernel kills it when its resident memory goes
over: what a phone's low-memory killer or a Pi's OOM killer does. Elsewhere RLIMIT_AS caps its address
space instead, which is stricter than the budget (mapped but untouched pages count), so a runtime that
reserves much virtual memory may fail under it while using less.

The child joins its cgroup (or sets its limit) in a `sh -c '...; exec python ...'` prefix, before the
interpreter starts: everything it allocates is accounted, and the only Python between fork and exec is
the one prctl call that ties the child's life to its parent's (edgefl.device_runtime.child). `exec` keeps
the child's pid and that tie.
"""
from __future__ import annotations

import shlex
import uuid
from pathlib import Path
from typing import Optional

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_v1_memory_cgroup() -> Optional[Path]:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return CGROUP_ROOT / "memory" / path.lstrip("/")
    except OSError:
        pass
    return None


class MemoryCap:
    def __init__(self, limit_bytes: int, name: str = "edgefl"):
        self.limit = int(limit_bytes)
        self.folder: Optional[Path] = None
        self.kind = "rlimit_as"
        self._limit_file = ""
        for parent, limit_file in ((CGROUP_ROOT, "memory.max"), (_own_v1_memory_cgroup(), "memory.limit_in_bytes")):
            if parent is None or not (parent / ("cgroup.controllers" if limit_file == "memory.max" else limit_file)).exists():
                continue
            folder = parent / f"{name}-{uuid.uuid4().hex[:8]}"
            try:
                folder.mkdir()
                (folder / limit_file).write_text(str(self.limit))
            except OSError:
                try:
                    folder.rmdir()
                except OSError:
                    pass
                continue
            self.folder, self.kind, self._limit_file = folder, "cgroup", limit_file
            break

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started inside the cap."""
        if self.folder is not None:
            join = f"echo $$ > {shlex.quote(str(self.folder / 'cgroup.procs'))}"
        else:
            join = f"ulimit -v {max(self.limit // 1024, 1)}"
        return ["/bin/sh", "-c", f"{join} && exec {shlex.join(argv)}"]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for memory."""
        if self.folder is None:
            return False
        for events in ("memory.events", "memory.oom_control"):
            try:
                for line in (self.folder / events).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
            except (OSError, ValueError):
                continue
        return False

    def describe(self) -> str:
        where = f"cgroup {self.folder.name}" if self.folder is not None else "RLIMIT_AS"
        return f"{self.limit} B ({where})"

    def close(self) -> None:
        if self.folder is not None:
            try:
                self.folder.rmdir()
            except OSError:
                pass
            self.folder = None

    def __enter__(self) -> "MemoryCap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
