"""Catch-up after a sink outage at a paced 50k events/s: drain time and agent RSS.

Two agents run side by side, each with one sink: (a) HTTP to a receiver in its own
process whose port is closed for the outage (connection refused), (b) Parquet on a moto
S3 server in its own process, stopped and restarted on the same port. A paced sender
per agent replays frames of 1000 emitter-shaped events (50 frames/s) with unique event
ids throughout. After the outage the bench measures the backlog, the wait for the sink's
retry (the delivery loop's backoff), the time until `evagg_sink_lag_events` is back to
its steady level, the drain rate, and agent RSS every 0.5 s by phase; then it checks that
every event arrived (HTTP at least once, S3 exactly once by event_id).
Usage: python bench/bench_catchup.py [--outage 60] [--only http|s3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import select
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emitters import wire  # noqa: E402
from emitters.ids import new_span_id, new_trace_id  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.sinks.moto_server import MotoS3, aws_env  # noqa: E402

EVENTS_PER_FRAME = 1000
ID_PREFIX = "0190{tag:04x}-0000-7000-8000-"  # + 12 hex digits: the event's number
HTTP_TAG, S3_TAG = 1, 2
ID_FIELD = re.compile(b'"event_id":"' + ID_PREFIX.format(tag=HTTP_TAG).encode()
                      + rb'([0-9a-f]{12})"')
HEX = np.zeros(256, np.int64)
HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
SAMPLE_S = 0.5


# -- producer: paced frames with unique ids --------------------------------------------

def frame_templates(count: int = 16) -> list[list[bytes]]:
    """Each frame's NDJSON split around its event ids, so a frame costs one join."""
    marker = "@@ID@@"
    templates = []
    for _ in range(count):
        now = time.time_ns()
        events = [{
            "event_id": marker, "time": now + i * 1000, "kind": "op", "source": "torch",
            "name": ("forward", "backward", "optimizer.step")[i % 3], "state": "FINISHED",
            "task_id": new_span_id(), "job_id": "job-0001", "run_id": "run-bench-42",
            "node_id": "gpu-node-17", "step": i // 3, "duration_s": 0.0123 + i * 1e-6,
            "trace_id": new_trace_id(), "span_id": new_span_id(),
            "metrics": {"loss": 1.0 / (i + 1), "grad_norm": 0.5 + i % 7},
            "attrs": {"rank": str(i % 8), "model": "llama-7b"},
        } for i in range(EVENTS_PER_FRAME)]
        templates.append(b"\n".join(orjson.dumps(e) for e in events).split(marker.encode()))
    return templates


def frame_payload(template: list[bytes], prefix: bytes, first_id: int) -> bytes:
    parts = [template[0]]
    for i, rest in enumerate(template[1:]):
        parts += [prefix, b"%012x" % (first_id + i), rest]
    return b"".join(parts)


def paced_sender(path: str, tag: int, frames_per_s: float, stop: Any, out: Any) -> None:
    """Sends frame n at start + n / frames_per_s (a window of unacked frames bounds a
    burst); after `stop`, waits for every ack and reports (acked events, max frames late)."""
    templates, prefix = frame_templates(), ID_PREFIX.format(tag=tag).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    session, seq, acked, late, buffer = os.urandom(16), 0, 0, 0, wire.FrameBuffer()
    start = time.monotonic()
    while not stop.is_set() or seq > acked:
        due = int((time.monotonic() - start) * frames_per_s) if not stop.is_set() else seq
        late = max(late, due - seq)
        while seq < due and seq - acked < 256:
            payload = frame_payload(templates[seq % len(templates)], prefix,
                                    seq * EVENTS_PER_FRAME)
            seq += 1
            sock.sendall(wire.encode_batch(session, seq, EVENTS_PER_FRAME, payload))
        if select.select([sock], [], [], 0.5 / frames_per_s)[0]:
            buffer.feed(sock.recv(1 << 16))
            for frame in buffer.frames():
                assert isinstance(frame, wire.Ack), frame
                acked = frame.seq
    sock.close()
    out.put((tag, acked * EVENTS_PER_FRAME, late))


