"""A real mosquitto for broker tests: a deployment folder written by `edgefl broker config`, mosquitto
started from inside it on a free loopback port (unlike tests/mosquitto.py, which writes its own config),
and small paho clients that log in with its credentials."""
from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from mosquitto import free_port, mosquitto_path  # noqa: F401  (tests/mosquitto.py; re-exported)


def edgefl(*args, cwd=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "edgefl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def write_fleet(folder: Path, ids: list[str]) -> Path:
    path = folder / "fleet.yaml"
    path.write_text("fleet:\n  name: test\n  groups:\n    lab:\n"
                    f"      ids: [{', '.join(ids)}]\n      memory_budget: 512MiB\n")
    return path


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.02)
    raise AssertionError(f"broker did not open port {port} within {timeout} s")


@contextlib.contextmanager
def running(argv: list[str], cwd: Path, port: int):
    """Run a broker command until the block ends; yields the process (stdout+stderr in proc.stdout)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def credentials(folder: Path, user: str) -> dict:
    return json.loads((folder / "credentials" / f"{user}.json").read_text())


class Client:
    """A paho client that records every message it receives and waits for CONNACK and SUBACK."""

    def __init__(self, port: int, username: str | None, password: str | None, *, ca: Path | None = None,
                 tls_default_cas: bool = False, will: str | None = None,
                 protocol=mqtt.MQTTv5, client_id: str | None = None):
        self.port = port
        self.inbox: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.acks: queue.Queue = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"t-{username}-{id(self)}",
                             protocol=protocol)
        if username is not None:
            self.c.username_pw_set(username, password)
        if ca is not None:
            self.c.tls_set(ca_certs=str(ca))
        elif tls_default_cas:
            self.c.tls_set()
        if will is not None:
            self.c.will_set(will, b"offline", qos=1)
        self.c.on_connect = lambda c, u, flags, rc, props=None: self.connack.put(rc)
        # a connection the broker drops before CONNACK reports here, not as a silent timeout
        self.c.on_disconnect = lambda c, u, flags, rc, props=None: self.connack.put(rc)
        self.c.on_message = lambda c, u, msg: self.inbox.put((msg.topic, msg.payload))
        self.c.on_subscribe = lambda c, u, mid, rcs, props=None: self.acks.put(rcs)

    def connect(self, timeout: float = 5.0):
        """The CONNACK reason code; a refused client is stopped (paho would otherwise retry forever)."""
        self.c.connect("127.0.0.1", self.port)
        self.c.loop_start()
        rc = self.connack.get(timeout=timeout)
        if rc.is_failure:
            self.close()
        return rc

    def subscribe(self, *filters: str, timeout: float = 5.0):
        self.c.subscribe([(f, 1) for f in filters])
        return self.acks.get(timeout=timeout)

    def publish(self, topic: str, payload: bytes, timeout: float = 5.0) -> None:
        self.c.publish(topic, payload, qos=1).wait_for_publish(timeout)

    def wait_for(self, topic: str, payload: bytes, timeout: float = 5.0) -> list[tuple[str, bytes]]:
        """Everything received up to and including (topic, payload); fails if it does not come."""
        seen = []
        deadline = time.monotonic() + timeout
        while (topic, payload) not in seen:
            seen.append(self.inbox.get(timeout=max(0.0, deadline - time.monotonic())))
        return seen

    def drop(self) -> None:
        """Vanish without DISCONNECT, as a crashed device does: the broker publishes the last will."""
        self.c.loop_stop()
        self.c.socket().shutdown(socket.SHUT_RDWR)
        self.c.socket().close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.c.disconnect()
        self.c.loop_stop()
