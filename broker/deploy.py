"""`edgefl broker config`: a mosquitto 2.x deployment folder for a fleet.

    DIR/mosquitto.conf          listener, logins + ACL required, packet limit, persistence
    DIR/passwd, DIR/acl         one login per device and the coordinator; who may touch which topics
    DIR/credentials/<id>.json   each login in clear, for the device (or coordinator) it belongs to
    DIR/tls/                    CA and server certificate (with --tls); clients need tls/ca.crt
    DIR/data/                   mosquitto's persistence store
    DIR/edgefl-broker.service, DIR/docker-compose.yml
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Mapping

from edgefl.broker.acl import fleet_acl, render_acl
from edgefl.broker.credentials import CredentialChanges, sync_credentials
from edgefl.broker.files import owner, unignored_in_git, write_file
from edgefl.broker.launch import find_mosquitto
from edgefl.broker.mosquitto_conf import (ACL_FILE, DATA_DIR, PASSWORD_FILE, TLS_DIR, ListenerSettings, check_port,
                                          packet_limit, render_conf)
from edgefl.broker.passwords import hash_password, parse_password_file, render_password_file, verify_password
from edgefl.broker.services import COMPOSE_FILE, UNIT_FILE, compose_file, systemd_unit
from edgefl.errors import ConfigError, require

CONF_FILE = "mosquitto.conf"
CREDENTIALS_DIR = "credentials"


def default_hosts(bind: str | None) -> list[str]:
    """Names a client on this machine or the network may dial: loopback, this host, the bound address."""
    hosts = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    if bind and bind not in ("0.0.0.0", "::"):
        hosts.append(bind)
    return list(dict.fromkeys(h for h in hosts if h))


def _password_hashes(folder: Path, passwords: dict[str, str]) -> dict[str, str]:
    """Hashes for `passwords`, reusing the file's existing hash of an unchanged password so a re-run
    leaves the file byte-identical."""
    try:
        old = parse_password_file((folder / PASSWORD_FILE).read_text())
    except OSError:
        old = {}
    return {user: old[user] if user in old and verify_password(pw, old[user]) else hash_password(pw)
            for user, pw in passwords.items()}


def _credential_line(changes: CredentialChanges, folder: Path) -> str:
    parts = [f"{len(v)} {k}" for k, v in vars(changes).items() if v]
    line = f"credentials {folder / CREDENTIALS_DIR}/<id>.json: {', '.join(parts)}"
    if changes.removed:
        shown = ", ".join(changes.removed[:5]) + (", ..." if len(changes.removed) > 5 else "")
        line += f" (logins of devices no longer in the fleet revoked: {shown})"
    return line


def write_deployment(folder: Path, fleet_name: str, device_ids: list[str], *, port: int | None = None,
                     bind: str | None = None, tls: bool = False, hosts: list[str] | None = None,
                     largest_transfer: int | None = None, max_packet_size: int | None = None,
                     rotate: bool = False, groups: Mapping[str, str] | None = None) -> list[str]:
    """Write (or update) the deployment in `folder`; returns one line per thing written or kept. `groups`:
    device -> its fleet group, whose shared topics the device may read."""
    acl = fleet_acl(device_ids, groups)
    if bind is not None and (not bind or any(c.isspace() or not c.isprintable() for c in bind)):
        raise ConfigError(f"--bind {bind!r}: give one IP address or host name to listen on, or leave it out")
    listener = ListenerSettings(check_port(port if port is not None else (8883 if tls else 1883)), bind, tls)
    limit = packet_limit(device_ids, largest_transfer, max_packet_size)
    tls_hosts = None
    if tls:      # checked before anything is written; cryptography is imported only when TLS is asked for
        require("cryptography", "broker")
        from edgefl.broker.tls import check_hosts
        tls_hosts = check_hosts(hosts or default_hosts(bind))
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"-o {folder}: exists and is not a folder; choose another output folder")
    try:
        return _write(folder, fleet_name, acl, listener, limit, tls_hosts, rotate)
    except PermissionError as exc:
        raise ConfigError(f"{exc.filename}: cannot write ({exc.strerror}); choose an output folder you own") from None


def _write(folder, fleet_name, acl, listener, limit, tls_hosts, rotate) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    passwords, changes = sync_credentials(folder / CREDENTIALS_DIR, list(acl), rotate)
    lines = []

    def put(name: str, text: str, private: bool = False, note: str = "") -> None:
        changed = write_file(folder / name, text, private)
        lines.append(f"{'wrote' if changed else 'unchanged'} {folder / name}{note}")

    put(PASSWORD_FILE, render_password_file(_password_hashes(folder, passwords)), private=True,
        note=f" ({len(passwords)} logins: the coordinator and {len(passwords) - 1} devices)")
    put(ACL_FILE, render_acl(acl), private=True)
    tls_lines = []
    if tls_hosts:
        from edgefl.broker.tls import ensure_tls
        tls_lines = ensure_tls(folder / TLS_DIR, tls_hosts, fleet_name)
    (folder / DATA_DIR).mkdir(mode=0o700, exist_ok=True)
    devices = len(acl) - 1
    user = owner()[0]
    put(CONF_FILE, render_conf(listener, limit, devices, user),
        note=f" (port {listener.port}{', TLS' if listener.tls else ''}; max_packet_size {limit.bytes}: {limit.why})")
    put(UNIT_FILE, systemd_unit(folder, find_mosquitto() or "/usr/sbin/mosquitto", fleet_name, devices))
    put(COMPOSE_FILE, compose_file(devices))
    lines += tls_lines + [_credential_line(changes, folder)]
    if os.getuid() == 0:
        lines.append("note: these files belong to root, so the broker runs as root; write them as an "
                     "unprivileged user (e.g. mosquitto) to run it without root")
    if (tree := unignored_in_git(folder, folder / PASSWORD_FILE)) is not None:
        keys = " and the TLS keys" if (folder / TLS_DIR).is_dir() else ""
        lines.append(f"warning: {folder} holds every login{keys} inside the git work tree {tree}, which does not "
                     f"ignore it: add '/{os.path.relpath(folder.resolve(), tree)}/' to {tree}/.gitignore before 'git add'")
    return lines
