"""A Ray cluster on this machine for tests and benchmarks: a head and more nodes (`ray start`, each with its
CPU count, own temp dir and ports), every node in the foreground (`--block`) as a child of the caller, so
that stopping their process trees stops exactly this cluster (`ray stop` stops every Ray on the machine,
other runs' included). `nodes` gives the `ray start` processes (the roots of the cluster's process trees).
The cluster uses Ray's token authentication with a token of its own: a driver connects with the
environment `ray_cluster` yields beside the address."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from proctree import stop_tree

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive_nodes(address: str, env: dict) -> int:
    script = "import ray; ray.init(address=%r, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
    r = subprocess.run([sys.executable, "-c", script % address], capture_output=True, text=True, env=env, timeout=120)
    return int(r.stdout.split()[-1]) if r.returncode == 0 and r.stdout.split() else 0


@contextmanager
def ray_cluster(cpus: list[int], start_s: float = 180.0, object_store_bytes: int = 200 * 2**20,
                nodes: list | None = None) -> Iterator[tuple[str, dict]]:
    """(HOST:PORT, environment for a driver) of a cluster whose i-th node has cpus[i] CPUs (the first is the
    head); each node must join within `start_s`. `nodes`, when given, receives the `ray start` processes."""
    port, temp = free_port(), tempfile.mkdtemp(prefix="edgefl-ray-")   # short: Ray's socket paths must fit
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    address, started, logs = f"127.0.0.1:{port}", [] if nodes is None else nodes, []
    try:
        for i, n in enumerate(cpus):
            where = (["--head", "--port", str(port), "--temp-dir", temp, "--include-dashboard", "false",
                      "--dashboard-port", str(free_port())] if i == 0 else ["--address", address])
            logs.append(open(Path(temp) / f"node{i}.log", "w"))
            started.append(subprocess.Popen(
                [str(RAY), "start", *where, "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(n),
                 "--num-gpus", "0", "--object-store-memory", str(object_store_bytes), "--disable-usage-stats",
                 "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())],
                stdout=logs[-1], stderr=subprocess.STDOUT, env=env))
            deadline = time.monotonic() + start_s
            while alive_nodes(address, env) < i + 1:
                if time.monotonic() > deadline or started[-1].poll() is not None:
                    log = (Path(temp) / f"node{i}.log").read_text()[-3000:]
                    raise RuntimeError(f"Ray node {i} did not join within {start_s:.0f} s: {log}")
                time.sleep(1)
        yield address, env
    finally:
        for node in reversed(started):
            stop_tree(node.pid, timeout=3.0)
        for log in logs:
            log.close()
        shutil.rmtree(temp, ignore_errors=True)
