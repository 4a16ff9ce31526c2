"""An asyncio protocol that cuts a producer's byte stream into frames.

The socket is read straight into one reused buffer per connection (asyncio's
BufferedProtocol: `recv_into`, no new bytes object per read) and each frame is copied
out of it once, as the bytes the handler keeps. Only a frame cut by the buffer's end is
moved, to the buffer's start. (StreamReader's readexactly() moves the whole remaining
buffer on every frame, which costs more than decoding when a producer pipelines several
1 MiB frames.) When frames pile up faster than they are ingested, it pauses reading, so
a fast producer is slowed by TCP-style backpressure instead of growing the agent's
memory. It pauses reading too while the producer does not read its acks (asyncio's
pause_writing): each frame read makes an ack, and acks nobody reads would otherwise
pile up in the agent without bound.

A producer that goes away (it exits, or closes with acks unread) leaves the frames it
wrote and the agent has not read yet in the socket's receive queue. The ack the agent
writes next then fails, and asyncio closes the socket: those frames would be gone, and
nobody would send them again. So the reader keeps a copy of the socket and reads them
as the handler takes frames, bounded as before, until the end of what was written
(docs/wire-protocol.md, "A producer that goes away").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

_LENGTH = struct.Struct(">I")
PAUSE_AT_FRAMES = 8
RESUME_AT_FRAMES = 2
# A connection's buffer starts this small (a node may hold hundreds of quiet producers'
# connections, up to agent.max_connections: bench_connections.py) and grows to the frame
# in progress; it goes back to this size when a read smaller than this, into an empty
# buffer, left it empty (the producer sends whole small frames now). The last read of a
# large frame is often small too, but it does not start empty: shrinking then cost each
# next frame a new buffer (bench_pipeline.py).
SMALL_BUFFER_BYTES = 8 * 1024
# A read that fills the space offered says the producer has sent more: the next read is
# offered twice the space, up to this, so many small frames sent at once are read in
# few calls (bench_frame_reader.py --frame-bytes 2000).
MAX_READ_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last item of a connection: EOF (reason None) or why it must be cut off."""

    reason: str | None = None
    label: str | None = None  # bounded metric label for the reason


