"""A login file: `{"username": ..., "password": ...}` (mode 0600), one per device and one for the coordinator,
as `edgefl broker config` writes them under `credentials/<id>.json`; `--credentials` of `edgefl serve` and of
`edgefl-device` reads one. The broker's own tooling and both ends of the protocol read them here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgefl.errors import ConfigError

FIELDS = ("username", "password")


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print a password
        return f"Credentials(username={self.username!r})"

    def to_json(self) -> str:
        return json.dumps({"username": self.username, "password": self.password}, indent=2) + "\n"


def read_credentials(path: str | Path, option: Optional[str] = None) -> Credentials:
    """The login in `path`; a missing, unreadable or malformed file is a ConfigError naming it (and the
    option that named it, when one did)."""
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the credentials file ({exc.strerror})") from None
    except ValueError:
        data = None
    if (not isinstance(data, dict) or set(data) != set(FIELDS)
            or not all(isinstance(v, str) and v for v in data.values())):
        raise ConfigError(f"{where}: expected a JSON object with exactly the string keys 'username' and 'password' "
                          "(as 'edgefl broker config' writes them); restore it from a backup, or delete it and run "
                          "'edgefl broker config' again to issue a new password")
    return Credentials(data["username"], data["password"])
