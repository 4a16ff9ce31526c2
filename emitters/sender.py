"""The emitter's one background thread: drain the queue, frame, send, read acks, resend.

Every frame stays in the outbox until the agent acks or nacks it; after a reconnect the
whole outbox is sent again in order, and the agent drops the (session, seq) pairs it
already holds. The outbox is bounded in bytes: events that do not fit are dropped and
counted by reason, and the counts go to the agent as a `loss` event once it listens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterable
from typing import Any

from emitters import wire
from emitters.connection import Connection, ConnectionClosed
from emitters.events import Context, ContextChange, build_events
from emitters.handoff import Handoff, Settings, start_agent
from emitters.ledger import FlushWaiter, Ledger
from emitters.loss_reports import LossReports
from emitters.outbox import Outbox
from emitters.stats import EmitterStats
from emitters.thread_names import name_this_thread

log = logging.getLogger("evagg.emitter")

DRAIN_CHUNK = 4096
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
ERROR_PAUSE_S = 0.1


class Sender:
    """Everything the thread needs from its emitter comes through `handoff`."""

    def __init__(self, handoff: Handoff, agent_first: bool = False) -> None:
        self._handoff = handoff
        settings = handoff.settings
        self.outbox = Outbox(settings.max_frame_bytes, settings.max_buffer_bytes)
        self.session = self.outbox.session
        self.ledger = Ledger(self.outbox, lambda: handoff.caller_drops)
        self.counts = self.ledger.counts
        self._log = self.ledger.log
        self._losses = LossReports(self.outbox, self.ledger)
        self._context = Context.of(handoff.identity)  # ContextChange items update it in order
        self._ndjson_at: str | None = None  # the socket whose agent refused COLUMNS
        self._conn: Connection | None = None
        self._conn_setting: str | None = None  # the configured socket when it connected
        self._sent_upto = 0
        self._backoff = BACKOFF_MIN_S
        self._next_connect = self._next_drain = 0.0
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._start_agent_first = agent_first
        self._release_at_end = False
        self._thread = threading.Thread(target=self._run, name="evagg-emitter", daemon=True)

    # -- called from other threads ----------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        fd = self._wake_w
        if fd >= 0:
            with contextlib.suppress(OSError):  # a full pipe: the thread is awake already
                os.write(fd, b"\0")

    def stop(self, join_timeout: float) -> bool:
        """Ask the thread to end; True once it has, and then release() is safe."""
        self._stopping = True
        self.wake()
        if self._thread.is_alive() and not self.is_sender_thread():
            self._thread.join(join_timeout)
        return not self._thread.is_alive()

    def release_at_end(self) -> None:
        """The thread outlived stop()'s wait: it releases its descriptors as it ends."""
        self._release_at_end = True

    def is_sender_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def release(self) -> None:
        """Close the socket and wake pipe, once no thread can use this sender any more."""
        self._close()
        for name in ("_wake_w", "_wake_r"):
            fd = getattr(self, name)
            setattr(self, name, -1)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def stats(self) -> EmitterStats:
        return self.ledger.stats(self._handoff.queued_events(), self._conn is not None)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        name_this_thread()  # `top -H` on a training process tells evagg's thread apart
        if self._start_agent_first:
            self._start_agent()
        while not self._stopping:
            try:
                self._cycle()
            except Exception as exc:  # the thread must outlive any bug or odd failure
                self.counts["sender_errors"] += 1
                self._log.log(logging.WARNING, "error", "evagg emitter: sender failed: %r", exc)
                self._disconnect()
                time.sleep(ERROR_PAUSE_S)
        try:
            self._last_word()
        except Exception as exc:  # best effort: the close goes on
            self.counts["sender_errors"] += 1
            self._log.log(logging.WARNING, "error", "evagg emitter: the last loss report "
                          "failed: %r", exc)
        if self._release_at_end:
            self.release()
        else:
            self._close()

    def _start_agent(self) -> None:
        try:
            start_agent(self._handoff.settings)  # never raises by contract; a bug must not end us
        except Exception as exc:
            self.counts["sender_errors"] += 1
            self._log.log(logging.WARNING, "error", "evagg emitter: agent start failed: %r", exc)

    def _cycle(self) -> None:
        readable, woken = self._wait()
        settings = self._handoff.settings
        now = time.monotonic()
        if woken or now >= self._next_drain:
            self._next_drain = now + settings.flush_interval
            self._drain(settings)
            self.ledger.warn_new_losses(settings.resolved_socket())
        # Read again after the drain: an event queued after configure(socket=...) returned
        # was drained after that change, and so goes to the new socket, never the old one.
        settings = self._handoff.settings
        if self._conn is not None and settings.socket_path != self._conn_setting:
            self._disconnect()  # configure(socket=...) moved: send the unacked there
            readable = False
        if self._conn is None and self._wants_connection() and now >= self._next_connect:
            self._connect(settings)
        if self._conn is not None and readable:
            self._read()
        if self._conn is not None:
            self._report_losses()
            self._write()
        if self._conn is not None and self._conn.stalled(settings.ack_timeout):
            self.counts["ack_timeouts"] += 1
            self._disconnect()
        self._settle_waiters()

    def _wait(self) -> tuple[bool, bool]:
        due = self._next_drain
        if self._conn is None and self._wants_connection():
            due = min(due, self._next_connect)
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if self._conn is not None:
            poller.register(self._conn, select.POLLIN
                            | (select.POLLOUT if self._conn.wants_write else 0))
        readable = woken = False
        for fd, _ in poller.poll(max(0.0, due - time.monotonic()) * 1000):
            if fd == self._wake_r:
                woken = True
                with contextlib.suppress(OSError):
                    while os.read(self._wake_r, 4096):
                        pass
            else:
                readable = True  # data, hang-up or error: read() tells which
        return readable, woken

    # -- queue -> frames ------------------------------------------------------------------

    def _drain(self, settings: Settings) -> None:
        pending = self._handoff.queue
        n = len(pending)
        if not n:
            return
        self.outbox.resize(settings.max_frame_bytes, settings.max_buffer_bytes)
        batch: list[tuple[Any, ...]] = []
        for _ in range(n):
            item = pending.popleft()
            if type(item) is tuple:
                batch.append(item)
                if len(batch) >= DRAIN_CHUNK:
                    self._frame(batch)
                    batch = []
                continue
            self._frame(batch)  # a marker applies after the events queued before it
            batch = []
            if isinstance(item, FlushWaiter):
                self._made_all(self.outbox.close_frame())
                self._add_waiter(item, settings)
            elif isinstance(item, ContextChange):
                self._context = Context.of(item.identity)
        self._frame(batch)
        self._made_all(self.outbox.close_frame())

    def _frame(self, items: list[tuple[Any, ...]]) -> None:
        if not items:
            return
        self.counts["taken_events"] += len(items)
        if self.outbox.full:
            self.outbox.lost["buffer_full"] += len(items)
            return
        try:
            if self._sends_columns():
                made = self.outbox.add_items(items, self._context)
            else:
                made = list(self.outbox.add_events(build_events(items, self._context,
                                                                self.outbox.lost)))
        except Exception as exc:
            self.outbox.lost["unencodable"] += len(items)
            self._log.log(logging.WARNING, "build", "evagg emitter: cannot build events: %r", exc)
            return
        self._made_all(made)

    def _sends_columns(self) -> bool:
        settings = self._handoff.settings
        return settings.frames == "columns" and self._ndjson_at != settings.resolved_socket()

    def _made(self, seq: int | None) -> None:
        if seq is not None and self._conn is not None:
            self._conn.queue((seq,))

    def _made_all(self, seqs: Iterable[int]) -> None:
        frames = self.outbox.frames
        for seq in seqs:
            if frames[seq].is_columns:
                self.counts["columns_frames"] += 1
            self._made(seq)

    def _report_losses(self, force: bool = False) -> None:
        self._made(self._losses.report(self._context, force))

    def _last_word(self) -> None:
        """At the end, what was lost and not yet told to the agent (LossReports.last_word).
        Frames never sent (the close gave up on them) count as `exit_deadline`; the drops
        of reports that never went out are told again."""
        self._drain(self._handoff.settings)  # what callers queued last: framed, or dropped
        for seq in [seq for seq in self.outbox.frames if seq > self._sent_upto]:
            frame = self.outbox.settle(seq)
            if not self.ledger.forget_report(seq) and frame is not None:
                self.outbox.lost["exit_deadline"] += frame.events
        self._losses.last_word(self._context, self._handoff.settings.resolved_socket())

    # -- connection ---------------------------------------------------------------------

    def _wants_connection(self) -> bool:
        if self.outbox.frames:
            return True
        return self.ledger.has_unreported_losses()

    def _connect(self, settings: Settings) -> bool:
        path = settings.resolved_socket()
        try:
            conn = Connection(path)
        except OSError as exc:
            self.counts["connect_failures"] += 1
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            self._log.log(logging.INFO, "connect", "evagg emitter: no agent at %s (%s); "
                          "buffering and retrying", path, exc)
            self.ledger.agent_unreachable()
            return False
        self._conn = conn
        self._conn_setting = settings.socket_path
        self._backoff = BACKOFF_MIN_S
        conn.queue(self.outbox.frames)  # everything unacked, oldest first
        self.counts["resent_frames"] += sum(1 for s in self.outbox.frames if s <= self._sent_upto)
        self.counts["connects"] += 1
        return True

    def _disconnect(self) -> None:
        if self._conn is None:
            return
        self._close()
        self.counts["disconnects"] += 1
        self._next_connect = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _write(self) -> None:
        assert self._conn is not None
        if not self._conn.wants_write:
            return
        try:
            sent = self._conn.write(self.outbox.frames)
        except ConnectionClosed:
            # The agent may have said why before it closed (an old agent refusing
            # COLUMNS does): read that first, or the next connection repeats it.
            with contextlib.suppress(ConnectionClosed, wire.FrameError):
                self._conn.read(self._on_reply)
            self._disconnect()
            return
        if sent:
            self.counts["sent_frames"] += len(sent)
            self.ledger.count_sent([seq for seq in sent if seq > self._sent_upto])
            self._sent_upto = max(self._sent_upto, sent[-1])

    def _read(self) -> None:
        assert self._conn is not None
        try:
            self._conn.read(self._on_reply)
        except ConnectionClosed:
            self._disconnect()
        except wire.FrameError as exc:
            self.counts["bad_replies"] += 1
            self._log.log(logging.WARNING, "bad_reply", "evagg emitter: unreadable reply from "
                          "the agent (%s); reconnecting", exc)
            self._disconnect()

    def _on_reply(self, reply: wire.Frame) -> None:
        if isinstance(reply, wire.Nack) and wire.refuses_columns(reply) and self._columns_out():
            self._fall_back_to_ndjson()
            return
        if self.ledger.on_reply(reply) and self._conn is not None:
            self._conn.answered()

    def _columns_out(self) -> bool:
        oldest = self.outbox.oldest()
        return oldest is not None and self.outbox.frames[oldest].is_columns

    def _fall_back_to_ndjson(self) -> None:
        """The agent predates COLUMNS (it stored none): make every unacked COLUMNS frame
        again as NDJSON, and send only NDJSON to this socket from now on."""
        path = self._handoff.settings.resolved_socket()
        if self._ndjson_at is None:
            log.warning("evagg emitter: the agent at %s does not take COLUMNS frames (an older "
                        "evagg); sending it NDJSON from now on, nothing is lost", path)
        self._ndjson_at = path
        self.counts["columns_refused"] += 1
        sent = sum(pending.events for seq, pending in self.outbox.frames.items()
                   if pending.is_columns and seq <= self._sent_upto)
        removed, made = self.outbox.frames_as_ndjson()
        self.ledger.frames_remade(removed, made, sent)
        self._disconnect()  # the agent closes it too; the reconnect sends the NDJSON frames

    # -- flush ------------------------------------------------------------------------------

    def _add_waiter(self, waiter: FlushWaiter, settings: Settings) -> None:
        self.ledger.add_waiter(waiter)
        if waiter.at_exit and self._conn is None and self._wants_connection():
            self._connect(settings)  # at once, whatever the backoff says

    def _settle_waiters(self) -> None:
        # A flush that reaches its agent ends only once the agent holds the count of every
        # drop before it (docs/wire-protocol.md, "Losses"): the last drops would
        # otherwise wait out the report interval, and a process that exits meanwhile never
        # reports them. With no agent there is nobody to tell; the flush says False.
        due = self.ledger.flushes_due()
        if due and self._conn is not None:
            if self.ledger.has_unreported_losses():
                self._report_losses(force=True)
            report = self.ledger.last_unacked_report()  # forced now, or sent just before
            if report is not None:
                self.ledger.wait_for_report(due, report)
        self.ledger.settle_waiters()
