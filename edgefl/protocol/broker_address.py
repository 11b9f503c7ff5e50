"""Where the broker is: `mqtt://HOST[:PORT]` or `mqtts://HOST[:PORT]` (TLS, checked against a CA file or the
system's CAs). How to log in there is a credentials file (edgefl.credentials)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from edgefl.errors import ConfigError

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str, option: str = "--broker") -> BrokerAddress:
    hint = f"{option} {url!r}: expected mqtt://HOST:PORT or mqtts://HOST:PORT (TLS)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigError(f"{hint}; the port is not a number in 1-65535") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise ConfigError(f"{hint}; the scheme is {parts.scheme or 'missing'!r}")
    if not parts.hostname:
        raise ConfigError(f"{hint}; the host is missing")
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise ConfigError(f"{hint}; put the login in a --credentials file, not in the URL")
    return BrokerAddress(parts.hostname, port or DEFAULT_PORTS[parts.scheme], parts.scheme == "mqtts")


def check_ca_file(path: Optional[str | Path], address: BrokerAddress) -> Optional[Path]:
    if path is None:
        return None
    path = Path(path)
    if not address.tls:
        raise ConfigError(f"--ca-file {path}: given for {address.url}, which is not TLS; use mqtts://")
    if not path.is_file():
        raise ConfigError(f"--ca-file {path}: no such file (the broker's CA certificate, PEM)")
    return path
