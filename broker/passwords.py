"""Passwords in mosquitto's own file format: `user:$7$<iterations>$<salt>$<hash>`, PBKDF2-HMAC-SHA512
with a 12-byte salt and a 64-byte hash, both base64 — what `mosquitto_passwd` 2.0 writes and reads."""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

# mosquitto_passwd's default. The passwords are 192-bit random tokens, not words a person chose, so
# key stretching buys no security here; it would only slow every device's connect.
ITERATIONS = 101
_SALT_BYTES = 12
_HASH_BYTES = 64


def new_password() -> str:
    """A 192-bit random password, URL-safe so it survives shells, JSON and env files unquoted."""
    return secrets.token_urlsafe(24)


def hash_password(password: str, iterations: int = ITERATIONS) -> str:
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, _HASH_BYTES)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, hashed: str) -> bool:
    """True when `hashed` is a `$7$` hash of `password`; any other or malformed hash is False."""
    parts = hashed.split("$")
    if len(parts) != 5 or parts[:2] != ["", "7"] or not (parts[2].isascii() and parts[2].isdigit()):
        return False
    try:
        salt, expected = base64.b64decode(parts[3], validate=True), base64.b64decode(parts[4], validate=True)
    except ValueError:
        return False
    if not expected or int(parts[2]) < 1:
        return False
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(parts[2]), len(expected))
    return hmac.compare_digest(digest, expected)


def render_password_file(hashes: dict[str, str]) -> str:
    return "".join(f"{user}:{hashed}\n" for user, hashed in hashes.items())


def parse_password_file(text: str) -> dict[str, str]:
    """user -> hash; lines that are not `user:hash` are skipped (mosquitto skips them too)."""
    out = {}
    for line in text.splitlines():
        user, sep, hashed = line.strip().partition(":")
        if sep and user and not user.startswith("#"):
            out[user] = hashed
    return out
