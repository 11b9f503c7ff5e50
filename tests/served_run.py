"""A served run end to end, as an operator starts one: a real mosquitto, `edgefl fleet up` (one
`edgefl-device` process per device), `edgefl serve`; each a real process, stopped after."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from mosquitto import Mosquitto

DATASET = ["--dataset", "fashion-mnist"]
FLEET = "fleet"      # ServedRun(agent=FLEET): each group's agent as its fleet entry says (no --agent)


def edgefl(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgefl", *args]


def write_plan(folder: Path, fleet_text: str, method: str, rounds: int, model: str = "cnn",
               *extra: str) -> tuple[Path, Path]:
    """`extra`: more options of `edgefl plan` (--input-shape)."""
    fleet, plan = folder / "fleet.yaml", folder / "plan.json"
    fleet.write_text(fleet_text)
    r = subprocess.run(edgefl("plan", "--devices", str(fleet), "--model", model, "--method", method, "--rounds",
                              str(rounds), "--format", "json", "-o", str(plan), *extra), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return fleet, plan


class ServedRun:
    """Broker + fleet of device agents for one test; `serve(...)` runs (or starts) the coordinator."""

    def __init__(self, folder: Path, fleet: Path, plan: Path, train_limit: int = 1200, seed: int = 0,
                 fleet_options: tuple[str, ...] = (), cache_budget: Optional[str] = None, agent: Optional[str] = None,
                 env: Optional[dict] = None):
        """`fleet_options`: more options of `edgefl fleet up` (--enforce-memory); `cache_budget`: each agent's
        --cache-budget; `agent`: python | native (`edgefl fleet up --agent`: the native agent for ExecuTorch
        groups) or FLEET (no --agent: each group's own, as its fleet entry says); default $EDGEFL_TEST_AGENT or
        python, so a suite of served runs (the fault suite) runs with either kind unchanged. `env`: the
        environment of `fleet up` and its agents (default this process's)."""
        self.folder, self.fleet, self.plan, self.seed = folder, fleet, plan, seed
        self.train_limit, self.fleet_options, self.cache_budget = train_limit, fleet_options, cache_budget
        self.agent = agent or os.environ.get("EDGEFL_TEST_AGENT", "python")
        self.env = env
        self.broker = Mosquitto(folder / "broker", persistence=True)
        self.devices: Optional[subprocess.Popen] = None

    def __enter__(self) -> "ServedRun":
        self.broker.start()
        self.devices = subprocess.Popen(
            edgefl("fleet", "up", "--devices", str(self.fleet), "--broker", self.broker.url, *DATASET,
                   "--train-limit", str(self.train_limit), "--seed", str(self.seed),
                   "--workdir", str(self.folder / "fleet"), *(() if self.agent == FLEET else ("--agent", self.agent)),
                   *self.fleet_options, *(("--cache-budget", self.cache_budget) if self.cache_budget else ())),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=self.env)
        return self

    def serve_command(self, state: Path, rounds: int, *extra: str) -> list[str]:
        return edgefl("serve", "--plan", str(self.plan), "--broker", self.broker.url, "--state", str(state),
                      "--rounds", str(rounds), "--devices", str(self.fleet), "--seed", str(self.seed),
                      "--wait-online", "120", *extra)

    def serve(self, state: Path, rounds: int, *extra: str, timeout: float = 600) -> dict:
        r = subprocess.run(self.serve_command(state, rounds, *extra), capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{self.logs()}"
        return json.loads((state / "history.json").read_text())

    def logs(self) -> str:
        folder = self.folder / "fleet" / "logs"
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(folder.glob("*.log"))) \
            if folder.exists() else ""

    def device_pids(self) -> dict[str, int]:
        """Device id -> pid of its agent (children of `fleet up`). An agent that is starting its training
        child has, between fork and exec, a second process with its very command line: that one is the
        agent's child and is left out (killing it would fail the training, not the agent)."""
        found: dict[int, tuple[str, int]] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            agent = b"edgefl.device_runtime.cli" in argv or argv[0].endswith(b"/edgefl-device")
            if agent and b"--id" in argv and str(self.broker.port).encode() in b" ".join(argv):
                found[int(pid)] = (argv[argv.index(b"--id") + 1].decode(), parent)
        return {device: pid for pid, (device, parent) in found.items() if parent not in found}

    def __exit__(self, *exc) -> None:
        if self.devices is not None and self.devices.poll() is None:
            os.killpg(self.devices.pid, signal.SIGTERM)
            try:
                self.devices.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.devices.pid, signal.SIGKILL)
                self.devices.wait()
        self.broker.stop()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def fill_disk(folder: Path) -> Path:
    """Fill the file system under `folder` to the last byte (MiBs, then 4 KiB blocks); the filler file."""
    import contextlib

    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for block in (2**20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * block)
    return filler
