"""`rose cluster certs DIR`: a CA and one certificate per Dask role, for TLS between the
scheduler, its workers and ROSE's clients (distributed's mutual TLS: each side checks the other's
certificate against the CA). Made with the `cryptography` package; nothing hand-rolled.

Roles differ by extended key usage, which OpenSSL checks in the handshake: the scheduler and
workers both listen and connect (server + client auth), a client only connects (client auth),
so a client's certificate cannot stand in for a scheduler or a worker.
"""
from __future__ import annotations

import datetime as dt
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from coordination.errors import StackError
from storage.atomic import atomic_path

ROLES = ("scheduler", "worker", "client")
_USAGES = {"scheduler": [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
           "worker": [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
           "client": [ExtendedKeyUsageOID.CLIENT_AUTH]}
KEY_MODE, CERT_MODE = 0o600, 0o644


@dataclass(frozen=True)
class CertFiles:
    """Where `rose cluster certs DIR` puts each file: ca.pem, ca-key.pem, <role>.pem, <role>-key.pem."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def cert(self, role: str) -> Path:
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        return self.directory / f"{role}-key.pem"

    def all(self) -> list[Path]:
        return [self.ca, self.key("ca"), *(p for r in ROLES for p in (self.cert(r), self.key(r)))]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ROSE Dask cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey, days: int,
                 usages: list[x509.ObjectIdentifier] | None) -> x509.Certificate:
    """The CA's self-signed certificate (issuer None, usages None), else a leaf signed by it."""
    now = dt.datetime.now(dt.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject))
               .issuer_name(issuer.subject if issuer else _name(subject))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))  # clocks of the hosts differ a little
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
               .add_extension(ski, critical=False))
    if issuer is None:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = (builder
                   .add_extension(x509.KeyUsage(
                       digital_signature=True, content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, key_cert_sign=False,
                       crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages or []), critical=False)
                   # a name, not a host: distributed checks no host name (addresses change), but
                   # RFC 5280 path validators want a subject alternative name on every leaf
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       issuer_key.public_key()), critical=False))
    return builder.sign(issuer_key, hashes.SHA256())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_key_or_cert(tmp: Path, data: bytes, mode: int) -> None:
    """Create `tmp` with `mode` from the start (a key is never readable by others, not even for
    a moment, whatever the umask)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)


def make_certs(directory: Path, *, days: int = 365, force: bool = False) -> CertFiles:
    """A CA and a certificate + key per role in `directory`, each valid `days` days.

    Refuses, writing nothing, when any of the files exists, unless `force`: replacing the CA
    invalidates every certificate it signed before."""
    if days < 1:
        raise StackError(f"--days must be at least 1, got {days}")
    files = CertFiles(Path(directory).expanduser().resolve())
    existing = [p.name for p in files.all() if p.exists()]
    if existing and not force:
        raise StackError(f"{files.directory} already holds {', '.join(existing)}: not overwritten "
                         "(--force replaces them all; certificates from the old CA stop working)")
    files.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("ROSE Dask CA", ca_key, None, ca_key, days, None)
    out = {files.ca: (_cert_pem(ca), CERT_MODE), files.key("ca"): (_key_pem(ca_key), KEY_MODE)}
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"rose-dask-{role}", key, ca, ca_key, days, _USAGES[role])
        out[files.cert(role)] = (_cert_pem(cert), CERT_MODE)
        out[files.key(role)] = (_key_pem(key), KEY_MODE)
    # every file written aside first (storage.atomic), renamed only when all are written: a
    # failure leaves the old set whole
    with ExitStack() as stack:
        for path, (data, mode) in out.items():
            _write_key_or_cert(stack.enter_context(atomic_path(path)), data, mode)
    return files


def usage(files: CertFiles, head: str = "$HEAD", port: int = 8786) -> str:
    """The commands and run-config lines that use these files (printed by `rose cluster certs`)."""
    d = files

    def tls(role: str) -> str:
        return f"--tls-ca-file {d.ca} --tls-cert {d.cert(role)} --tls-key {d.key(role)}"

    return "\n".join([
        "# the scheduler (head machine):",
        f"dask scheduler --protocol tls --host 0.0.0.0 --port {port} {tls('scheduler')}",
        "# each worker (plus its --name, --resources ... of docs/cluster.md):",
        f"dask worker tls://{head}:{port} {tls('worker')}",
        "# the run config of `rose up` / `rose train` (-c FILE):",
        "stack:",
        f"  dask_scheduler: tls://{head}:{port}",
        "  dask_tls:",
        f"    ca_file: {d.ca}",
        f"    cert_file: {d.cert('client')}",
        f"    key_file: {d.key('client')}",
    ])
