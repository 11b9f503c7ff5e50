"""One login per device and one for the coordinator, kept in `credentials/<id>.json` (edgefl.credentials:
the file `--credentials` of the coordinator and of `edgefl-device` reads), mode 0600. Re-running keeps
every existing password unless asked to rotate: a device already provisioned must not be locked out by a
config change."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgefl.broker.files import write_file
from edgefl.broker.passwords import new_password
from edgefl.credentials import Credentials, read_credentials
from edgefl.errors import ConfigError


@dataclass
class CredentialChanges:
    new: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)   # files of ids no longer in the fleet: their login is revoked


def sync_credentials(folder: Path, users: list[str], rotate: bool) -> tuple[dict[str, str], CredentialChanges]:
    """user -> password for exactly `users`: existing ones kept (all new when `rotate`), missing ones
    generated, files of users not listed removed."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    changes, passwords = CredentialChanges(), {}
    for user in users:
        path = folder / f"{user}.json"
        if path.exists() and not rotate:
            stored = read_credentials(path)
            if stored.username != user:
                raise ConfigError(f"{path}: holds the login of {stored.username!r}, not {user!r}; "
                                  "delete it to issue this device a new password")
            passwords[user] = stored.password
            changes.kept.append(user)
            continue
        (changes.rotated if path.exists() else changes.new).append(user)
        passwords[user] = new_password()
        write_file(path, Credentials(user, passwords[user]).to_json(), private=True)
    listed = set(users)
    for path in sorted(folder.glob("*.json")):
        if path.stem not in listed:
            path.unlink()
            changes.removed.append(path.stem)
    return passwords, changes
