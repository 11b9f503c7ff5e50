"""A private CA and a server certificate it signs, for the broker's TLS listener. Clients need only the
CA certificate (`tls/ca.crt`); the CA key stays beside it (mode 0600) so the server certificate can be
reissued for other host names without re-provisioning every device.

Imported only when TLS is asked for: `cryptography` is slow to import.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgefl.errors import ConfigError

CA_DAYS = 3650
SERVER_DAYS = 825       # the longest server-certificate life common TLS clients accept
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.crt", "server.key"


_HOST_NAME = re.compile(r"[A-Za-z0-9*]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        if not _HOST_NAME.fullmatch(host) or len(host) > 253:
            raise ConfigError(f"--host {host!r}: not an IP address or a host name (letters, digits, '-', '.'; "
                              "an internationalised name in its xn-- form)") from None
        return x509.DNSName(host)


def check_hosts(hosts: list[str]) -> list[str]:
    """The names the server certificate will cover, each checked before anything is written."""
    for host in hosts:
        _general_name(host)
    return hosts


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _sign(subject: x509.Name, issuer: x509.Name, public_key, signing_key, days: int, extensions) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days)))
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _new_ca(folder: Path, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"edgefl broker CA ({name})")])
    usage = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False)
    cert = _sign(subject, subject, key.public_key(), key, CA_DAYS, [
        (x509.BasicConstraints(ca=True, path_length=0), True), (usage, True),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)])
    _write_private(folder / CA_KEY, key)
    _write_cert(folder / CA_CERT, cert)


def _covered_hosts(folder: Path) -> list[str] | None:
    """The names the existing server certificate covers, or None when there is none."""
    if not (folder / SERVER_CERT).exists() or not (folder / SERVER_KEY).exists():
        return None
    cert = x509.load_pem_x509_certificate((folder / SERVER_CERT).read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sorted(str(v) for kind in (x509.DNSName, x509.IPAddress) for v in san.get_values_for_type(kind))


def _new_server(folder: Path, hosts: list[str]) -> None:
    try:
        ca_key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder / CA_KEY}: cannot load the CA to sign a new server certificate ({exc}); "
                          f"restore it, or delete {folder} to start a new CA (clients then need the new "
                          f"{CA_CERT})") from None
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]), ca_cert.subject,
                 key.public_key(), ca_key, SERVER_DAYS, [
                     (x509.BasicConstraints(ca=False, path_length=None), True),
                     (x509.SubjectAlternativeName([_general_name(h) for h in hosts]), False),
                     (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
                     (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)])
    _write_private(folder / SERVER_KEY, key)
    _write_cert(folder / SERVER_CERT, cert)


def ensure_tls(folder: Path, hosts: list[str], name: str) -> list[str]:
    """Create the CA if there is none, and a server certificate for `hosts` unless one signed by this CA
    already covers exactly them. Returns one line per file set: what was created or kept."""
    folder.mkdir(parents=True, exist_ok=True)
    new_ca = not (folder / CA_CERT).exists()
    if new_ca:
        _new_ca(folder, name)
    wanted = sorted(str(_general_name(h).value) for h in hosts)
    reissue = new_ca or _covered_hosts(folder) != wanted
    if reissue:
        _new_server(folder, hosts)
    return [f"{'new' if new_ca else 'kept'} CA certificate {folder / CA_CERT} (every client needs this file)",
            f"{'new' if reissue else 'kept'} server certificate {folder / SERVER_CERT} for {', '.join(hosts)}"]