# -- peers in their own processes, driven over a pipe ------------------------------------

def receiver_main(port: int, capacity: int, conn: Connection) -> None:
    asyncio.run(_receiver(port, capacity, conn))


async def _receiver(port: int, capacity: int, conn: Connection) -> None:
    from aiohttp import web

    counts = np.zeros(capacity, np.uint16)  # times each event number was accepted
    state = {"requests": 0, "events": 0}

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        found = ID_FIELD.findall(body)
        if found:
            digits = HEX[np.frombuffer(b"".join(found), np.uint8).reshape(-1, 12)]
            numbers = digits @ (16 ** np.arange(11, -1, -1, dtype=np.int64))
            np.add.at(counts, numbers, 1)
        state["requests"] += 1
        state["events"] += body.count(b"\n")
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/ingest", ingest)
    runner: web.AppRunner | None = None
    loop, commands = asyncio.get_running_loop(), asyncio.Queue[str]()
    loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
    conn.send("ready")
    while (command := await commands.get()) != "exit":
        if command == "up":
            runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        elif command == "down" and runner is not None:
            await runner.cleanup()  # the port closes: connections are refused
            runner = None
        conn.send(_verdict(counts, int(command.split()[1]), state)
                  if command.startswith("stats") else "ok")


def _verdict(counts: np.ndarray, sent: int, state: dict[str, int]) -> str:
    ours = counts[:sent]
    missing = int(np.count_nonzero(ours == 0))
    duplicates = int(ours.sum()) - (sent - missing)
    beyond = int(np.count_nonzero(counts[sent:]))
    return (f"receiver got {state['events']:,} events in {state['requests']:,} requests: "
            f"{sent - missing:,}/{sent:,} sent ids, {missing:,} missing, {duplicates:,} "
            f"duplicates, {beyond:,} ids never sent -> {'OK' if not missing else 'LOST EVENTS'} "
            "(at least once)")


def moto_main(port: int, conn: Connection) -> None:
    server = MotoS3(port)
    conn.send("ready")
    while (command := conn.recv()) != "exit":
        server.start() if command == "up" else server.stop()
        conn.send("ok")
    server.stop()


class Peer:
    def __init__(self, target: Any, *args: Any) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("spawn").Process(target=target, args=(*args, child),
                                                    daemon=True)
        self.proc.start()
        assert self.conn.recv() == "ready"

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send("exit")
        self.proc.join(30)


# -- one agent, one sink, its samples ----------------------------------------------------

@dataclass
class Sample:
    t: float
    rss: float  # MiB
    anon: float  # MiB of it not backed by files (heap, Arrow pools)
    cpu: float  # seconds
    peer_cpu: float  # seconds, the receiver's or moto's process
    received: float  # events taken in
    lag: float
    delivered: float
    spool: float  # bytes


@dataclass
class Scenario:
    label: str
    sink: str
    tag: int
    agent: AgentProcess
    peer: Peer
    verify: Callable[[int], str]
    samples: list[Sample] = field(default_factory=list)
    sent: int = 0
    late: int = 0

    def sample(self, t: float) -> None:
        pid = self.agent.proc.pid if self.agent.proc else 0
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines())
        rss, anon = (int(status[key].split()[0]) / 1024 for key in ("VmRSS", "RssAnon"))
        text = self.agent.metrics()
        self.samples.append(Sample(
            t, rss, anon, cpu_seconds(pid), cpu_seconds(self.peer.proc.pid or 0),
            _series(text, "evagg_received_events_total", "route", prefix=True),
            _series(text, "evagg_sink_lag_events", self.sink),
            _series(text, "evagg_delivered_events_total", self.sink),
            _series(text, "evagg_spool_bytes", "")))

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.t < end]


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _series(text: str, name: str, sink: str, prefix: bool = False) -> float:
    """The sample of `name` for one sink (every labelled sample of it with prefix)."""
    head = f"{name}{{{sink}" if prefix else f'{name}{{sink="{sink}"}} ' if sink else f"{name} "
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(head))


