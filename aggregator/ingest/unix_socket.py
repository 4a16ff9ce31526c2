"""The Unix socket listener: frames in, acks out, one handler per producer connection.

pid and uid come from the kernel (SO_PEERCRED), never from the payload. A connection
that sends garbage, an oversized length, or stalls in the middle of a frame gets a NACK
with the reason and is closed; every other connection carries on.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggregator.decode.columns import ColumnsRefused
from aggregator.ingest.address_taken import AddressTaken
from aggregator.ingest.frame_reader import FrameReader, StreamEnd
from aggregator.ingest.ingestor import Ingestor, SpoolUnavailable
from aggregator.ingest.session_owners import SessionOwners
from aggregator.ingest.unstored import StoredOrCounted, unstored_losses
from aggregator.losses import UNSTORED_AT_STOP
from aggregator.metrics import AgentMetrics
from emitters import paths, wire
from emitters.ratelimit import RateLimitedLog

log = logging.getLogger("evagg.socket")

_PEERCRED = struct.Struct("3i")
LOGGED_REASON_CHARS = 200  # a reason quotes producer text: the log gets its start only


# Python 3.13's asyncio unlinks a Unix server's socket file when the server closes. A
# socket systemd handed over must outlive the agent (systemd keeps listening on it while
# the agent restarts); our own the agent removes at its very end, after the drain, on
# every Python alike: a producer that connects during a drain is told it is stopping.
_KEEP_SOCKET_FILE: dict[str, Any] = (
    {"cleanup_socket": False} if sys.version_info >= (3, 13) else {})


class SocketIngest:
    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, *, path: Path, mode: int,
                 group: str | None, max_frame_bytes: int, frame_timeout_s: float = 10.0,
                 max_connections: int = 1024,
                 producer_alive: Callable[[int], bool] = lambda pid: True) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self.path = path
        self.mode = mode
        self.group = group
        self.max_frame_bytes = max_frame_bytes
        self.frame_timeout_s = frame_timeout_s
        # each connection may hold max_frame bytes of frames: the cap bounds their sum,
        # and the file descriptors the sinks need too
        self.max_connections = max_connections
        # whether a producer's process still runs (it resends what was not stored); the
        # agent gives the liveness watch's test, which takes a zombie for gone
        self.producer_alive = producer_alive
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._readers: set[FrameReader] = set()
        self._sessions = SessionOwners()
        self._stored_or_counted = StoredOrCounted(ingestor.spool.has)
        self._log = RateLimitedLog(log)

    async def start(self, inherited: socket.socket | None = None) -> None:
        """Listen on our own socket file, or on one that systemd handed over."""
        loop = asyncio.get_running_loop()
        if inherited is not None:
            self._server = await loop.create_unix_server(self._new_connection, sock=inherited,
                                                         **_KEEP_SOCKET_FILE)
            return
        gid = group_id(self.group)  # before the socket exists: a bad group leaves no file
        prepare_socket_path(self.path)
        self._server = await loop.create_unix_server(self._new_connection, path=str(self.path),
                                                     **_KEEP_SOCKET_FILE)
        apply_socket_permissions(self.path, self.mode, gid)

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close_connections(self, timeout: float) -> None:
        """Ingest the frames already received, then end every connection. An exited
        producer's frames still in its socket are read first: nobody will resend them."""
        for reader in self._readers:
            if reader.transport is not None and not self._alive(reader.transport):
                reader.read_rest()
            reader.finish()
        if self._handlers:
            _, pending = await asyncio.wait(set(self._handlers), timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _new_connection(self) -> FrameReader:
        reader = FrameReader(self.max_frame_bytes, self.frame_timeout_s,
                             on_acks_unread=self.metrics.unread_ack_pauses.inc)
        task = asyncio.get_running_loop().create_task(self._on_connection(reader))
        self._handlers.add(task)
        self._readers.add(reader)
        def forget(done: asyncio.Task[None]) -> None:
            self._handlers.discard(done)
            self._readers.discard(reader)
            self._sessions.release(done)

        task.add_done_callback(forget)
        return reader

    async def _on_connection(self, reader: FrameReader) -> None:
        self.metrics.connections.inc()
        self.metrics.open_connections.inc(1)
        try:
            await self._serve(reader)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            pass  # the producer went away; its unacked frames will be resent
        except SpoolUnavailable as exc:
            self._log_spool_failure(exc)
        except Exception as exc:  # one bad connection must never take the agent down
            self.metrics.worker_errors.inc(worker="socket", type=type(exc).__name__)
            log.exception("socket connection failed")
        finally:
            self.metrics.open_connections.inc(-1)
            reader.finish()  # nothing more is read, not even what a gone producer left
            if reader.transport is not None:
                reader.transport.close()

    def _refuse_over_cap(self, transport: asyncio.Transport) -> None:
        """Close a connection over max_connections at once, without a NACK: a NACK refuses
        a producer's frames for good, and these should come back later, which a closed
        connection makes an emitter do (it keeps them, reconnects and resends). Logged
        once a minute at most, since a flood of connections is what this refuses."""
        self.metrics.bad_input.inc(route="socket", reason="too_many_connections")
        self._log.log(logging.WARNING, "over_cap", "closing producer connections beyond "
                      "max_connections = %d; they reconnect and resend", self.max_connections)
        transport.close()

    def _log_spool_failure(self, exc: SpoolUnavailable) -> None:
        """Once per minute at most: a full disk fails every connection at once."""
        self._log.log(logging.ERROR, "spool", "%s; closing producer connections so they "
                      "resend later", exc)

    async def _serve(self, reader: FrameReader) -> None:
        await reader.connected.wait()
        transport = reader.transport
        assert transport is not None
        if len(self._readers) > self.max_connections:
            self._refuse_over_cap(transport)
            return
        pid, uid = peer_credentials(transport)
        while True:
            item = await reader.frames.get()
            reader.frame_taken()
            if isinstance(item, StreamEnd):
                if item.reason is not None:
                    self._refuse(transport, item.label, item.reason)
                return
            try:
                handled = await self._handle_body(item, pid, uid, transport)
            except asyncio.CancelledError:  # the agent stops before the frame is stored
                self._count_unstored(pid, [item, *reader.take_queued()])
                raise
            if not handled:
                return

    def _alive(self, transport: asyncio.Transport) -> bool:
        pid, _ = peer_credentials(transport)
        return pid is None or self.producer_alive(pid)

    def _count_unstored(self, pid: int | None, bodies: list[bytes]) -> None:
        """An exited producer's frames the agent stops before storing are lost (a live one
        resends them to the next agent): counted (unstored.py), and reported by the final
        heartbeat, or by the next start when the spool has no room for it."""
        losses = self.ingestor.losses
        if pid is None or self.producer_alive(pid) or losses is None:
            return
        try:
            lost = unstored_losses(bodies, self._stored_or_counted, self.ingestor.stamp(pid))
        except Exception as exc:  # the stop goes on; only this count is missing
            self.metrics.worker_errors.inc(worker="socket", type=type(exc).__name__)
            log.exception("could not count the unstored frames of pid %d", pid)
            return
        losses.record(UNSTORED_AT_STOP, lost.events)
        losses.record_unstored_reports(pid, lost.reports)  # the producer's drops, not ours
        if lost.frames:
            theirs = ", ".join(f"{report.reason}={report.events}" for report in lost.reports)
            log.warning("stopping before %d frames of pid %d were stored: that producer has "
                        "exited and cannot send them again, so their %d events are lost and "
                        "counted (%s)%s; give the sinks room before a stop (`evagg status` "
                        "shows a full spool)", lost.frames, pid, lost.events, UNSTORED_AT_STOP,
                        f"; its own loss reports among them ({theirs}) are counted as that "
                        "producer's drops" if theirs else "")

    async def _handle_body(self, body: bytes, pid: int | None, uid: int | None,
                           transport: asyncio.Transport) -> bool:
        try:
            frame = wire.decode_body(body)
        except wire.FrameError as exc:
            self._refuse(transport, "malformed", str(exc))
            return False
        if not isinstance(frame, (wire.Batch, wire.Columns)):
            self._refuse(transport, "unexpected_frame", "producers may only send batch frames")
            return False
        self._sessions.claim(frame.session)
        stamp = self.ingestor.stamp(pid, uid)
        if isinstance(frame, wire.Columns):
            try:
                result = await self.ingestor.ingest_columns(
                    frame.payload, frame.count, stamp, session=frame.session, seq=frame.seq)
            except ColumnsRefused as exc:  # only our emitter writes COLUMNS: refused whole
                self._refuse(transport, "columns_refused", str(exc), frame.session, frame.seq)
                return False
        else:
            result = await self.ingestor.ingest_frame(frame.payload, stamp,
                                                      session=frame.session, seq=frame.seq)
        # Each refused event's reason (up to ten), so that the producer counts every
        # refusal by its own reason, not all of a frame's by the first.
        note = "; ".join(result.reasons) or result.note
        if result.accepted == 0 and result.rejected > 0:
            self.metrics.bad_input.inc(route="socket", reason="all_events_rejected")
            self._refuse(transport, None, f"no event accepted: {note}",
                         frame.session, frame.seq)
            return False
        if not transport.is_closing():
            transport.write(wire.encode_ack(frame.session, frame.seq, result.accepted,
                                            result.rejected, note))
        return True

    def _refuse(self, transport: asyncio.Transport, reason: str | None, text: str,
                session: bytes = wire.NO_SESSION, seq: int = 0) -> None:
        if reason is not None:
            self.metrics.bad_input.inc(route="socket", reason=reason)
        log.warning("closing producer connection: %s", text[:LOGGED_REASON_CHARS])
        if not transport.is_closing():
            transport.write(wire.encode_nack(session, seq, text))


def peer_credentials(transport: asyncio.BaseTransport) -> tuple[int | None, int | None]:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None, None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None, None
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def prepare_socket_path(path: Path) -> None:
    """Create the directory; remove a stale socket file that nobody listens on. A
    directory another user may change is refused: they could swap the socket for their
    own (and take the producers' events) or for a symlink the agent's chmod follows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    problem = paths.unsafe_directory(path.parent)
    if problem:
        raise RuntimeError(f"agent.socket: {problem}; put the socket in a folder of the "
                           "agent's own user (or root's) that others cannot write")
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # stale: its agent is gone
        return
    finally:
        probe.close()
    raise AddressTaken(f"another agent is already listening on {path}: stop that one first "
                       "(`evagg status` shows it), or give this one a socket of its own "
                       "(agent.socket or --socket; its producers then need $EVAGG_SOCKET)")


def group_id(group: str | None) -> int:
    """-1 (keep the group) for none. The group may have gone since the config was
    checked: a RuntimeError, which `evagg run` reports without a traceback."""
    if not group:
        return -1
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise RuntimeError(f"agent.socket_group: no group named {group!r} on this host") from None


def apply_socket_permissions(path: Path, mode: int, gid: int) -> None:
    if gid != -1:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
