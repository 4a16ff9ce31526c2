"""Soak: producer processes at about 50k events/s into a real agent for --minutes, with a
fault every --fault-every seconds, alternating an agent SIGKILL + restart and an outage of
the HTTP sink's endpoint. Prints the agent's RSS over time, then events lost and
duplicated in the Parquet lake (both must be 0) and over HTTP (lost must be 0; repeats
are allowed there, at-least-once).

    .venv/bin/python bench/soak.py                 # 10 minutes
    .venv/bin/python bench/soak.py --minutes 2 --rate 50000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiohttp import web  # noqa: E402

from tests.agentproc import AgentProcess, query_lake  # noqa: E402
from tests.producers import producer_report, start_producer  # noqa: E402

TASK_ID = re.compile(rb'"task_id":\s*"(soak\d+)-(\d+)"')


class CountingReceiver:
    """An aiohttp endpoint in its own thread that marks each task id it accepted in a
    bitmap per producer (tens of millions of ids fit in a few MB), and can go away."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.seen = {prefix: bytearray((count + 7) // 8) for prefix, count in counts.items()}
        self.repeats = 0
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/ingest"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        for prefix, number in TASK_ID.findall(body):
            bits, index = self.seen[prefix.decode()], int(number)
            mask = 1 << (index & 7)
            if bits[index >> 3] & mask:
                self.repeats += 1
            bits[index >> 3] |= mask
        return web.Response(text="ok")

    async def _start(self) -> None:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/ingest", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)

    def missing(self, counts: dict[str, int]) -> int:
        found = sum(bin(byte).count("1") for bits in self.seen.values() for byte in bits)
        return sum(counts.values()) - found


