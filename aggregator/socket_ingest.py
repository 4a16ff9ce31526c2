"""The Unix socket listener: frames in, acks out, one handler per producer connection.

pid and uid come from the kernel (SO_PEERCRED), never from the payload. A connection
that sends garbage, an oversized length, or stalls in the middle of a frame gets a NACK
with the reason and is closed; every other connection carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import stat
import struct
from pathlib import Path

from aggregator.ingest import Ingestor, SpoolUnavailable
from aggregator.metrics import AgentMetrics
from emitters import wire

log = logging.getLogger("evagg.socket")

_PEERCRED = struct.Struct("3i")
_LENGTH = struct.Struct(">I")


class SocketIngest:
    def __init__(self, ingestor: Ingestor, metrics: AgentMetrics, *, path: Path, mode: int,
                 group: str | None, max_frame_bytes: int, frame_timeout_s: float = 10.0) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self.path = path
        self.mode = mode
        self.group = group
        self.max_frame_bytes = max_frame_bytes
        self.frame_timeout_s = frame_timeout_s
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, inherited: socket.socket | None = None) -> None:
        """Listen on our own socket file, or on one that systemd handed over."""
        if inherited is not None:
            self._server = await asyncio.start_unix_server(self._on_connection, sock=inherited,
                                                           limit=2**20)
            return
        prepare_socket_path(self.path)
        self._server = await asyncio.start_unix_server(self._on_connection, path=str(self.path),
                                                       limit=2**20)
        apply_socket_permissions(self.path, self.mode, self.group)

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close_connections(self, timeout: float) -> None:
        """Let handlers finish the frame they are in, then cancel what is left."""
        if self._handlers:
            _, pending = await asyncio.wait(set(self._handlers), timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.metrics.connections.inc()
        self.metrics.open_connections.inc(1)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the producer went away; its unacked frames will be resent
        except SpoolUnavailable as exc:
            log.error("%s; closing the connection so the producer resends later", exc)
        except Exception as exc:  # one bad connection must never take the agent down
            self.metrics.worker_errors.inc(worker="socket", type=type(exc).__name__)
            log.exception("socket connection failed")
        finally:
            self.metrics.open_connections.inc(-1)
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid = peer_credentials(writer)
        while True:
            head = await reader.read(_LENGTH.size)
            if not head:
                return
            if len(head) < _LENGTH.size:
                rest = await self._read_exactly(reader, _LENGTH.size - len(head))
                if rest is None:
                    await self._refuse(writer, "stalled", "frame length incomplete")
                    return
                head += rest
            (length,) = _LENGTH.unpack(head)
            if length > self.max_frame_bytes:
                await self._refuse(writer, "oversized",
                                   f"frame of {length} bytes exceeds the limit of "
                                   f"{self.max_frame_bytes}")
                return
            body = await self._read_exactly(reader, length)
            if body is None:
                await self._refuse(writer, "stalled",
                                   f"frame incomplete after {self.frame_timeout_s:g}s")
                return
            if not await self._handle_body(body, pid, uid, writer):
                return

    async def _read_exactly(self, reader: asyncio.StreamReader, n: int) -> bytes | None:
        try:
            async with asyncio.timeout(self.frame_timeout_s):
                return await reader.readexactly(n)
        except TimeoutError:
            return None

    async def _handle_body(self, body: bytes, pid: int | None, uid: int | None,
                           writer: asyncio.StreamWriter) -> bool:
        try:
            frame = wire.decode_body(body)
        except wire.FrameError as exc:
            await self._refuse(writer, "malformed", str(exc))
            return False
        if not isinstance(frame, wire.Batch):
            await self._refuse(writer, "unexpected_frame", "producers may only send batch frames")
            return False
        stamp = self.ingestor.stamp(pid, uid)
        result = await self.ingestor.ingest_frame(frame.payload, stamp, session=frame.session,
                                                  seq=frame.seq)
        if result.accepted == 0 and result.rejected > 0:
            self.metrics.bad_input.inc(route="socket", reason="all_events_rejected")
            await self._refuse(writer, None, f"no event accepted: {result.note}",
                               frame.session, frame.seq)
            return False
        writer.write(wire.encode_ack(frame.session, frame.seq, result.accepted, result.rejected,
                                     result.note))
        await writer.drain()
        return True

    async def _refuse(self, writer: asyncio.StreamWriter, reason: str | None, text: str,
                      session: bytes = wire.NO_SESSION, seq: int = 0) -> None:
        if reason is not None:
            self.metrics.bad_input.inc(route="socket", reason=reason)
        log.warning("closing producer connection: %s", text)
        with contextlib.suppress(ConnectionError):
            writer.write(wire.encode_nack(session, seq, text))
            await writer.drain()


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int | None, int | None]:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None, None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None, None
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def prepare_socket_path(path: Path) -> None:
    """Create the directory; remove a stale socket file that nobody listens on."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
    raise RuntimeError(f"another agent is already listening on {path}")


def apply_socket_permissions(path: Path, mode: int, group: str | None) -> None:
    if group:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, mode)