def http_scenario(workdir: Path, capacity: int) -> Scenario:
    port = free_port()
    peer = Peer(receiver_main, port, capacity)
    peer.ask("up")
    sinks = (f'[[sinks]]\nname = "collector"\ntype = "http"\n'
             f'url = "http://127.0.0.1:{port}/ingest"\n')
    (workdir / "http").mkdir()
    agent = AgentProcess(workdir / "http", sinks_toml=sinks, spool_toml='max_bytes = "32GiB"')
    return Scenario("HTTP (receiver refused)", "collector", HTTP_TAG, agent, peer,
                    lambda sent: str(peer.ask(f"stats {sent}")))


def s3_scenario(workdir: Path) -> Scenario:
    moto = MotoS3()
    peer = Peer(moto_main, moto.port)
    peer.ask("up")
    bucket = moto.create_bucket()
    sinks = (f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "s3://{bucket}/lake/"\n'
             f'endpoint_url = "{moto.endpoint_url}"\npath_style = true\n'
             'roll_interval = "2s"\nroll_max_bytes = "32MiB"\n')
    (workdir / "s3").mkdir()
    agent = AgentProcess(workdir / "s3", sinks_toml=sinks, env=aws_env(),
                         spool_toml='max_bytes = "32GiB"')
    return Scenario("Parquet on S3 (moto stopped)", "lake", S3_TAG, agent, peer,
                    lambda sent: verify_s3(moto, bucket, sent))


def verify_s3(moto: MotoS3, bucket: str, sent: int) -> str:
    """Exactly once: every sent id once, nothing else of ours (heartbeats aside)."""
    prefix = ID_PREFIX.format(tag=S3_TAG)
    ours = f"event_id LIKE '{prefix}%'"
    found = moto.duckdb().execute(
        f"SELECT count(*) FILTER ({ours}), count(DISTINCT event_id) FILTER ({ours}), "
        f"max(event_id) FILTER ({ours}), count(DISTINCT filename) FROM read_parquet("
        f"'s3://{bucket}/lake/**/*.parquet', hive_partitioning = true, filename = true)"
    ).fetchone()
    assert found is not None
    rows, distinct, top, files = found
    beyond = top is not None and int(top[-12:], 16) >= sent
    exact = rows == distinct == sent and not beyond
    return (f"S3 holds {rows:,} of our rows in {files} files: {distinct:,}/{sent:,} distinct "
            f"ids, {rows - distinct:,} duplicates, {sent - distinct:,} missing -> "
            f"{'OK' if exact else 'MISMATCH'} (exactly once)")


# -- the run -------------------------------------------------------------------------------

@dataclass
class Timeline:
    start: float
    down: float = 0.0
    up: float = 0.0
    end: float = 0.0


@dataclass
class Catchup:
    threshold: float
    backlog: float = 0.0
    backlog_resumed: float = 0.0  # lag when delivery resumed (ingest went on meanwhile)
    spool_mib: float = 0.0
    resumed: float | None = None  # first sample after recovery with progress
    idle_until: float = 0.0  # last sample after recovery without progress
    caught: float | None = None
    drained: float = 0.0  # events delivered from recovery to caught-up


def analyse(scenario: Scenario, line: Timeline, rate: float) -> Catchup:
    before = [s.lag for s in scenario.between(line.start + 2, line.down)] or [0.0]
    result = Catchup(threshold=max(rate, 1.1 * max(before)))
    after_up = scenario.between(line.up, float("inf"))
    if not after_up:
        return result
    first = after_up[0]
    result.backlog, result.spool_mib, result.idle_until = first.lag, first.spool / 2**20, first.t
    result.backlog_resumed = first.lag
    for sample in after_up[1:]:
        if result.resumed is None:
            if sample.delivered > first.delivered:
                result.resumed = sample.t
            else:
                result.idle_until, result.backlog_resumed = sample.t, sample.lag
        elif sample.lag <= result.threshold:
            result.caught, result.drained = sample.t, sample.delivered - first.delivered
            break
    return result


