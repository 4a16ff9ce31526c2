"""A real evagg agent in a subprocess, for end-to-end tests."""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import duckdb

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPOOL = 'max_bytes = "256MiB"'


def short_socket_dir() -> Path:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer. The
    folder is outside tmp_path, so it goes when the test process exits."""
    folder = Path(tempfile.mkdtemp(prefix="evagg-", dir="/tmp"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


class AgentProcess:
    def __init__(self, workdir: Path, sinks_toml: str = "", extra_toml: str = "",
                 env: dict[str, str] | None = None, agent_toml: str = "",
                 spool_toml: str = "", drain_timeout: str = "20s",
                 heartbeat_interval: str = "2s") -> None:
        self.workdir = workdir
        self.socket_path = short_socket_dir() / "events.sock"
        self.state_dir = workdir / "state"
        self.lake_dir = workdir / "lake"
        self.port = free_port()
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "evagg.toml"
        self.log_path = workdir / "agent.log"
        self.env = env or {}
        self.flags: list[str] = []  # command-line flags after `--config`, as an operator adds
        self.prefix: list[str] = []  # a command the agent runs under (a seccomp filter)
        self.proc: subprocess.Popen[bytes] | None = None
        sinks = sinks_toml.replace("{lake}", str(self.lake_dir)) or (
            f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{self.lake_dir}"\n'
            'roll_interval = "1s"\n'
        )
        self.config_path.write_text(
            "[agent]\n"
            f'node_id = "test-node"\nsocket = "{self.socket_path}"\n'
            f'state_dir = "{self.state_dir}"\nhttp_listen = "127.0.0.1:{self.port}"\n'
            f'heartbeat_interval = "{heartbeat_interval}"\ndrain_timeout = "{drain_timeout}"\n'
            f'{agent_toml}\n'
            f"[spool]\n{spool_toml or DEFAULT_SPOOL}\n\n{sinks}\n{extra_toml}\n"
        )

    def start(self, timeout: float = 30.0) -> AgentProcess:
        try:
            self._start(timeout)
        except RuntimeError:
            # free_port() gave a port that something else (Ray opens many) took before
            # the agent bound it: move to another once, as an operator would.
            if f"already listening on 127.0.0.1:{self.port}" not in self.log():
                raise
            self._move_http_port()
            self._start(timeout)
        return self

    def _start(self, timeout: float) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.env}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "aggregator", "run", "--config",
                 str(self.config_path), *self.flags],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def _move_http_port(self) -> None:
        old, self.port = self.port, free_port()
        self.http_url = f"http://127.0.0.1:{self.port}"
        text = self.config_path.read_text()
        self.config_path.write_text(text.replace(f'http_listen = "127.0.0.1:{old}"',
                                                 f'http_listen = "127.0.0.1:{self.port}"'))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/readyz", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError,
                    http.client.HTTPException):
                # HTTPException: something else (a Ray gRPC server) holds the port; the
                # agent exits saying so, and start() moves it to another port
                pass
            time.sleep(0.05)
        raise RuntimeError(f"agent not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> AgentProcess:
        self.kill()
        return self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> str:
        return scrape(self.http_url)

    def metric(self, series: str) -> float:
        """Sum of every sample whose name{labels} starts with `series`."""
        return sum_of(self.metrics(), series)

    def wait_delivered(self, events: int, timeout: float = 60.0, sink: str = "lake") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metric(f'evagg_delivered_events_total{{sink="{sink}"}}') >= events:
                return
            time.sleep(0.2)
        raise AssertionError(f"sink {sink} did not deliver {events} events in {timeout}s:\n"
                             f"{self.metrics()}")

    def wait_rows(self, sql: str, count: int, timeout: float = 60.0) -> list[tuple[Any, ...]]:
        """Until `sql` over the lake returns at least `count` rows (files roll every second)."""
        deadline = time.monotonic() + timeout
        rows: list[tuple[Any, ...]] = []
        while time.monotonic() < deadline:
            if any(self.lake_dir.rglob("*.parquet")):
                rows = self.query(sql)
                if len(rows) >= count:
                    return rows
            time.sleep(0.2)
        raise AssertionError(f"{len(rows)} of {count} rows after {timeout}s: {rows}\n"
                             f"{self.log()}")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Run SQL over the lake with a view `events` (every row, duplicates kept)."""
        return query_lake(self.lake_dir, sql)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()


def query_lake(lake: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.execute(
        f"CREATE VIEW events AS SELECT * FROM read_parquet('{lake}/**/*.parquet', "
        "hive_partitioning = true, union_by_name = true)")
    return con.execute(sql).fetchall()


def wait_tail_connected(tail: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """Until an `evagg tail` child (started with stderr=PIPE, text=True) says it waits for
    events, and that line. It says so once the agent's answer headers arrived; the agent
    takes the spool position it follows from before it sends them, so an event sent
    after this reaches the child, and one sent before may never."""
    stream = tail.stderr
    assert stream is not None, "start the tail with stderr=subprocess.PIPE"
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not first:
        tail.kill()  # the reader's readline ends with the child
        raise AssertionError(f"`evagg tail` did not connect within {timeout}s")
    if not first[0].startswith("waiting for events on "):
        rest = stream.read() if tail.poll() is not None else ""
        raise AssertionError(f"`evagg tail` said {first[0] + rest!r} (exit {tail.poll()})")
    return first[0]


def http_sink(name: str, url: str, extra: str = "") -> str:
    """An HTTP sink's TOML for `AgentProcess(sinks_toml=...)`, tuned to retry fast."""
    return (f'[[sinks]]\nname = "{name}"\ntype = "http"\nurl = "{url}"\n'
            f'batch_max_events = 500\nbatch_interval = "200ms"\ntimeout = "1s"\n'
            f'retry_max_backoff = "2s"\n{extra}\n')


def scrape(http_url: str) -> str:
    """An agent's /metrics at `http_url` (http://host:port)."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def sum_of(metrics: str, series: str) -> float:
    """Sum of every sample in `metrics` whose name{labels} starts with `series`."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(series) and not line.startswith("#"))