class FrameReader(asyncio.BufferedProtocol):
    def __init__(self, max_frame_bytes: int, frame_timeout_s: float,
                 on_acks_unread: Callable[[], None] = lambda: None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._on_acks_unread = on_acks_unread  # counted: the producer may be stuck
        self.frame_timeout_s = frame_timeout_s
        self.frames: asyncio.Queue[bytes | StreamEnd] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.connected = asyncio.Event()
        self._buffer = bytearray(SMALL_BUFFER_BYTES)
        self._read_bytes = SMALL_BUFFER_BYTES // 2  # the least free space a read is offered
        self._offered = 0
        self._start = 0  # the first byte not yet cut into a frame
        self._stop = 0  # the end of the bytes read
        self._paused = False
        self._write_blocked = False  # the producer is not reading its acks
        self._stall_timer: asyncio.TimerHandle | None = None
        self._ended = False
        self._left: socket.socket | None = None  # a gone producer's socket, read to its end

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.connected.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Free space after the bytes read: a frame cut by the buffer's end is moved to
        its start first, and the buffer grows only for a frame larger than it or for the
        larger reads a producer's burst earned (MAX_READ_BYTES)."""
        wanted = max(self._read_bytes, self._missing())
        if len(self._buffer) - self._stop < wanted:
            pending = self._stop - self._start
            if self._start:
                self._buffer[:pending] = self._buffer[self._start:self._stop]
                self._start, self._stop = 0, pending
            if len(self._buffer) - self._stop < wanted:
                self._buffer.extend(bytes(pending + wanted - len(self._buffer)))
        self._offered = len(self._buffer) - self._stop
        return memoryview(self._buffer)[self._stop:]

    def _missing(self) -> int:
        """Bytes still to come of the frame in progress (0 before its length is read)."""
        if self._stop - self._start < _LENGTH.size:
            return 0
        length: int = _LENGTH.unpack_from(self._buffer, self._start)[0]
        return self._start + _LENGTH.size + min(length, self.max_frame_bytes) - self._stop

    def buffer_updated(self, nbytes: int) -> None:
        if self._ended:
            return
        read_into_empty = self._start == self._stop
        if nbytes == self._offered:
            self._read_bytes = min(2 * self._read_bytes, MAX_READ_BYTES)
        self._stop += nbytes
        start, stop, buffer = self._start, self._stop, self._buffer
        cut = False
        with memoryview(buffer) as view:
            while stop - start >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length > self.max_frame_bytes:
                    self._end(f"frame of {length} bytes exceeds the limit of "
                              f"{self.max_frame_bytes}", "oversized")
                    return
                end = start + _LENGTH.size + length
                if stop < end:
                    break
                self.frames.put_nowait(bytes(view[start + _LENGTH.size:end]))
                start, cut = end, True
        self._start = start
        if start == stop:
            self._start = self._stop = 0
            if read_into_empty and nbytes < SMALL_BUFFER_BYTES < len(buffer):
                self._buffer = bytearray(SMALL_BUFFER_BYTES)
                self._read_bytes = SMALL_BUFFER_BYTES // 2
        if cut:
            self._cancel_stall_timer()  # progress: the next partial frame gets a fresh limit
        if self.frames.qsize() >= PAUSE_AT_FRAMES or self._write_blocked:
            self._pause()
        else:
            self._watch_for_stall()

    def frame_taken(self) -> None:
        """The handler took a frame; resume reading once the backlog is small."""
        self._resume_if_due()

    def pause_writing(self) -> None:
        self._write_blocked = True
        self._on_acks_unread()
        self._pause()

    def resume_writing(self) -> None:
        self._write_blocked = False
        self._resume_if_due()

    def _pause(self) -> None:
        if not self._paused and not self._ended:
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._cancel_stall_timer()  # our pause, not the producer's stall

    def _resume_if_due(self) -> None:
        if (self._paused and not self._write_blocked and not self._ended
                and self.frames.qsize() <= RESUME_AT_FRAMES):
            self._paused = False
            if self._left is not None:
                self._read_left()
                return
            self.transport.resume_reading()  # type: ignore[union-attr]
            self._watch_for_stall()

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _watch_for_stall(self) -> None:
        """A frame started but not finished must finish within frame_timeout_s of the
        last completed frame (or of its first byte)."""
        if self._start == self._stop:
            self._cancel_stall_timer()
        elif self._stall_timer is None:
            self._stall_timer = asyncio.get_running_loop().call_later(
                self.frame_timeout_s, self._end,
                f"frame incomplete after {self.frame_timeout_s:g}s", "stalled")

    def read_rest(self) -> None:
        """At the agent's stop, for a producer that has exited: cut every whole frame it
        wrote that is still in the socket into the queue at once, past PAUSE_AT_FRAMES
        (no more than its socket buffer held), so that the handler stores them while the
        stop waits, or counts them lost (unix_socket.py)."""
        if self._ended or self.transport is None:
            return
        try:
            rest = self._left or self.transport.get_extra_info("socket").dup()
            rest.setblocking(False)
        except (OSError, AttributeError):
            return
        self._left = None
        with contextlib.closing(rest):
            while not self._ended:
                try:
                    nbytes = rest.recv_into(self.get_buffer(-1))
                except OSError:  # EAGAIN: nothing more was written
                    return
                if not nbytes:
                    return
                self.buffer_updated(nbytes)

    def take_queued(self) -> list[bytes]:
        """The frames still queued, taken: the handler will not get them."""
        taken: list[bytes] = []
        while not self.frames.empty():
            item = self.frames.get_nowait()
            if isinstance(item, bytes):
                taken.append(item)
        return taken

    def finish(self) -> None:
        """Stop reading: the frames already queued are ingested, then the connection ends."""
        if not self._ended and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._end(None, None)

    def eof_received(self) -> bool:
        """The producer is done sending; keep the transport open so its acks still go out
        (a half-closed producer waits for them). The handler closes it."""
        if self._stop > self._start:
            self._end("connection closed inside a frame", "truncated")
        else:
            self._end(None, None)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed by the handler (exc None), or a write or read failed: the producer
        closed its end. What it wrote before is in the receive queue all the same (a Unix
        stream socket reports the peer's close only once that queue is read): read it on
        a copy of the socket, which asyncio closes after this returns."""
        if exc is None or self._ended or self.transport is None:
            self._end(None, None)
            return
        try:
            left = self.transport.get_extra_info("socket").dup()
            left.setblocking(False)
        except (OSError, AttributeError):
            self._end(None, None)
            return
        self._left = left
        self._paused = self._write_blocked = False  # no more acks go out
        self._read_left()

    def _read_left(self) -> None:
        """The gone producer's frames, until the handler has PAUSE_AT_FRAMES waiting
        (frame_taken() reads on) or the end of what it wrote: all of it is in the
        receive queue already, so nothing is waited for."""
        while self._left is not None and not self._ended:
            if self.frames.qsize() >= PAUSE_AT_FRAMES:
                self._pause()
                return
            try:
                nbytes = self._left.recv_into(self.get_buffer(-1))
            except OSError:  # ECONNRESET once the queue is read, or EAGAIN: no more came
                nbytes = 0
            if not nbytes:
                self.eof_received()
                return
            self.buffer_updated(nbytes)

    def _end(self, reason: str | None, label: str | None) -> None:
        if self._ended:
            return
        self._ended = True
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        self._start = self._stop = 0
        self._buffer = bytearray()  # nothing more is cut: a grown buffer goes now
        if self._left is not None:
            with contextlib.suppress(OSError):
                self._left.close()
            self._left = None
        self.frames.put_nowait(StreamEnd(reason, label))
