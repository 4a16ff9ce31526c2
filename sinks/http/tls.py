"""TLS for the HTTP sink (and `evagg dlq replay`): a private CA, a client certificate, or
no verification at all, as Vector's and the OpenTelemetry Collector's `tls` options do.

The context is built when the sink is built, so `evagg check-config` and the agent's
start refuse a missing file, a file that is not PEM, or a key that does not match its
certificate, with the key of the option that names it; a request never finds out first.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from sinks.http.endpoint import HttpSinkConfigError


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """The sink's `tls_*` options. `ca_file` replaces the system's CAs (trust exactly the
    private CA that signed the endpoint); `cert_file` (with `key_file` when the key is a
    separate file) is presented to endpoints that ask for a client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    @property
    def is_default(self) -> bool:
        return self == TlsOptions()


def client_ssl(options: TlsOptions) -> ssl.SSLContext | None:
    """The SSL context for https:// requests; None: aiohttp's default (the system CAs)."""
    if options.is_default:
        return None
    if options.key_file and not options.cert_file:
        raise HttpSinkConfigError("tls_key_file: needs tls_cert_file, the certificate it keys")
    if options.ca_file and not options.verify:
        raise HttpSinkConfigError("tls_ca_file: has no use with tls_verify = false; keep one")
    context = _context(options.ca_file)
    if not options.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.cert_file:
        _load_client_cert(context, options.cert_file, options.key_file)
    return context


def _context(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except OSError as exc:  # ssl.SSLError is one: a file with no PEM certificate
        raise HttpSinkConfigError(f"tls_ca_file: cannot use {ca_file}: {_reason(exc)}") from None


def _load_client_cert(context: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except OSError as exc:
        names = "tls_cert_file and tls_key_file" if key_file else "tls_cert_file"
        raise HttpSinkConfigError(
            f"{names}: cannot use {cert_file}{f' with {key_file}' if key_file else ''}: "
            f"{_reason(exc)} (a PEM certificate and its matching private key)") from None


def _no_passphrase() -> str:
    """OpenSSL would ask the terminal for an encrypted key's passphrase: refuse instead."""
    raise HttpSinkConfigError("tls_key_file: the private key is encrypted; give the agent "
                              "an unencrypted PEM key that only its user can read")


def _reason(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc).lower().replace("_", " ")
    return exc.strerror or type(exc).__name__


def tls_failure_reason(exc: Exception) -> str:
    """OpenSSL's short reason for a failed handshake (CERTIFICATE_VERIFY_FAILED, ...),
    from aiohttp's error, without the address."""
    cause = exc.__cause__ or (exc.args[1] if len(exc.args) > 1 else None)
    reason = getattr(cause, "reason", None)
    detail = getattr(cause, "verify_message", None)  # "certificate has expired", ...
    text = f"{reason}: {detail}" if reason and detail else reason or detail
    return str(text or type(exc).__name__)[:200]