def sampling(scenarios: list[Scenario], running: threading.Event) -> None:
    while running.is_set():
        now = time.monotonic()
        for scenario in scenarios:
            try:
                scenario.sample(now)
            except (OSError, StopIteration) as exc:  # a missed sample is not a result
                print(f"  sample of {scenario.label} failed: {exc!r}", file=sys.stderr)
        time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))


def measure(args: argparse.Namespace, scenarios: list[Scenario]) -> Timeline:
    for scenario in scenarios:
        scenario.agent.start()
    stop, results = mp.get_context("spawn").Event(), mp.get_context("spawn").Queue()
    senders = [mp.get_context("spawn").Process(
        target=paced_sender, args=(str(s.agent.socket_path), s.tag, args.rate / EVENTS_PER_FRAME,
                                   stop, results), daemon=True) for s in scenarios]
    running = threading.Event()
    running.set()
    sampler = threading.Thread(target=sampling, args=(scenarios, running), daemon=True)
    line = Timeline(time.monotonic())
    sampler.start()
    for sender in senders:
        sender.start()
    time.sleep(args.before)
    line.down = time.monotonic()
    for scenario in scenarios:
        scenario.peer.ask("down")
    print(f"  {time.monotonic() - line.start:5.1f}s sinks down for {args.outage:g}s", flush=True)
    time.sleep(args.outage)
    line.up = time.monotonic()
    for scenario in scenarios:
        scenario.peer.ask("up")
    print(f"  {time.monotonic() - line.start:5.1f}s sinks back", flush=True)
    deadline = line.up + args.max_catchup
    while time.monotonic() < deadline and any(
            analyse(s, line, args.rate).caught is None for s in scenarios):
        time.sleep(SAMPLE_S)
    print(f"  {time.monotonic() - line.start:5.1f}s caught up (or gave up)", flush=True)
    time.sleep(args.after)
    stop.set()
    by_sender = [results.get(timeout=120) for _ in senders]  # sender order: unknown
    line.end = time.monotonic()
    time.sleep(SAMPLE_S)
    running.clear()
    sampler.join()
    for sender in senders:
        sender.join(10)
    for scenario, (sent, late) in zip(scenarios, _by_tag(by_sender, scenarios), strict=True):
        scenario.sent, scenario.late = sent, late
        _wait_drained(scenario)
    return line


def _by_tag(results: list[tuple[int, int, int]],
            scenarios: list[Scenario]) -> list[tuple[int, int]]:
    tagged = {tag: (sent, late) for tag, sent, late in results}
    return [tagged[s.tag] for s in scenarios]


