"""A private CA and the certificates it signs, written as PEM files for TLS tests: a
server certificate for 127.0.0.1 and a client certificate, as an operator's own CA
would issue them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    client: Issued

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server.cert, self.server.key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca.cert)
        return context


def make_pki(directory: Path, name: str = "test") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca_cert = (_builder(ca_name, ca_name, ca_key)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(
                   digital_signature=True, key_cert_sign=True, crl_sign=True,
                   content_commitment=False, key_encipherment=False, data_encipherment=False,
                   key_agreement=False, encipher_only=False, decipher_only=False),
                   critical=True)
               .sign(ca_key, hashes.SHA256()))
    ca = _write(directory / f"{name}-ca", ca_cert, ca_key)
    server = _issue(directory / f"{name}-server", "127.0.0.1", ca_cert, ca_key,
                    ExtendedKeyUsageOID.SERVER_AUTH,
                    x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(
                        "127.0.0.1"))]))
    client = _issue(directory / f"{name}-client", "evagg-agent", ca_cert, ca_key,
                    ExtendedKeyUsageOID.CLIENT_AUTH, None)
    return Pki(ca, server, client)


def _builder(subject: x509.Name, issuer: x509.Name,
             key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1)))


def _issue(stem: Path, common_name: str, ca_cert: x509.Certificate,
           ca_key: ec.EllipticCurvePrivateKey, usage: x509.ObjectIdentifier,
           names: x509.SubjectAlternativeName | None) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (_builder(subject, ca_cert.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if names is not None:
        builder = builder.add_extension(names, critical=False)
    return _write(stem, builder.sign(ca_key, hashes.SHA256()), key)


def _write(stem: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Issued(cert_path, key_path)