@dataclass
class Incarnation:
    """One agent process between two kills: its RSS samples in MiB."""

    pid: int
    rss: list[float] = field(default_factory=list)


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def sinks_toml(receiver: CountingReceiver) -> str:
    return ('[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\nroll_interval = "5s"\n\n'
            f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{receiver.url}"\n'
            'batch_max_events = 5000\nbatch_interval = "200ms"\ntimeout = "5s"\n')


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        seconds = args.minutes * 60
        each = int(args.rate * seconds / args.producers)
        self.counts = {f"soak{n}": each for n in range(args.producers)}
        self.seconds = seconds
        self.receiver = CountingReceiver(self.counts)
        self.receiver.start()
        self.agent = AgentProcess(workdir, sinks_toml=sinks_toml(self.receiver),
                                  spool_toml='max_bytes = "4GiB"')
        self.incarnations: list[Incarnation] = []
        self.faults: list[str] = []
        self.outage_ends = 0.0
        self.last_received = 0.0
        self.last_print = 0.0

    def start_agent(self) -> None:
        self.agent.start(timeout=60)
        assert self.agent.proc is not None
        self.incarnations.append(Incarnation(self.agent.proc.pid))

    def run(self) -> dict[str, Any]:
        self.start_agent()
        started = time.monotonic()
        procs = [start_producer(self.agent.socket_path, prefix, count, seconds=self.seconds,
                                flush_timeout=300)
                 for prefix, count in self.counts.items()]
        print(f"{'t s':>6} {'agent RSS MiB':>13} {'spool MiB':>9} {'in ev/s':>9} "
              f"{'lake lag':>9} {'http lag':>9}  fault", flush=True)
        next_fault = started + self.args.fault_every
        next_print = started
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            fault = ""
            if now >= next_fault and now < started + self.seconds - 5:
                fault = self.fault(len(self.faults))
                next_fault = now + self.args.fault_every
            if self.outage_ends and now >= self.outage_ends:
                self.receiver.start()
                self.outage_ends = 0.0
                fault = fault or "http endpoint back"
            self.sample()
            if now >= next_print or fault:
                self.print_line(now - started, fault)
                next_print = now + 15
            time.sleep(1)
        reports = [producer_report(p, timeout=600) for p in procs]
        return self.finish(reports, time.monotonic() - started)

    def fault(self, number: int) -> str:
        if number % 2 == 0:
            self.agent.kill()
            self.start_agent()
            what = "agent SIGKILL + restart"
        else:
            self.receiver.stop()
            self.outage_ends = time.monotonic() + self.args.outage
            what = f"http endpoint refuses for {self.args.outage}s"
        self.faults.append(what)
        return what

    def sample(self) -> None:
        self.incarnations[-1].rss.append(rss_mib(self.incarnations[-1].pid))

    def print_line(self, t: float, fault: str) -> None:
        metric = self.agent.metric
        received = metric("evagg_received_events_total")  # restarts from 0 with the agent
        rate = max(received - self.last_received, 0) / max(t - self.last_print, 1)
        self.last_received, self.last_print = received, t
        lags = [metric(f'evagg_sink_lag_events{{sink="{s}"}}') for s in ("lake", "collector")]
        print(f"{t:6.0f} {self.incarnations[-1].rss[-1]:13.0f} "
              f"{metric('evagg_spool_bytes') / 2**20:9.0f} {rate:9.0f} "
              f"{lags[0]:9.0f} {lags[1]:9.0f}  {fault}", flush=True)

    def finish(self, reports: list[dict[str, Any]], emit_seconds: float) -> dict[str, Any]:
        if self.outage_ends:
            self.receiver.start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not all(
                self.agent.metric(f'evagg_sink_lag_events{{sink="{s}"}}') <= 2
                for s in ("lake", "collector")):
            self.sample()
            time.sleep(1)
        self.agent.stop(timeout=120)
        rows, distinct = query_lake(self.agent.lake_dir, "SELECT count(*), count(DISTINCT "
                                    "task_id) FROM events WHERE kind = 'task'")[0]
        expected = sum(self.counts.values())
        return {"expected": expected, "emit_seconds": emit_seconds, "lake_rows": rows,
                "lost": expected - distinct, "duplicates": rows - distinct,
                "http_lost": self.receiver.missing(self.counts),
                "http_repeats": self.receiver.repeats, "raised": sum(r["raised"] for r in reports),
                "flushed": all(r["flushed"] for r in reports),
                "slowest_emit_ms": max(r["slowest_ns"] for r in reports) / 1e6}


def summary(soak: Soak, result: dict[str, Any]) -> None:
    print("\nagent incarnations (RSS MiB: first sample, peak, last):")
    for inc in soak.incarnations:
        if inc.rss:
            print(f"  pid {inc.pid:>7}: {inc.rss[0]:6.0f} {max(inc.rss):6.0f} {inc.rss[-1]:6.0f}"
                  f"  over {len(inc.rss)} s")
    print(f"\nfaults: {len(soak.faults)} ({soak.faults.count('agent SIGKILL + restart')} agent "
          f"kills, {len(soak.faults) - soak.faults.count('agent SIGKILL + restart')} http "
          "outages)")
    print(f"events emitted: {result['expected']:,} in {result['emit_seconds']:.0f} s "
          f"({result['expected'] / result['emit_seconds']:,.0f}/s)")
    print(f"producers: raised {result['raised']}, all flushed {result['flushed']}, "
          f"slowest emit() {result['slowest_emit_ms']:.1f} ms")
    print(f"lake:  lost {result['lost']}, duplicates {result['duplicates']}")
    print(f"http:  lost {result['http_lost']}, repeated deliveries {result['http_repeats']:,} "
          "(at-least-once)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=50_000, help="events/s, all producers")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--fault-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds of HTTP outage")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="evagg-soak-"))
    soak = Soak(args, workdir)
    try:
        result = soak.run()
    finally:
        soak.agent.kill()
        soak.receiver.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary(soak, result)
    ok = result["lost"] == 0 and result["duplicates"] == 0 and result["http_lost"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