def _wait_drained(scenario: Scenario, timeout: float = 180.0) -> None:
    """Until the sink's lag is only heartbeats (its last Parquet file rolls within 2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scenario.agent.metric(f'evagg_sink_lag_events{{sink="{scenario.sink}"}}') < 10:
            return
        time.sleep(0.5)
    print(f"  {scenario.label}: not drained after {timeout:g}s", file=sys.stderr)


def report(scenario: Scenario, line: Timeline, args: argparse.Namespace) -> None:
    rate = scenario.sent / (line.end - line.start)
    got = analyse(scenario, line, args.rate)
    print(f"\n{scenario.label}: sent {scenario.sent:,} events at {rate:,.0f} ev/s "
          f"(sender at most {scenario.late} frames behind schedule)")
    print(f"  backlog at recovery {got.backlog:,.0f} events, spool {got.spool_mib:,.0f} MiB "
          f"on disk; steady lag before the outage <= {got.threshold:,.0f} events ('~0')")
    if got.resumed is None or got.caught is None:
        print(f"  NOT caught up within {args.max_catchup:g}s of recovery "
              f"(resumed: {'no' if got.resumed is None else 'yes'})")
    else:
        wait = got.idle_until - line.up
        drain = got.caught - got.idle_until
        drained_rate = got.drained / drain
        print(f"  first delivery {wait:.1f}-{got.resumed - line.up:.1f}s after recovery "
              f"(retry backoff), then lag ~0 after {drain:.1f}s more; "
              f"recovery -> caught up {got.caught - line.up:.1f}s")
        print(f"  drain rate {drained_rate:,.0f} ev/s = {drained_rate / rate:.1f}x ingest "
              f"(delivered/drain time; backlog {got.backlog_resumed:,.0f} at resumption/drain"
              f" + ingest = {got.backlog_resumed / drain + rate:,.0f} ev/s); "
              f"incl. the retry wait {got.drained / (got.caught - line.up) / rate:.1f}x")
    caught = got.caught or line.end
    phases = {"before": (line.start, line.down), "outage": (line.down, line.up),
              "catch-up": (line.up, caught), "after": (caught, line.end + 1)}
    cells, rates = [], []
    for name, (start, end) in phases.items():
        samples = scenario.between(start, end)
        rss = [s.rss for s in samples] or [0.0]
        anon = max((s.anon for s in samples), default=0.0)
        cells.append(f"{name} {min(rss):.0f}/{statistics.median(rss):.0f}/{max(rss):.0f}"
                     f" (anon<={anon:.0f})")
        if len(samples) > 1:
            first, last, span = samples[0], samples[-1], samples[-1].t - samples[0].t
            rates.append(f"{name} {(last.received - first.received) / span:,.0f} ev/s in, "
                         f"agent {(last.cpu - first.cpu) / span:.0%} "
                         f"peer {(last.peer_cpu - first.peer_cpu) / span:.0%}")
    print("  by phase: " + "; ".join(rates) + " (CPU of one core)")
    print("  RSS MiB min/median/max: " + ", ".join(cells))
    series = []
    for name, (start, end) in phases.items():
        picked = scenario.between(start, end)[:: int(args.series_s / SAMPLE_S)]
        series.append(f"{name[0]} " + " ".join(f"{s.rss:.0f}" for s in picked))
    print(f"  RSS every {args.series_s:g}s: " + " | ".join(series))
    print("  " + scenario.verify(scenario.sent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the sinks are away")
    parser.add_argument("--rate", type=float, default=50_000.0, help="events/s ingested")
    parser.add_argument("--before", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=6.0)
    parser.add_argument("--max-catchup", type=float, default=100.0)
    parser.add_argument("--series-s", type=float, default=5.0)
    parser.add_argument("--only", choices=("http", "s3"))
    parser.add_argument("--dump", type=Path, help="write every sample here (JSON lines)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="evagg-catchup-"))
    capacity = int(args.rate * (args.before + args.outage + args.max_catchup + args.after + 60))
    scenarios: list[Scenario] = []
    try:
        if args.only in (None, "http"):
            scenarios.append(http_scenario(workdir, capacity))
        if args.only in (None, "s3"):
            scenarios.append(s3_scenario(workdir))
        print(f"{os.cpu_count()} cores; {args.rate:,.0f} events/s in frames of "
              f"{EVENTS_PER_FRAME}; outage {args.outage:g}s; {len(scenarios)} agents side by side")
        line = measure(args, scenarios)
        for scenario in scenarios:
            report(scenario, line, args)
        if args.dump:
            with args.dump.open("wb") as out:
                for scenario in scenarios:
                    for sample in scenario.samples:
                        out.write(orjson.dumps({"sink": scenario.sink, **sample.__dict__,
                                                "t": sample.t - line.start}) + b"\n")
    finally:
        for scenario in scenarios:
            if scenario.agent.running:
                scenario.agent.stop()
            scenario.peer.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
