"""A device's training process dies with the agent that started it: killed with SIGKILL, an agent cannot
stop its child, so the child must not keep training (and holding memory) as an orphan. Real processes:
an agent stand-in starts the child through the spawn function the agent uses, then is killed."""
import os
import signal
import subprocess
import sys
import time

import pytest

AGENT = """
import sys
from edgefl.device_runtime.child import run_process
from edgefl.device_runtime.memcap import MemoryCap
cap = MemoryCap(2 * 2**30, "edgefl-test") if sys.argv[2] == "cap" else None
child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
try:
    run_process([sys.executable, "-c", child, sys.argv[1]], 1, None, cap)
finally:
    if cap is not None:
        cap.close()
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("cap", ["none", "cap"])
def test_the_training_child_dies_with_its_agent(cap, tmp_path):
    pid_file = tmp_path / "child.pid"
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(pid_file), cap])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        assert agent.poll() is None, "the agent stand-in exited early"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child)
    try:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the training child outlived its agent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
