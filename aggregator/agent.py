"""The agent: wires spool, ingest routes, sink consumers and heartbeats, and drains on exit.

Start order: spool (recovery), sinks, consumers, socket, HTTP, readiness. Stop order on
SIGTERM: /readyz answers 503, the socket stops accepting, open connections finish their
frame, consumers deliver what is spooled within the drain deadline, sinks close.
SIGHUP re-reads the sinks from the config without touching the socket or the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aggregator import systemd
from aggregator.artifacts.wiring import build_shipper, stop_shipper
from aggregator.config import (
    AgentConfig,
    ConfigError,
    config_warnings,
    load_config,
    restart_only_settings,
)
from aggregator.config.sinks import SinkConfig
from aggregator.delivery.consumer import SinkConsumer
from aggregator.delivery.sink_set import SinkSet, build_sinks
from aggregator.gauges import AgentGauges
from aggregator.heartbeat import Heartbeat, silent_after_s
from aggregator.ingest.http_port import HttpPort
from aggregator.ingest.http_routes import HttpApi
from aggregator.ingest.ingestor import Ingestor
from aggregator.ingest.unix_socket import SocketIngest
from aggregator.liveness import LivenessWatch
from aggregator.liveness.procs import is_running
from aggregator.losses import LossRecorder
from aggregator.memory import (
    arrow_pool_name,
    calm_garbage_collector,
    cap_malloc_arenas,
    keep_pandas_out,
)
from aggregator.metrics import AgentMetrics
from aggregator.on_demand import UsersWatch
from aggregator.ray.recall import recall_ray_ids
from aggregator.raylogs.wiring import build_follower
from aggregator.red.wiring import build_red_metrics
from aggregator.shutdown import (
    StopSignals,
    cancel_until_done,
    log_drain_progress,
    log_stopped,
    log_waiting_for,
)
from aggregator.spool import Spool
from aggregator.worker_errors import WorkerErrors
from emitters.thread_names import name_this_thread
from sinks.base import Sink

log = logging.getLogger("evagg.agent")
RAY_LOGS_FINAL_S = 10.0  # the last shipping of Ray log files at a stop, at most


class Agent:
    def __init__(self, config: AgentConfig, exit_when_unused: Path | None = None,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.config = config
        cap_malloc_arenas()
        self._arrow_pool = arrow_pool_name()
        self.overrides = dict(overrides or {})  # command-line flags, kept across reloads
        # the file's settings a reload does not apply, to say which of them a reload found
        # changed (they wait for the next start)
        self._running_settings = restart_only_settings(config.source_path)
        self.metrics = AgentMetrics()
        self._errors = WorkerErrors(self.metrics, log)  # the agent's own workers' failures
        self.losses = LossRecorder(self.metrics.dropped_events,  # every loss, one recorder
                                   self.metrics.producer_dropped_events)
        self.red = build_red_metrics(config, self.metrics)  # aggregator/red/
        self._users = (UsersWatch(exit_when_unused, self.metrics)  # aggregator/on_demand.py
                       if exit_when_unused is not None else None)
        self.spool = Spool(config.state_dir / "spool", max_bytes=config.spool_max_bytes,
                           when_full=config.spool_when_full, fsync=config.spool_fsync,
                           segment_bytes=config.spool_segment_bytes, losses=self.losses)
        self.ingestor = Ingestor(self.spool, self.metrics, node_id=config.node_id,
                                 host=config.host, red=self.red, losses=self.losses)
        self.socket = SocketIngest(self.ingestor, self.metrics, path=config.socket,
                                   mode=config.socket_mode, group=config.socket_group,
                                   max_frame_bytes=config.max_frame_bytes,
                                   frame_timeout_s=config.frame_timeout_s,
                                   max_connections=config.max_connections,
                                   producer_alive=is_running)
        self.http = HttpApi(self.ingestor, self.metrics, max_body_bytes=config.http_max_body_bytes,
                            token=config.http_token, is_ready=self.is_ready,
                            listen_host=config.http_listen.rpartition(":")[0].strip("[]"),
                            stall_s=config.frame_timeout_s)
        self.http_port = HttpPort(self.http, self.metrics, listen=config.http_listen,
                                  stall_s=config.frame_timeout_s,
                                  max_connections=config.max_connections)
        self.heartbeat = Heartbeat(self.ingestor, self.metrics, self.losses,
                                   node_id=config.node_id, spool_directory=self.spool.directory,
                                   interval_s=config.heartbeat_interval_s,
                                   silent_after_s=silent_after_s(config))
        self.liveness = LivenessWatch(self.ingestor, self.metrics, spool=self.spool,
                                      state_dir=config.state_dir, host=config.host,
                                      grace_s=config.inferred_end_grace_s)
        self.ray_logs = build_follower(config, self.metrics, self.losses)  # aggregator/raylogs/
        if self.ray_logs is not None:
            self.http.ray_rows_observers.append(self.ray_logs.note)
        self.artifacts = build_shipper(config, self.ingestor, self.metrics)  # [[files]]
        self.sinks: SinkSet | None = None
        self._reload_lock = asyncio.Lock()  # a reload and the drain never overlap
        self._reload_task: asyncio.Task[None] | None = None
        self._ready = False
        self._stop_signals = StopSignals()  # a second SIGINT/SIGTERM cuts the drain short
        self._stop = asyncio.Event()
        self._drain_ends = 0.0  # monotonic: every step of the stop fits in drain_timeout
        gauges = AgentGauges(self.metrics, self.spool, self._consumers)
        self.metrics.registry.add_gauge_source(gauges.sample)

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> int:
        # The loop's own pool (Parquet writes, /proc reads, fsyncs), its threads named for
        # `top -H` as the agent's others are (emitters/thread_names.py).
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            thread_name_prefix="evagg-worker", initializer=name_this_thread))
        report = self.spool.open()
        if report.truncated_bytes or report.corrupt_records:
            log.warning("spool recovery: truncated %d bytes, %d corrupt records, quarantined %s",
                        report.truncated_bytes, report.corrupt_records, report.quarantined_files)
        self._recall_ray_ids()
        if recalled := self.losses.recall_unreported(self.config.state_dir):
            log.warning("reporting %d events the last run lost and could not report before "
                        "it stopped", recalled)
        if self.liveness.enabled:  # ends of what dead processes left open
            self.liveness.restore()
            self.ingestor.watcher = self.liveness
        self.sinks = SinkSet(self.spool, self.metrics, self._build_sinks(self.config))
        await self.socket.start(systemd.inherited_socket())
        try:
            await self.http_port.open()
        except BaseException:  # the port is taken: leave no socket file behind either
            await self.socket.stop_accepting()
            self._remove_socket_file()
            raise
        self._install_signals()
        resumes = self._resumes()  # taken before this start spools anything of its own
        # once nothing can fail the start any more, before it says it is ready (so ready
        # means spooled): readers see this agent at once, not an interval from now
        await self.heartbeat.write_start()
        self._ready = True
        systemd.notify("READY=1\nSTATUS=accepting events")
        self._announce(resumes)
        heartbeat = asyncio.create_task(self.heartbeat.run(), name="heartbeat")
        liveness = (asyncio.create_task(self.liveness.run(), name="liveness")
                    if self.liveness.enabled else None)
        watcher = (asyncio.create_task(self._stop_when_unused(self._users),
                                       name="exit-when-unused")
                   if self._users is not None else None)
        ray_logs = (asyncio.create_task(self.ray_logs.run(), name="ray-logs")
                    if self.ray_logs is not None else None)
        artifacts = (asyncio.create_task(self.artifacts.run(), name="artifacts")
                     if self.artifacts is not None else None)
        await self._stop.wait()
        self._drain_ends = time.monotonic() + self.config.drain_timeout_s
        heartbeat.cancel()
        await self._stop_ray_logs(ray_logs)
        await stop_shipper(self.artifacts, artifacts, self._drain_left())
        if liveness is not None:
            liveness.cancel()
        if watcher is not None:
            watcher.cancel()
        return await self._drain()

    def _drain_left(self) -> float:
        """Seconds left of drain_timeout since the stop began: the steps of a stop share
        it, so that the whole stop keeps to it (a write in flight then gets its grace)."""
        return max(0.0, self._drain_ends - time.monotonic())

    def request_stop(self) -> None:
        self._stop.set()

    def is_ready(self) -> bool:
        return self._ready

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, signal.SIGTERM)
        loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, signal.SIGINT)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_stop_signal(self, signum: int) -> None:
        if self._stop_signals.receive(signum):
            log_waiting_for(signum, self.sinks, self.config.drain_timeout_s,
                            self.config.socket)
            self.request_stop()

    def _on_sighup(self) -> None:
        if self._stop.is_set() or (self._reload_task and not self._reload_task.done()):
            log.warning("SIGHUP ignored: the agent is %s",
                        "stopping" if self._stop.is_set() else "already reloading")
            return
        self._reload_task = asyncio.create_task(self.reload(), name="reload")

    def _recall_ray_ids(self) -> None:
        """Remember the Ray eventIds still in the spool, so that Ray's resend of a batch
        spooled before a restart is not stored again (aggregator/ray/recall.py)."""
        if not self.config.http_listen:
            return  # no /ray/events route
        window = self.http.ray.recent_ids
        try:
            recalled = recall_ray_ids(self.spool, want=window.capacity)
        except Exception as exc:  # the spool itself failing: start anyway
            self._errors.failed("ray_recall", exc, "could not read Ray eventIds back from the "
                                "spool: a resend by Ray of what was spooled may be stored again")
            return
        window.confirm(recalled.ids)
        if recalled.unreadable:
            self.metrics.worker_errors.inc(recalled.unreadable, worker="ray_recall",
                                           type="unreadable_record")
            log.warning("%d spool records could not be read for Ray eventIds: a resend of "
                        "their events after this restart may be stored again",
                        recalled.unreadable)
        if recalled.ids:
            log.info("remembered %d Ray eventIds from the spool", len(recalled.ids))

    def _resumes(self) -> dict[str, int]:
        """Per sink, the events the spool held for it from before this start."""
        return {name: self.spool.lag(name)[1] for name in self._consumers()}

    def _announce(self, waiting: dict[str, int]) -> None:
        for warning in config_warnings(self.config):
            log.warning("%s", warning)
        sinks = self.sinks.describe() if self.sinks else ""
        # Absolute paths: a relative --socket is where a producer in another directory
        # must look, and the log is where the operator reads it.
        log.info("evagg agent ready: node %s, socket %s, http %s, spool %s, sinks: %s, "
                 "arrow memory pool %s", self.config.node_id, self.config.socket.absolute(),
                 self.config.http_listen or "off", self.spool.directory.absolute(), sinks,
                 self._arrow_pool)
        if any(waiting.values()):  # after a crash or a stop cut short: say what resumes
            log.info("resuming: the spool holds events from before this start, which each "
                     "sink delivers first: %s", ", ".join(
                         f"{name} {events:,}" for name, events in waiting.items() if events))

    async def _drain(self) -> int:
        """Deliver what is spooled, unless a second stop signal says not to wait; the exit
        code says which (aggregator/shutdown.py)."""
        self._ready = False
        self.metrics.draining.set(1)
        systemd.notify("STOPPING=1\nSTATUS=draining")
        delivering = asyncio.create_task(self._deliver_and_close_sinks(), name="drain")
        hurry = asyncio.create_task(self._stop_signals.hurry.wait(), name="hurry")
        progress = asyncio.create_task(log_drain_progress(
            self.sinks, self.config.drain_timeout_s, self.metrics), name="drain progress")
        await asyncio.wait({delivering, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        progress.cancel()
        if not delivering.done():
            await cancel_until_done(delivering)
            if self.sinks is not None:
                await self.sinks.abandon()
        await self.http_port.close()
        self.ingestor.close()
        log_stopped(self.sinks, self.spool.directory, self._stop_signals)
        self.spool.close()
        self.losses.keep_unreported(self.config.state_dir)  # the final heartbeat's, if it failed
        self._remove_socket_file()
        if not delivering.cancelled():
            delivering.result()  # a drain that failed is the agent's error, after cleanup
        return self._stop_signals.exit_code

    async def _deliver_and_close_sinks(self) -> None:
        await self.socket.stop_accepting()
        # frames already received are ingested and acked, even with drain_timeout = 0s
        await self.socket.close_connections(timeout=min(5.0, max(1.0, self._drain_left())))
        await self.heartbeat.write_final(self._drain_left())
        async with self._reload_lock:
            if self.sinks is not None:
                await self.sinks.stop(self._drain_left())

    def _remove_socket_file(self) -> None:
        if self.config.socket.exists() and systemd.inherited_socket() is None:
            self.config.socket.unlink(missing_ok=True)

    # -- sinks -----------------------------------------------------------------------------

    def _build_sinks(self, config: AgentConfig) -> list[tuple[SinkConfig, Sink]]:
        return build_sinks(config.sinks, node_id=self.config.node_id,
                           spool_id=self.spool.spool_id, state_dir=self.config.state_dir)

    async def reload(self) -> None:
        """Re-read the sinks; keep socket, spool, cursors and every other setting. The new
        sinks are built before the old ones stop, so a bad config changes nothing."""
        async with self._reload_lock:
            if self._stop.is_set():
                return
            try:
                fresh = load_config(self.config.source_path, overrides=self.overrides)
                built = self._build_sinks(fresh)
            except ConfigError as exc:
                log.error("reload refused, keeping the running sinks: %s; fix the file and "
                          "reload again (systemctl reload evagg, or SIGHUP)", exc)
                self.metrics.config_reloads.inc(result="refused")
                self.metrics.reload_refused_at.set(time.time())  # `evagg status` says so
                return
            log.info("reloading: replacing the sinks with those of %s",
                     self.config.source_path or "the defaults")
            self._say_restart_only_changes()
            delivered_at = {name: consumer.state.last_success_ns
                            for name, consumer in self._consumers().items()}
            if self.sinks is not None:
                await self.sinks.retire(self.config.drain_timeout_s)
            for gone in {c.name for c in self.config.sinks} - {c.name for c in fresh.sinks}:
                self.metrics.registry.forget(sink=gone)  # renamed or removed
            self.sinks = SinkSet(self.spool, self.metrics, built, delivered_at)
            self.config = dataclasses.replace(self.config, sinks=fresh.sinks)
            self.metrics.config_reloads.inc(result="applied")
            self.metrics.reload_refused_at.clear()
            log.info("reloaded: sinks %s", self.sinks.describe())

    def _say_restart_only_changes(self) -> None:
        found = restart_only_settings(self.config.source_path)
        changed = sorted(key for key in found.keys() | self._running_settings.keys()
                         if found.get(key) != self._running_settings.get(key))
        if changed:
            log.warning("reload: %s changed in %s but a reload replaces the sinks only; "
                        "the agent runs with the old value until its next start (systemctl "
                        "restart evagg)", ", ".join(changed), self.config.source_path)

    def _consumers(self) -> dict[str, SinkConsumer]:
        return self.sinks.consumers if self.sinks else {}

    # -- background workers ----------------------------------------------------------------

    async def _stop_ray_logs(self, task: asyncio.Task[None] | None) -> None:
        """What Ray's workers printed up to the stop is shipped too, for a few seconds."""
        if task is None or self.ray_logs is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(RAY_LOGS_FINAL_S, self._drain_left())):
                await self.ray_logs.ship_all()

    async def _stop_when_unused(self, users: UsersWatch) -> None:
        await users.wait_until_unused()
        self.request_stop()


def run_agent(config: AgentConfig, exit_when_unused: Path | None = None,
              overrides: Mapping[str, Any] | None = None) -> int:
    keep_pandas_out()
    agent = Agent(config, exit_when_unused, overrides)
    calm_garbage_collector()
    return asyncio.run(agent.run())

