"""A small Unix-socket peer that speaks emitters.wire as the agent does, with faults on demand.

It stores each batch, NDJSON or COLUMNS (deduplicating on (session, seq), as the agent's
spool does) before it acks, and can: delay acks, close a connection after storing a frame
but before the ack, stay silent on a connection, nack chosen frames, report rejected
events, answer with garbage, or refuse COLUMNS frames as an agent from before them did.
Tests read what it stored; `received` keeps every frame, duplicates included.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from emitters import wire
from emitters.columns_read import read_rows

Batch = wire.Batch | wire.Columns


def short_socket_path() -> Path:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer."""
    base = "/tmp" if os.path.isdir("/tmp") else None
    return Path(tempfile.mkdtemp(prefix="evt-", dir=base)) / "agent.sock"


class FakeAgent:
    def __init__(self, path: Path, *, max_frame_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES,
                 ack_delay: float = 0.0, drop_before_ack: int = 0,
                 silent_connections: int = 0, garbage_connections: int = 0,
                 nack: Callable[[Batch], str | None] | None = None,
                 reject: Callable[[Batch], tuple[int, str] | None] | None = None,
                 columns: bool = True) -> None:
        self.path = path
        self.max_frame_bytes = max_frame_bytes
        self.ack_delay = ack_delay
        self.drop_before_ack = drop_before_ack  # frames after which the connection drops unacked
        self.silent_connections = silent_connections  # first connections never answered
        self.garbage_connections = garbage_connections  # first connections answered with junk
        self.nack = nack
        self.reject = reject
        self.columns = columns  # False: answer COLUMNS as an agent that predates them
        self.received: list[Batch] = []
        self.stored: dict[tuple[bytes, int], Batch] = {}
        self.connections = 0
        self.refused_columns = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._stopping = False

    def start(self) -> FakeAgent:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(16)
        listener.settimeout(0.05)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stopping = True
        for thread in self._threads:
            thread.join(5)
        with self._lock:
            for conn in self._open:
                conn.close()
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self.path.parent.name.startswith("evt-"):  # made by short_socket_path()
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def __enter__(self) -> FakeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests read --------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """Every stored event, in the order its frame was first stored."""
        with self._lock:
            batches = list(self.stored.values())
        return [event for b in batches for event in frame_events(b)]

    def duplicates(self) -> int:
        with self._lock:
            return len(self.received) - len(self.stored)

    def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.01)
        return condition()

    # -- serving ------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
                self._open.append(conn)
            self._spawn(self._serve, conn, number)

    def _serve(self, conn: socket.socket, number: int) -> None:
        conn.settimeout(0.05)
        frames = wire.FrameBuffer(self.max_frame_bytes)
        try:
            while not self._stopping:
                try:
                    data = conn.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    return
                if number <= self.garbage_connections:
                    conn.sendall(b"\xff\xff\xff\xff not a frame")
                    return
                frames.feed(data)
                while (frame := frames.pop()) is not None:
                    if not self._answer(conn, number, frame):
                        return
        except wire.FrameError as exc:
            # As the agent does: a frame it cannot read is refused without a session.
            with contextlib.suppress(OSError):
                conn.sendall(wire.encode_nack(wire.NO_SESSION, 0, str(exc)))
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, number: int, frame: wire.Frame) -> bool:
        """Store and reply to one frame; False closes the connection."""
        if isinstance(frame, wire.Columns) and not self.columns:
            reason = wire.UNKNOWN_TYPE_REASON.format(wire.COLUMNS)  # what decode_body said then
            with self._lock:
                self.refused_columns += 1
            conn.sendall(wire.encode_nack(wire.NO_SESSION, 0, reason))
            return False
        if not isinstance(frame, (wire.Batch, wire.Columns)):
            conn.sendall(wire.encode_nack(wire.NO_SESSION, 0, "producers may only send batches"))
            return False
        reason = self.nack(frame) if self.nack is not None else None
        if reason is not None:
            with self._lock:
                self.received.append(frame)
            conn.sendall(wire.encode_nack(frame.session, frame.seq, reason))
            return True
        with self._lock:
            self.received.append(frame)
            duplicate = (frame.session, frame.seq) in self.stored
            self.stored.setdefault((frame.session, frame.seq), frame)
            dropping = self.drop_before_ack > 0
            if dropping:
                self.drop_before_ack -= 1
        if dropping:
            return False  # stored, but the ack never leaves: the producer must resend
        if number <= self.silent_connections:
            return True
        if self.ack_delay:
            time.sleep(self.ack_delay)
        if duplicate:  # as the agent answers a frame it stored before: both counts 0
            conn.sendall(wire.encode_ack(frame.session, frame.seq, 0, 0, ""))
            return True
        rejected, note = (self.reject(frame) if self.reject is not None else None) or (0, "")
        conn.sendall(wire.encode_ack(frame.session, frame.seq, frame.count - rejected, rejected,
                                     note))
        return True


def frame_events(frame: Batch) -> list[dict[str, Any]]:
    """The events of one stored frame, whichever its type."""
    if isinstance(frame, wire.Columns):
        return read_rows(frame.payload, frame.count)
    return [orjson.loads(line) for line in frame.payload.splitlines() if line]
