"""A real mosquitto for transport tests and benchmarks: started on a free loopback port with a config
generated in a temporary folder (optionally a packet size limit, logins, TLS, persistence), stopped
after. Use the `mosquitto` fixture or `Mosquitto(folder, ...)` as a context manager."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

SBIN = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def mosquitto_path() -> str:
    found = shutil.which("mosquitto") or next((p for p in SBIN if os.access(p, os.X_OK)), None)
    assert found, "these tests need a real mosquitto broker: apt-get install -y mosquitto mosquitto-clients"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto:
    def __init__(self, folder: Path, *, max_packet_size: Optional[int] = None, logins: Optional[dict] = None,
                 tls: bool = False, persistence: bool = False, extra: str = ""):
        """`logins`: username -> password (anonymous access is then refused); `tls`: serve mqtts with a
        CA made here (`ca_file`)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls
        self.ca_file: Optional[Path] = None
        lines = [f"listener {self.port} 127.0.0.1",
                 # as root mosquitto would switch to user 'mosquitto', which cannot read this folder
                 f"user {pwd.getpwuid(os.getuid()).pw_name}",
                 f"log_dest file {self.folder / 'mosquitto.log'}", "log_type error", "log_type warning",
                 "log_type notice", f"persistence {'true' if persistence else 'false'}",
                 f"persistence_location {self.folder}/", "autosave_interval 1"]
        if max_packet_size:
            lines.append(f"max_packet_size {max_packet_size}")
        if logins:
            passwords = self.folder / "passwords"
            passwords.write_text("".join(f"{u}:{p}\n" for u, p in logins.items()))
            subprocess.run([shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd", "-U", str(passwords)],
                           check=True, capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            self.ca_file, cert, key = make_tls(self.folder)
            lines += [f"cafile {self.ca_file}", f"certfile {cert}", f"keyfile {key}"]
        self.conf = self.folder / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n" + extra)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"{'mqtts://localhost' if self.tls else 'mqtt://127.0.0.1'}:{self.port}"

    def start(self) -> "Mosquitto":
        self.proc = subprocess.Popen([mosquitto_path(), "-c", str(self.conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"mosquitto exited with {self.proc.returncode}: {self.proc.stdout.read()}"
                                     f"{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return self
            time.sleep(0.02)
        raise AssertionError(f"mosquitto did not open port {self.port} within 10 s: {self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        path = self.folder / "mosquitto.log"
        return path.read_text() if path.exists() else ""

    def __enter__(self) -> "Mosquitto":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture
def mosquitto(tmp_path):
    with Mosquitto(tmp_path / "broker") as broker:
        yield broker


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for localhost / 127.0.0.1 (cryptography, EC P-256)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, issuer, public_key, signing_key, extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1)))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical)
        return b.sign(signing_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgefl test CA")])
    ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key, [(x509.BasicConstraints(ca=True, path_length=0), True)])
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), ca_name, key.public_key(), ca_key,
                  [(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                 x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)])
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def write_credentials(path: Path, username: str, password: str) -> Path:
    path.write_text(json.dumps({"username": username, "password": password}))
    return path
