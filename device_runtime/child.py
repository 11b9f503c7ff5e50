"""Run one piece of device work in a fresh child process and measure it from outside.

The child gets the allocator policy the cost model is calibrated for (glibc's mmap threshold fixed at
128 KiB through MALLOC_MMAP_THRESHOLD_, read by glibc at process start; edgefl.cost.measure says why) and
one thread per core it is given. The parent reads the child's peak RSS from the kernel (wait4's
ru_maxrss) as well, so a child that dies mid-step, killed for memory, still has a measured peak.

The child dies with its parent: an agent killed with SIGKILL (an OOM killer, `kill -9`, a crashed
supervisor) cannot stop it, and an orphaned trainer would go on holding the device's memory and CPU for a
round nobody waits for. On Linux the kernel sends it SIGKILL when the thread that started it exits
(prctl PR_SET_PDEATHSIG, set between fork and exec and kept across exec); that thread waits for the child
in `run_process`, so it outlives the child unless the agent dies.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from edgefl.device_runtime.memcap import MemoryCap
from edgefl.errors import EdgeflError

MMAP_THRESHOLD = 128 * 1024     # edgefl.cost.measure.MMAP_THRESHOLD: the policy the torch constants are fitted under


@dataclass
class ChildResult:
    returncode: int
    result: Optional[dict]          # the child's last stdout line, parsed, when it succeeded
    error: str                      # its one-line error (exit 2), or the tail of its stderr
    max_rss_bytes: int              # the kernel's peak RSS of the child


def child_env(threads: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


PR_SET_PDEATHSIG = 1            # linux/prctl.h


def _die_with_parent() -> Optional[Callable[[], None]]:
    """The function the child runs between fork and exec to be killed when its parent dies (Linux; None
    elsewhere). prctl and its arguments are made here, before fork: the child only makes the call (another
    thread of the agent may hold a lock at fork that the child could never take)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    args, parent = (ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL)), os.getpid()

    def preexec() -> None:
        prctl(*args)
        if os.getppid() != parent:      # the parent died before prctl: no signal will come
            os._exit(1)
    return preexec


def run_child(module: str, spec: dict, threads: int = 1, timeout_s: Optional[float] = None,
              cap: Optional[MemoryCap] = None, stop: Optional[threading.Event] = None) -> ChildResult:
    """`python -m module '<spec json>'` in a fresh process (inside `cap` when given)."""
    return run_process([sys.executable, "-m", module, json.dumps(spec)], threads, timeout_s, cap, stop)


def run_process(argv: list[str], threads: int = 1, timeout_s: Optional[float] = None,
                cap: Optional[MemoryCap] = None, stop: Optional[threading.Event] = None) -> ChildResult:
    """`argv` in a fresh process that prints its result as the last stdout line (a Python child, or the
    native trainer); killed at `timeout_s`, or as soon as `stop` is set (the agent is stopping)."""
    proc = subprocess.Popen(cap.wrap(argv) if cap is not None else argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(threads),
                            preexec_fn=_die_with_parent())
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: streams.__setitem__(n, f.read()), daemon=True)
               for n, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    timer = threading.Timer(timeout_s, proc.kill) if timeout_s else None
    if timer:
        timer.start()
    if stop is not None:
        done = threading.Event()

        def kill_on_stop() -> None:
            while not done.is_set():
                if stop.wait(0.2):
                    proc.kill()
                    return
        threading.Thread(target=kill_on_stop, daemon=True).start()
    # wait4, not Popen.wait: the kernel's peak RSS of this very child comes with its exit status
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if timer:
        timer.cancel()
    if stop is not None:
        done.set()
    for t in readers:
        t.join()
    out, err = streams.get("out", ""), streams.get("err", "")
    rss = usage.ru_maxrss * 1024  # kB on Linux
    if proc.returncode == 0:
        try:
            return ChildResult(0, json.loads(out.strip().splitlines()[-1]), "", rss)
        except (IndexError, ValueError):
            return ChildResult(1, None, f"no result from the training process: {err.strip()[-500:]}", rss)
    lines = [l for l in err.splitlines() if l.strip()]
    if proc.returncode == 2 and lines:
        return ChildResult(2, None, lines[-1].removeprefix("edgefl-device: error: ")
                           .removeprefix("edgefl-et-train: error: "), rss)
    why = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return ChildResult(proc.returncode, None, f"training process {why}: {(lines or [''])[-1][-300:]}", rss)


def check(result: ChildResult) -> dict:
    """The child's result, or its one-line error as an EdgeflError (exit 2) / RuntimeError (a crash)."""
    if result.returncode == 0 and result.result is not None:
        return result.result
    if result.returncode == 2:
        raise EdgeflError(result.error)
    raise RuntimeError(result.error)


def child_main(work: Callable[[], dict], runtime: Optional[str]) -> int:
    """The child's side of `run_child`: run `work`, print its result as the last stdout line (exit 0) or
    a user error as one line on stderr (exit 2). An ORT child blocks torch first: the ORT device path
    must never load it."""
    if runtime == "ort":
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        result = work()
    except EdgeflError as exc:
        print(f"edgefl-device: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
