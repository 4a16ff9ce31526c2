"""The agent on demand's HTTP port, as a driver meets it: with 127.0.0.1:4040 held by
another program the agent gets a free port, the driver and its workers are told the real
address (OTEL_EXPORTER_OTLP_ENDPOINT), OTLP spans from workers reach the agent and none the
stranger; an agent without HTTP makes the driver say so, and no worker is pointed at a port
the agent does not hold."""

from __future__ import annotations

import errno
import fcntl
import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from emitters.autostart import users_lock_path
from tests.agentproc import REPO, query_lake, short_socket_dir
from tests.emitters.ondemand import agent_pids

# A driver: asks for an agent, reports what it was told, starts two workers that send a
# span each over OTLP/HTTP (one with the SDK's own exporter, which reads
# OTEL_EXPORTER_OTLP_ENDPOINT; one through emitters.otel), then exits.
DRIVER = r"""
import os, subprocess, sys
import orjson
import emitters
from emitters import autostart
emitters.configure(start_agent=True, run_id=sys.argv[1])
lease = autostart.current_lease()
for worker in (SDK_WORKER, EVAGG_WORKER):
    subprocess.run([sys.executable, "-c", worker, sys.argv[1]], check=True, timeout=120)
print(orjson.dumps({"http": lease.http, "started": lease.started,
                    "otlp": os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")}).decode(), flush=True)
"""
SDK_WORKER = r"""
import sys
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
provider = TracerProvider(resource=Resource.create({"service.name": "sdk-worker"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
with provider.get_tracer("w").start_as_current_span(f"sdk-{sys.argv[1]}"):
    pass
provider.shutdown()
"""
EVAGG_WORKER = r"""
import sys
from emitters import otel
otel.init_telemetry("evagg-worker", exporter="otlp")
with otel.get_tracer("w").start_as_current_span(f"evagg-{sys.argv[1]}"):
    pass
assert otel.shutdown_telemetry(timeout_s=30)
"""
DRIVER = DRIVER.replace("SDK_WORKER", repr(SDK_WORKER)).replace("EVAGG_WORKER", repr(EVAGG_WORKER))


class Stranger(http.server.BaseHTTPRequestHandler):
    """Another program on the agent's default port: answers 501 and counts what came."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self._refuse()

    def do_POST(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        Stranger.hits.append(self.path)
        self.send_response(501)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stranger() -> Iterator[list[str]]:
    """127.0.0.1:4040 held by another program (this one, or whoever holds it already)."""
    Stranger.hits = []
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 4040), Stranger)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        yield Stranger.hits  # held already: by another program all the same
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Stranger.hits
    server.shutdown()
    server.server_close()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The embedded default agent under temporary dirs, with no port chosen by the user."""
    runtime = short_socket_dir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVAGG_", "OTEL_")) and k != "PYTHONPATH"}
    env.update({"XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": str(tmp_path / "state"),
                "XDG_DATA_HOME": str(tmp_path / "data"), "PYTHONPATH": str(REPO)})
    sock = runtime / "evagg" / "events.sock"
    yield {"env": env, "socket": sock, "lake": tmp_path / "data" / "evagg" / "parquet"}
    for pid in agent_pids(sock):
        os.kill(pid, 9)


def drive(home: dict[str, Any], run_id: str,
          extra: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-c", DRIVER, run_id], cwd=REPO,
                          env={**home["env"], **(extra or {})}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return result, done.stderr


def spans_in_lake(home: dict[str, Any]) -> set[str]:
    if not any(home["lake"].rglob("*.parquet")):
        return set()
    return {row[0] for row in query_lake(home["lake"], "SELECT name FROM events "
                                                       "WHERE kind = 'span'")}


def wait_spans(home: dict[str, Any], names: set[str]) -> None:
    from tests.waiting import wait_until

    wait_until(lambda: names <= spans_in_lake(home), 60, f"spans {names} in the lake")


def hold_users_lock(home: dict[str, Any]) -> int:
    """A user of the agent that outlives the drivers (a long-lived worker, say)."""
    home["socket"].parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(users_lock_path(home["socket"]), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def test_a_taken_port_gives_the_agent_a_free_one_that_workers_are_told(
        home: dict[str, Any], stranger: list[str]) -> None:
    user = hold_users_lock(home)
    first, warned = drive(home, "one")
    assert first["started"] is True
    host, _, port = first["http"].rpartition(":")
    assert host == "127.0.0.1" and port != "4040"
    with socket.create_connection((host, int(port)), timeout=5):
        pass  # the agent holds it
    assert first["otlp"] == f"http://{first['http']}"
    assert "without HTTP" not in warned
    assert f"127.0.0.1:4040 is taken by another program; the agent takes {first['http']}" \
        in warned  # the driver is told, not only the agent's log
    # a second driver on the same socket finds the running agent and the same address
    second, _ = drive(home, "two")
    assert second == {"http": first["http"], "started": False, "otlp": first["otlp"]}
    wait_spans(home, {"sdk-one", "evagg-one", "sdk-two", "evagg-two"})
    assert stranger == []  # no span, nor anything else, went to the stranger
    os.close(user)


def test_an_agent_without_http_is_said_and_points_no_worker_at_its_port(
        home: dict[str, Any], stranger: list[str], tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"  # the user's file turns HTTP off
    config.write_text(f'[agent]\nhttp_listen = ""\n\n[[sinks]]\nname = "lake"\n'
                      f'type = "parquet"\nurl = "{home["lake"]}"\nroll_interval = "1s"\n')
    result, warned = drive(home, "off", {"EVAGG_CONFIG": str(config)})
    assert result["started"] is True and result["http"] == ""
    assert result["otlp"] is None
    assert "runs without HTTP" in warned and "EVAGG_HTTP_LISTEN" in warned
    # the evagg worker's spans take the socket; the SDK's own exporter, told nothing,
    # tries its default (localhost:4318) and loses its span there, not at a stranger's
    wait_spans(home, {"evagg-off"})
    assert stranger == []
