"""`edgefl serve`'s live view of the round in progress, and the status file `edgefl status` reads.

Each device's state comes from what the coordinator's end of the transport sees (`transport.activity`:
instruction sent, artifact chunks acknowledged, the device's word on up/metrics, its report, its
presence). On a terminal it is a table redrawn in place (rich Live); anywhere else (a log file, a pipe,
systemd) it is one timestamped line per change, a line when a round starts waiting, and a reminder of who
is still awaited after `quiet_s` without news, so a long round never looks like a hang. The same state
goes to `<run>/status.json` as it changes (and every `heartbeat_s`, so a reader can tell a stopped
coordinator from a quiet round), written whole and renamed into place.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from edgefl.cli.console import STATUS_FILE, STATUS_SCHEMA, clock, device_lines, header, round_line
from edgefl.errors import StorageError
from edgefl.outdir import write_atomic
from edgefl.transport.activity import DeviceState
from edgefl.units import format_bytes, listing


def stop_reason(kind: type, exc: BaseException | None) -> str:
    """Why a run stopped, in words: an interrupt has no message of its own."""
    if issubclass(kind, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGTERM)"
    return str(exc) or kind.__name__


class LiveView:
    def __init__(self, activity, console, run: Path, *, rounds: int, groups: Mapping[str, str], broker: str,
                 online: Callable[[], Iterable[str]], interactive: Optional[bool] = None, tick_s: float = 0.5,
                 quiet_s: float = 30.0, heartbeat_s: float = 5.0):
        self.activity, self.console, self.path = activity, console, Path(run) / STATUS_FILE
        self.online, self.groups = online, dict(groups)
        self.interactive = console.is_terminal if interactive is None else interactive
        self.tick_s, self.quiet_s, self.heartbeat_s = tick_s, quiet_s, heartbeat_s
        self.base = {"schema": STATUS_SCHEMA, "pid": os.getpid(), "broker": broker, "rounds": rounds,
                     "started": time.time(), "expected": len(self.groups), "groups": self.groups}
        self._changes: queue.Queue = queue.Queue()
        self._writing = threading.Lock()       # the loop's heartbeat and a finished round's write
        self._stop = threading.Event()
        self._said = time.monotonic()          # when the last line went out
        self.last_round = ""
        self._unwritten = False
        activity.listen(self._changes.put)     # on the wire's thread: only a note

    def __enter__(self) -> "LiveView":
        self._live = None
        if self.interactive:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=2, transient=True)
            self._live.start()
        self.write()
        self._thread = threading.Thread(target=self._run, name="edgefl-live", daemon=True)
        self._thread.start()
        return self

    def round_done(self, record) -> None:
        """A finished round's line (above a live table), and the status file at once."""
        self.last_round = round_line(record)
        self.console.print(self.last_round)
        self._said = time.monotonic()
        self.write()

    def __exit__(self, kind, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
        if self._live is not None:
            self._live.stop()
        outcome = "completed" if kind is None else f"stopped: {stop_reason(kind, exc)}"
        self.write(finished=True, outcome=outcome)

    # ----------------------------------------------------------------------------------- the loop
    def _run(self) -> None:
        written = time.monotonic()
        while not self._stop.wait(self.tick_s):
            changed = self._drain()
            now = time.monotonic()
            if self._live is not None:
                self._live.update(self._render())
            elif now - self._said >= self.quiet_s and self.activity.round:
                self._say(self._waiting_line())
            if changed or now - written >= self.heartbeat_s:
                self.write()
                written = now

    def _drain(self) -> bool:
        changed = False
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                return changed
            changed = True
            if self._live is not None:
                continue
            if not change.device:     # the round starts waiting for reports
                deadline = change.deadline
                until = f" until {clock(deadline)} ({max(0.0, deadline - change.at):.0f} s)" if deadline else ""
                self._say(f"round {change.round}: waiting for {change.detail}{until}", change.at)
            else:
                self._say(f"round {change.round}: {change.device} {change.state}"
                          + (f" ({change.detail})" if change.detail else ""), change.at)

    def _say(self, line: str, at: Optional[float] = None) -> None:
        if self._live is None:
            self.console.print(f"{clock(at or time.time())} {line}", highlight=False, markup=False)
        self._said = time.monotonic()

    def _waiting_line(self) -> str:
        status, now = self.status(), time.time()
        awaited = [f"{d} ({s['state']} {now - s['since']:.0f} s"
                   + (f", {format_bytes(s['bytes'])} fetched)" if s.get("bytes") else ")")
                   for d, s in status["devices"].items() if s["state"] not in (DeviceState.REPORTED, DeviceState.FAILED)]
        return header(status, now) + (f"; waiting for {listing(awaited)}" if awaited else "")

    def _render(self):
        from rich.console import Group
        from rich.text import Text

        status, now = self.status(), time.time()
        lines = [Text(header(status, now), style="bold")]
        lines += [Text(line) for line in device_lines(status, now)]
        if absent := sorted(set(self.groups) - set(status["online"]) - set(status["devices"])):
            lines.append(Text(f"offline, not in this round: {listing(absent, 10)}"))
        return Group(*lines)

    # --------------------------------------------------------------------------------- the file
    def status(self, **extra) -> dict:
        online = set(self.online())
        snapshot = self.activity.snapshot()
        return {**self.base, "updated": time.time(), "finished": False, "outcome": None, **snapshot,
                "online": sorted(online & set(self.groups)), "unexpected": sorted(online - set(self.groups)),
                "last_round": self.last_round, **extra}

    def write(self, **extra) -> None:
        """The status file, whole (a reader never sees half of it); one that cannot be written (a full disk)
        is said once and tried again at the next change: the run itself stops on its own writes."""
        with self._writing:
            try:
                write_atomic(self.path, (json.dumps(self.status(**extra), indent=1) + "\n").encode(), durable=False)
                self._unwritten = False
            except StorageError as exc:
                if not self._unwritten:
                    self.console.print(f"warning: {exc}", markup=False, highlight=False)
                self._unwritten = True
