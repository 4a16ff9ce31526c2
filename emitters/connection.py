"""One non-blocking Unix stream connection to the agent: frames out in order, replies in.

The sender thread owns it. It writes whole frames from the outbox in the order queued
(resuming a partial write when the socket is ready again), reads ACK and NACK frames as
they arrive, and knows how long the oldest unanswered frame has been waiting.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from emitters import paths, wire

CONNECT_TIMEOUT_S = 1.0


class ConnectionClosed(ConnectionError):
    """The agent closed the connection or it failed; unacked frames must be resent."""


class Connection:
    def __init__(self, path: str) -> None:
        """Connect at once; raises OSError when no agent listens at `path`, or when it is
        in the user's shared folder under /tmp and another user holds that folder (their
        socket would take this process's events)."""
        if Path(path).parent == paths.shared_tmp_dir():
            problem = paths.unsafe_directory(Path(path).parent)
            if problem:
                raise PermissionError(errno.EACCES, f"not connecting: {problem}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._replies = wire.FrameBuffer()
        self._queue: deque[int] = deque()
        self._sending: tuple[int, memoryview, int] | None = None  # seq, frame, bytes sent
        self.inflight = 0  # frames sent and not yet answered
        self._waiting_since = time.monotonic()

    def fileno(self) -> int:
        return self._sock.fileno()

    def queue(self, seqs: Iterable[int]) -> None:
        self._queue.extend(seqs)

    @property
    def wants_write(self) -> bool:
        return bool(self._queue or self._sending)

    def write(self, frames: Mapping[int, tuple[bytes, int]]) -> list[int]:
        """Send queued frames until the socket is full; the seqs sent completely.

        A queued seq no longer in `frames` (answered meanwhile) is skipped.
        """
        done: list[int] = []
        while True:
            if self._sending is None:
                if not self._queue:
                    return done
                seq = self._queue.popleft()
                entry = frames.get(seq)
                if entry is not None:
                    self._sending = (seq, memoryview(entry[0]), 0)
                continue
            seq, frame, sent = self._sending
            try:
                sent += self._sock.send(frame[sent:])
            except BlockingIOError:
                return done
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from exc
            self._sending = (seq, frame, sent)
            if sent == len(frame):
                self._sending = None
                done.append(seq)
                if not self.inflight:
                    self._waiting_since = time.monotonic()
                self.inflight += 1

    def read(self, on_reply: Callable[[wire.Frame], None]) -> None:
        """Hand each whole reply to `on_reply`; raises ConnectionClosed or wire.FrameError."""
        try:
            data = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            raise ConnectionClosed(str(exc)) from exc
        if not data:
            raise ConnectionClosed("the agent closed the connection")
        self._replies.feed(data)
        while (reply := self._replies.pop()) is not None:
            on_reply(reply)

    def answered(self) -> None:
        """One sent frame got its ACK or NACK: the wait for the next starts now."""
        self.inflight = max(0, self.inflight - 1)
        self._waiting_since = time.monotonic()

    def stalled(self, ack_timeout: float) -> bool:
        """Frames are out and no answer came for `ack_timeout` seconds."""
        return bool(self.inflight) and time.monotonic() - self._waiting_since > ack_timeout

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
