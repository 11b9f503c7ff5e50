"""`edgefl broker up`: run mosquitto on a generated deployment folder, or the embedded Python broker
when mosquitto is not installed; in the foreground, stopping cleanly on Ctrl-C or SIGTERM."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from edgefl.broker.mosquitto_conf import read_conf
from edgefl.errors import require

# sbin is not on an unprivileged user's PATH on Debian, where the package installs the broker
_SBIN = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")

EMBEDDED_WARNING = """\
*** edgefl: starting the EMBEDDED PYTHON BROKER (amqtt), {why}.
*** For one machine or a trusted network only: it enforces the logins and the ACL of this folder but
*** has no packet size limit (one oversized upload can exhaust its memory, which holds ~12x every
*** payload), keeps sessions in memory only (a restart loses queued messages) and is 2-3x slower than
*** mosquitto. It speaks MQTT 3.1.1 only: edgefl serve and edgefl-device fall back to it (a few seconds
*** more per connect), without the broker's refusal of a device's wrong login or its packet size limit.
*** Install mosquitto (apt install mosquitto) for anything else."""


def find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or next((p for p in _SBIN if os.access(p, os.X_OK)), None)


def broker_command(folder: Path, embedded: bool) -> tuple[list[str], str]:
    """The command that serves `folder` (run from inside it), and which broker it is."""
    read_conf(folder / "mosquitto.conf")   # fail here, in one line, when the folder holds no deployment
    mosquitto = None if embedded else find_mosquitto()
    if mosquitto:
        return [mosquitto, "-c", "mosquitto.conf"], "mosquitto"
    require("amqtt", "broker")
    return [sys.executable, "-m", "edgefl.broker.embedded", "."], "embedded"


def run_foreground(argv: list[str], cwd: Path) -> int:
    """Run the broker as a child in its own session and pass it SIGINT/SIGTERM (stop) and SIGHUP (reload
    logins and ACL): the child gets each signal exactly once, however it was sent. Returns its exit
    status, 128 + N when a signal N ended it."""
    child = subprocess.Popen(argv, cwd=cwd, start_new_session=True)

    def forward(signum, _frame):
        child.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in handled}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code
