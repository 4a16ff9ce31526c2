"""The Emitter: what callers touch. emit() and op() only queue a tuple; the sender does the rest.

The caller's cost is a clock read and a deque append (atomic under the GIL), checked
against a length cap so that a stalled sender can never grow memory without bound. The
background thread starts on the first event, restarts lazily in a forked child (with a
new session and empty buffers) and is flushed at interpreter exit within a deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from emitters.events import BUILT, DEFERRED, DEFERRED_PLACE, ContextChange
from emitters.handoff import Handoff, Settings, start_agent
from emitters.ledger import FlushWaiter
from emitters.loss_reports import LAST_WORD_S
from emitters.ops import Op
from emitters.sender import Sender
from emitters.snapshot import PLAIN, snapshot_fields
from emitters.stats import EmitterStats
from emitters.values import text

log = logging.getLogger("evagg.emitter")

_time_ns = time.time_ns
_ZEROS = itertools.repeat(0)
_BUILTS = itertools.repeat(BUILT)
_WAKE_BATCH = 64
_SETTINGS = ("flush_interval", "max_buffer_bytes", "max_frame_bytes", "ack_timeout", "frames")
_LIVE: weakref.WeakSet[Emitter] = weakref.WeakSet()


class Emitter:
    """One process-local event emitter; `emitters.emit` etc. use a default instance.

    Options (all keyword, all optional; `configure()` takes the same names):
    socket (path; else $EVAGG_SOCKET, else paths.default_socket_path()), job_id, run_id,
    node_id (else $EVAGG_JOB_ID, $EVAGG_RUN_ID, $EVAGG_NODE_ID), source ("evagg"), attrs
    (labels on every event), flush_interval (s), max_buffer_bytes (encoded frames kept
    unacked), max_frame_bytes, max_pending (queued, unencoded events), exit_timeout (s),
    ack_timeout (s without an ack before reconnecting and resending), frames ("columns",
    the default, or "ndjson": the frame type sent; docs/wire-protocol.md), start_agent (True:
    start an agent on the socket now if none answers; see emitters.autostart; with
    EVAGG_START_AGENT=1 the same happens before the first event is sent).
    """

    def __init__(self, **options: Any) -> None:
        self._handoff = Handoff()  # all that the sender thread sees of this emitter
        self._pending = self._handoff.queue  # the same deque, one lookup less in emit()
        self._running = False
        self._closed = False
        self._closed_ok = False  # what close() returned
        self._final: EmitterStats | None = None  # the figures when close() ended
        self._lock = threading.Lock()
        self._sender: Sender | None = None
        self._max_pending = 0
        self._op_put = self._put  # bound once: op() makes no method object per call
        self._wake_at = 0
        self.exit_timeout = 2.0
        self._explicit_pending: int | None = None
        self.configure(**options)
        _LIVE.add(self)

    # -- the caller's side -------------------------------------------------------------

    def emit(self, /, kind: str, name: str | None = None, state: str | None = None,
             **fields: Any) -> None:
        """Queue one event. Never raises, never blocks; drops (and counts) when full."""
        for value in fields.values():  # inline: most calls pass only plain values
            if type(value) not in PLAIN:
                snapshot_fields(fields)  # read later by the sender: freeze it now
                break
        pending = self._pending
        n = len(pending)
        if n < self._max_pending:
            pending.append((_time_ns(), kind, name, state, fields))
            if n == self._wake_at or not self._running:
                self._poke(n)
        else:
            self._handoff.caller_drops += 1

    def op(self, name: str, /, step: int | None = None, **fields: Any) -> Op:
        """`with emitter.op("train_step", step=i) as op: op.metric(loss=l)`."""
        return Op(self._op_put, name, step, fields)

    def enqueue_built(self, events: Sequence[dict[str, Any]]) -> None:
        """Queue events that evagg's own integrations built finished
        (emitters/integrations/otel_fast.py), past emit()'s per-field checks: each must be
        what the sender would make of its fields (typed columns, text attrs, an event_id);
        the sender adds the context.
        Never raises, never blocks; what does not fit the queue is dropped and counted."""
        pending = self._pending
        n = len(pending)
        room = max(0, self._max_pending - n)
        if len(events) > room:
            self._handoff.caller_drops += len(events) - room
            events = events[:room]
        if events:
            pending.extend(zip(_ZEROS, _BUILTS, events, strict=False))  # tuples made in C
            # A batch worth a frame of its own wakes the sender now, while its events are
            # warm in the CPU's caches (and before the garbage collector walks them).
            wake = len(events) >= _WAKE_BATCH or n <= self._wake_at < n + len(events)
            if wake or not self._running:
                self._poke(self._wake_at if wake else -1)

    def enqueue_deferred(self, count: int,
                         build: Callable[[], Sequence[dict[str, Any]]]) -> None:
        """Queue `count` events that `build()` makes, in the sender thread: finished as
        for enqueue_built, at most `count` of them. The caller's thread pays only the
        queueing (emitters.torch: a training step's events). All or none: when the queue
        has no room for `count`, they are dropped and counted."""
        pending = self._pending
        n = len(pending)
        if count <= 0:
            return
        if count > self._max_pending - n:
            self._handoff.caller_drops += count
            return
        pending.append((0, DEFERRED, (build, count)))
        if count > 1:
            pending.extend(itertools.repeat(DEFERRED_PLACE, count - 1))
        wake = count >= _WAKE_BATCH or n <= self._wake_at < n + count
        if wake or not self._running:
            self._poke(self._wake_at if wake else -1)

    def _put(self, item: tuple[Any, ...]) -> None:
        pending = self._pending
        n = len(pending)
        if n < self._max_pending:
            pending.append(item)
            if n == self._wake_at or not self._running:
                self._poke(n)
        else:
            self._handoff.caller_drops += 1

    def _poke(self, n: int) -> None:
        try:
            if not self._running:
                self._start()
            sender = self._sender
            if sender is not None and n == self._wake_at:
                sender.wake()
        except Exception:
            pass  # the event is queued; a sender that cannot start shows in stats()

    def _start(self) -> None:
        with self._lock:
            if self._running or self._closed:
                return
            # agent on demand: started by the sender thread before its first connection,
            # so the caller's first emit() never waits for an agent to start
            sender = Sender(self._handoff,
                            agent_first=os.environ.get("EVAGG_START_AGENT") == "1")
            try:
                sender.start()
            except RuntimeError:
                # No new threads at interpreter shutdown: events stay queued up to the cap.
                sender.release()
                self._running = True
                return
            self._sender = sender
            self._running = True
        _register_multiprocessing_exit()

    # -- configuration -------------------------------------------------------------------

    def configure(self, **options: Any) -> None:
        """Set context and limits; names as in the class docstring. None leaves a value."""
        options = {k: v for k, v in options.items() if v is not None}
        wants_agent = bool(options.pop("start_agent", False))
        unknown = set(options) - {"socket", "job_id", "run_id", "node_id", "source", "attrs",
                                  "exit_timeout", "max_pending", *_SETTINGS}
        if unknown:
            raise TypeError(f"unknown emitter option(s): {', '.join(sorted(unknown))}")
        identity = dict(self._handoff.identity)
        for key in ("job_id", "run_id", "node_id", "source"):
            if key in options:
                identity[key] = str(options[key])
        if "attrs" in options:
            identity["attrs"] = {text(k): text(v) for k, v in dict(options["attrs"]).items()}
        changes = {k: options[k] for k in _SETTINGS if k in options}
        if "socket" in options:
            changes["socket_path"] = os.fspath(options["socket"])
        settings = replace(self._handoff.settings, **changes)
        _check_settings(settings)
        # every value is checked before any is applied: a call that raises changes nothing
        exit_timeout = float(options.get("exit_timeout", self.exit_timeout))
        explicit_pending = (max(1, int(options["max_pending"])) if "max_pending" in options
                            else self._explicit_pending)
        self.exit_timeout, self._explicit_pending = exit_timeout, explicit_pending
        self._handoff.settings = settings
        self._size_queue()
        if identity != self._handoff.identity:
            self._handoff.identity = identity
            self._pending.append(ContextChange(identity))
        if wants_agent:
            start_agent(settings)

    def _size_queue(self) -> None:
        """A queued event costs about 1 KB of Python objects: cap the queue like the buffer."""
        limit = self._explicit_pending or max(1024, self._handoff.settings.max_buffer_bytes // 1024)
        self._wake_at = min(4096, max(1, limit // 4))
        if not self._closed:
            self._max_pending = limit

    @property
    def socket_path(self) -> str:
        """The socket the emitter sends to (configured, else $EVAGG_SOCKET, else default)."""
        return self._handoff.settings.resolved_socket()

    @property
    def identity(self) -> Mapping[str, Any]:
        """The configured context: job_id, run_id, node_id, source, attrs (those set)."""
        return MappingProxyType(self._handoff.identity)

    # -- flush, close, stats -----------------------------------------------------------

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until everything emitted so far is acked; False on timeout or any loss.

        A loss (a drop, a nack, a rejected event) since the previous flush makes it False
        (and is reported to the agent first: docs/wire-protocol.md, "Losses").
        Blocks the calling thread: from asyncio, run it in an executor.
        """
        return self._flush(timeout, at_exit=False)

    def _flush(self, timeout: float | None, at_exit: bool) -> bool:
        try:
            if self._closed:
                return False
            if not self._running:
                if not self._handoff.queued_events():
                    return self._handoff.caller_drops == 0  # no event yet: no thread needed
                self._start()
            sender = self._sender
            if sender is None or sender.is_sender_thread():
                return False
            waiter = FlushWaiter(at_exit)
            self._pending.append(waiter)
            sender.wake()
            return waiter.done.wait(timeout) and waiter.ok
        except Exception:
            return False

    def close(self, timeout_s: float | None = None) -> bool:
        """Deliver what is queued within `timeout_s` (default: exit_timeout; gives up at
        once when no agent listens), then stop the sender thread. True if everything was
        acked. Later emit() calls are dropped and counted (stats().dropped["closed"]).
        Never raises; a second call only returns the first one's outcome."""
        try:
            return self._close(self.exit_timeout if timeout_s is None else timeout_s)
        except Exception:
            return False

    def _close(self, timeout_s: float) -> bool:
        if self._closed:
            return self._closed_ok
        deadline = time.monotonic() + max(0.0, timeout_s)
        ok = (self._flush(timeout_s, at_exit=True) if self._running
              else self._handoff.caller_drops == 0)
        with self._lock:
            if self._closed:  # another thread closed it meanwhile
                return self._closed_ok
            self._closed, self._closed_ok = True, ok
            self._max_pending = 0  # from now on emit() drops, and counts
            sender, link = self._sender, self._handoff
            # A handoff no sender reads: its caller_drops are the events emitted too late.
            self._handoff = Handoff(link.settings, link.identity)
            self._pending = self._handoff.queue
        # The sender's last word (a loss report the agent has not had) may take up to
        # LAST_WORD_S past the deadline: a process that exits would cut it off.
        stopped = sender is None or sender.stop(
            max(0.0, deadline - time.monotonic()) + LAST_WORD_S)
        final = self._collect_stats(link)
        # The sender's last word counted the frames it never sent as exit_deadline; the
        # pending ones were sent and are still unanswered.
        given_up = final.pending + final.dropped.get("exit_deadline", 0)
        if given_up:
            # Sent and unanswered ones may be in the agent's spool: the agent answers a
            # frame once it is stored, and a full spool holds that answer back.
            answered = final.acked + final.rejected + final.dropped.get("nacked", 0)
            unanswered = min(final.pending, max(0, final.sent - answered))
            maybe = (f"; {unanswered} of them were sent and the agent may have stored them"
                     if unanswered else "")
            log.warning("evagg emitter: %d event(s) not acknowledged before closing (agent "
                        "at %s)%s; counted as dropped (exit_deadline)", given_up,
                        self.socket_path, maybe)
        self._final = final.at_close()
        if sender is not None:
            if stopped:
                sender.release()
            else:
                sender.release_at_end()  # busy past the deadline (an agent start, say)
        link.queue.clear()
        return ok

    def stats(self) -> EmitterStats:
        """What this emitter did so far: emitted, sent, acked, dropped by reason, pending,
        connected (EmitterStats; docs/emitters.md). Never raises, never blocks."""
        final = self._final
        if final is not None:
            return final.with_late_drops(self._handoff.caller_drops)
        try:
            return self._collect_stats(self._handoff)
        except Exception:  # a bug must not reach the caller: empty figures instead
            return EmitterStats(closed=self._closed)

    def _collect_stats(self, link: Handoff) -> EmitterStats:
        sender = self._sender
        if sender is not None:
            return sender.stats()
        queued, drops = link.queued_events(), link.caller_drops
        return EmitterStats(emitted=queued + drops, pending=queued,
                            dropped={"buffer_full": drops} if drops else {})

    # -- fork --------------------------------------------------------------------------

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent's thread is gone; start over with a new session."""
        old = self._sender
        parent = self._handoff
        self._lock = threading.Lock()
        self._handoff = Handoff(parent.settings, parent.identity)
        self._pending = self._handoff.queue
        self._sender = None
        self._running = False
        if old is not None:
            old.release()  # the child's copies of the parent's socket and wake pipe


def _check_settings(settings: Settings) -> None:
    if settings.flush_interval <= 0 or settings.ack_timeout <= 0:
        raise ValueError("flush_interval and ack_timeout must be positive")
    if min(settings.max_frame_bytes, settings.max_buffer_bytes) < 1024:
        raise ValueError("max_frame_bytes and max_buffer_bytes must be at least 1024")
    if settings.frames not in ("columns", "ndjson"):
        raise ValueError(f"frames must be 'columns' or 'ndjson', not {settings.frames!r}")


def _close_all() -> None:
    for emitter in list(_LIVE):
        with contextlib.suppress(Exception):  # exit must go on
            emitter.close()


def _after_fork_in_child() -> None:
    for emitter in list(_LIVE):
        emitter._reset_after_fork()


_mp_exit_registered_pid = 0


def _register_multiprocessing_exit() -> None:
    """multiprocessing's forked children leave by os._exit(), past atexit: hook its exit."""
    global _mp_exit_registered_pid
    util = sys.modules.get("multiprocessing.util")
    if util is None or _mp_exit_registered_pid == os.getpid():
        return
    _mp_exit_registered_pid = os.getpid()
    with contextlib.suppress(Exception):
        util.Finalize(None, _close_all, exitpriority=0)


atexit.register(_close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
