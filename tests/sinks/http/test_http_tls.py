"""The HTTP sink's TLS options against a real https:// aiohttp endpoint on 127.0.0.1 whose
certificate a private CA signed (tests/sinks/certs.py): the CA verifies it, the system's
CAs do not, a client certificate opens an endpoint that requires one, and every bad
option stops the start (and `evagg check-config`) with the key that names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from sinks.base import SinkResult
from sinks.http import HttpOptions, HttpSink, HttpSinkConfigError
from sinks.http.deadletter import list_dead_letters
from sinks.http.replay import replay_dead_letters
from sinks.http.tls import TlsOptions, client_ssl
from sinks.records import SpoolRecord
from tests.commands import check_config
from tests.sinks.certs import Pki, make_pki
from tests.sinks.flaky_server import FlakyServer
from tests.sinks.http.records import deliver, make_records
from tests.sinks.http_config_file import http_sink_config
from tests.sinks.synced import synced


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def sink(server: FlakyServer, tls: TlsOptions | None, tmp: Path | None = None) -> HttpSink:
    return HttpSink("collector", server.url,
                    HttpOptions(timeout_s=5.0, tls=tls or TlsOptions()), spool_id="spool-a",
                    dead_letter_dir=tmp / "dlq" if tmp else None)


async def one_attempt(target: HttpSink, records: list[SpoolRecord]) -> SinkResult:
    result = await target.write(records)
    if result.ok:
        result = await target.flush(final=True)
    await target.close()
    return result


@synced
async def test_the_private_ca_verifies_the_endpoint_and_every_event_arrives(pki: Pki) -> None:
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    try:
        target = sink(server, TlsOptions(ca_file=str(pki.ca.cert)))
        assert await deliver(target, make_records(3, 50)) == []
        await target.close()
    finally:
        await server.stop()
    assert server.url.startswith("https://") and len(server.event_ids) == 150


@synced
async def test_an_endpoint_the_trusted_cas_did_not_sign_is_a_permanent_tls_failure(
        pki: Pki, tmp_path: Path) -> None:
    other_ca = make_pki(tmp_path / "other", "other").ca
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    try:
        for tls in (None, TlsOptions(ca_file=str(other_ca.cert))):  # system CAs, another CA
            target = sink(server, tls)
            result = await one_attempt(target, make_records(1, 10))
            assert (result.ok, result.error_kind, result.permanent) == (False, "tls", True)
            assert "CERTIFICATE_VERIFY_FAILED: unable to get local issuer" in (result.error or "")
            assert "tls_ca_file" in (result.error or "")  # says how to trust a private CA
            assert target.metrics()["tls_errors"] == 1
    finally:
        await server.stop()
    assert server.requests == []  # nothing was sent to an endpoint that was not verified


@synced
async def test_a_client_certificate_opens_an_endpoint_that_requires_one(pki: Pki) -> None:
    server = await FlakyServer(ssl_context=pki.server_context(require_client_cert=True)).start()
    try:
        bare = sink(server, TlsOptions(ca_file=str(pki.ca.cert)))
        refused = await one_attempt(bare, make_records(1, 10))
        assert not refused.ok and server.requests == []
        mutual = sink(server, TlsOptions(ca_file=str(pki.ca.cert), cert_file=str(pki.client.cert),
                                         key_file=str(pki.client.key)))
        assert await deliver(mutual, make_records(2, 10)) == []
        await mutual.close()
    finally:
        await server.stop()
    assert len(server.event_ids) == 20


@synced
async def test_tls_verify_false_sends_to_an_endpoint_it_cannot_verify(pki: Pki) -> None:
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    try:
        target = sink(server, TlsOptions(verify=False))
        assert await deliver(target, make_records(1, 10)) == []
        await target.close()
    finally:
        await server.stop()
    assert len(server.event_ids) == 10


@synced
async def test_dlq_replay_uses_the_sinks_tls_context(pki: Pki, tmp_path: Path) -> None:
    server = await FlakyServer(ssl_context=pki.server_context()).start()
    tls = TlsOptions(ca_file=str(pki.ca.cert))
    try:
        server.answer(400, text="refused once")
        target = sink(server, tls, tmp_path)
        assert await deliver(target, make_records(1, 5)) == []  # dead-lettered: done
        await target.close()
        assert len(list_dead_letters(tmp_path / "dlq")) == 1
        unverified = await replay_dead_letters(tmp_path / "dlq", server.url)
        assert unverified.failed == 1 and "Certificate" in unverified.errors[0]
        replayed = await replay_dead_letters(tmp_path / "dlq", server.url, ssl=client_ssl(tls))
    finally:
        await server.stop()
    assert (replayed.sent, replayed.failed) == (1, 0) and len(server.event_ids) == 5
    assert list_dead_letters(tmp_path / "dlq") == []


def bad_options(pki: Pki, tmp: Path) -> list[tuple[TlsOptions, str]]:
    not_pem = tmp / "not.pem"
    not_pem.write_text("not a certificate\n")
    return [
        (TlsOptions(ca_file=str(tmp / "missing.crt")), "tls_ca_file: cannot use"),
        (TlsOptions(ca_file=str(not_pem)), "tls_ca_file: cannot use"),
        (TlsOptions(key_file=str(pki.client.key)), "tls_key_file: needs tls_cert_file"),
        (TlsOptions(cert_file=str(pki.client.cert)), "tls_cert_file: cannot use"),  # no key
        (TlsOptions(cert_file=str(pki.client.cert), key_file=str(pki.server.key)),
         "tls_cert_file and tls_key_file: cannot use"),  # a key of another certificate
        (TlsOptions(ca_file=str(pki.ca.cert), verify=False), "tls_ca_file: has no use"),
    ]


def test_bad_tls_options_stop_the_start_naming_the_key(pki: Pki, tmp_path: Path) -> None:
    for tls, message in bad_options(pki, tmp_path):
        with pytest.raises(HttpSinkConfigError, match=message):
            HttpSink("collector", "https://127.0.0.1:9/ingest", HttpOptions(tls=tls),
                     spool_id="s")
    with pytest.raises(HttpSinkConfigError, match=r"tls_\* options need an https:// url"):
        HttpSink("collector", "http://127.0.0.1:9/ingest",
                 HttpOptions(tls=TlsOptions(ca_file=str(pki.ca.cert))), spool_id="s")


def test_an_encrypted_client_key_is_refused_without_asking_for_a_passphrase(
        pki: Pki, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(pki.client.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"pw")))
    with pytest.raises(HttpSinkConfigError, match="tls_key_file: the private key is encrypted"):
        client_ssl(TlsOptions(cert_file=str(pki.client.cert), key_file=str(encrypted)))


def test_check_config_refuses_a_tls_file_it_cannot_read(pki: Pki, tmp_path: Path) -> None:
    tls = (f'tls_ca_file = "{pki.ca.cert}"\ntls_cert_file = "{pki.client.cert}"\n'
           f'tls_key_file = "{tmp_path / "gone.key"}"')
    config = http_sink_config(tmp_path, "https://127.0.0.1:9/ingest", tls)
    done = check_config("--config", str(config))
    assert done.returncode != 0
    assert "tls_cert_file and tls_key_file: cannot use" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    config.write_text(config.read_text().replace(str(tmp_path / "gone.key"),
                                                 str(pki.client.key)))
    done = check_config("--config", str(config))
    assert done.returncode == 0, done.stderr


def test_check_config_warns_when_certificates_are_not_verified(tmp_path: Path) -> None:
    config = http_sink_config(tmp_path, "https://127.0.0.1:9/ingest", "tls_verify = false")
    done = check_config("--config", str(config))
    assert done.returncode == 0, done.stderr  # allowed: a warning, not an error
    assert "config warning: sinks[0] (collector).tls_verify: false" in done.stderr


def test_dlq_list_needs_no_sending_options_but_replay_names_a_bad_one(tmp_path: Path) -> None:
    """Listing dead letters reads no key file: an operator without access to it can list."""
    config = http_sink_config(tmp_path, "https://127.0.0.1:9/ingest",
                              f'tls_cert_file = "{tmp_path / "unreadable.crt"}"')
    command = [sys.executable, "-m", "aggregator", "dlq", "--sink", "collector", "--config",
               str(config)]
    listed = subprocess.run([*command[:4], "list", *command[4:]], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "0 dead-lettered batches" in listed.stdout
    replayed = subprocess.run([*command[:4], "replay", *command[4:]], capture_output=True,
                              text=True, timeout=60)
    assert replayed.returncode == 2 and "tls_cert_file: cannot use" in replayed.stderr
    assert "Traceback" not in replayed.stderr
