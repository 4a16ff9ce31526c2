"""FrameReader over a real Unix socket pair: frames cut correctly, stalls cut off, a steady
stream never mistaken for a stall."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from aggregator.ingest.frame_reader import SMALL_BUFFER_BYTES, FrameReader, StreamEnd
from emitters import wire


async def reader_over_socketpair(timeout_s: float) -> tuple[FrameReader, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader = FrameReader(max_frame_bytes=1 << 20, frame_timeout_s=timeout_s)
    await asyncio.get_running_loop().create_connection(lambda: reader, sock=ours)
    theirs.setblocking(False)
    return reader, theirs


def frame(n: int) -> bytes:
    return wire.encode_batch(b"S" * 16, n, 1, b'{"kind": "op"}' * 20)


def test_a_steady_stream_cut_mid_frame_is_not_a_stall() -> None:
    async def main() -> list[bytes | StreamEnd]:
        got: list[bytes | StreamEnd] = []
        reader, peer = await reader_over_socketpair(timeout_s=1.0)
        stream = b"".join(frame(n) for n in range(1, 41))
        # 40 frames over ~2.4 s in pieces that end mid-frame: longer than the timeout in
        # total, but every piece completes a frame well within it, even on a busy machine
        for start in range(0, len(stream), 151):
            peer.send(stream[start:start + 151])
            await asyncio.sleep(0.06 * 151 / len(frame(1)))
            while not reader.frames.empty():
                got.append(reader.frames.get_nowait())
                reader.frame_taken()
        await asyncio.sleep(0.1)
        while not reader.frames.empty():
            got.append(reader.frames.get_nowait())
        peer.close()
        return got

    items = asyncio.run(main())
    assert not any(isinstance(i, StreamEnd) and i.reason for i in items)
    assert len([i for i in items if isinstance(i, bytes)]) == 40


def test_a_frame_that_stops_arriving_is_cut_off() -> None:
    async def main() -> StreamEnd:
        reader, peer = await reader_over_socketpair(timeout_s=0.2)
        peer.send(frame(1)[:10])
        item = await asyncio.wait_for(reader.frames.get(), 5)
        assert isinstance(item, StreamEnd)
        peer.close()
        return item

    end = asyncio.run(main())
    assert end.label == "stalled" and "incomplete" in (end.reason or "")


def test_oversized_length_ends_the_stream_with_a_reason() -> None:
    async def main() -> StreamEnd:
        reader, peer = await reader_over_socketpair(timeout_s=5)
        peer.send((2 << 20).to_bytes(4, "big"))
        item = await asyncio.wait_for(reader.frames.get(), 5)
        assert isinstance(item, StreamEnd)
        peer.close()
        return item

    assert asyncio.run(main()).label == "oversized"


def test_frames_of_every_size_in_any_pieces_come_out_whole_and_in_order() -> None:
    """Small frames, frames larger than the connection's first buffer, one just under the
    limit, sent in pieces that cut lengths and bodies anywhere: each comes out as sent."""
    rng = random.Random(7)
    sizes = [0, 1, 3, 100, 40_000, 65_536, 70_000, 300_000, (1 << 20) - 1, 5, 200_000, 2]
    bodies = [rng.randbytes(n) for n in sizes]
    stream = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)

    async def main() -> list[bytes | StreamEnd]:
        reader, peer = await reader_over_socketpair(timeout_s=30)
        got: list[bytes | StreamEnd] = []
        position = 0
        while position < len(stream):
            piece = stream[position:position + rng.choice((1, 3, 4, 7, 1000, 70_000, 400_000))]
            sent = 0
            while sent < len(piece):
                try:
                    sent += peer.send(piece[sent:])
                except BlockingIOError:
                    await asyncio.sleep(0.001)
            position += len(piece)
            await asyncio.sleep(0)
            while not reader.frames.empty():
                got.append(reader.frames.get_nowait())
                reader.frame_taken()
        peer.close()
        while not got or not isinstance(got[-1], StreamEnd):
            got.append(await asyncio.wait_for(reader.frames.get(), 10))
            reader.frame_taken()
        return got

    items = asyncio.run(main())
    assert items[-1] == StreamEnd(None, None)
    assert items[:-1] == bodies


def test_a_connection_closed_inside_a_frame_says_truncated() -> None:
    async def main() -> StreamEnd:
        reader, peer = await reader_over_socketpair(timeout_s=5)
        peer.send(frame(1) + frame(2)[:-3])
        peer.close()
        while True:
            item = await asyncio.wait_for(reader.frames.get(), 5)
            if isinstance(item, StreamEnd):
                return item

    assert asyncio.run(main()).label == "truncated"


def test_a_buffer_grown_for_a_large_frame_shrinks_when_the_producer_sends_little() -> None:
    """The memory promise of docs/performance.md: a quiet connection holds the small
    buffer, whatever large frame it carried before, and an ended one holds none."""
    big = (300_000).to_bytes(4, "big") + bytes(300_000)

    async def main() -> tuple[int, int, int]:
        reader, peer = await reader_over_socketpair(timeout_s=30)
        peer.setblocking(True)
        sending = asyncio.create_task(asyncio.to_thread(peer.sendall, big))  # > the socket's buffer
        assert await asyncio.wait_for(reader.frames.get(), 10) == big[4:]
        reader.frame_taken()
        await sending
        grown = len(reader._buffer)
        peer.sendall(frame(1))
        assert isinstance(await asyncio.wait_for(reader.frames.get(), 10), bytes)
        reader.frame_taken()
        quiet = len(reader._buffer)
        peer.close()
        assert await asyncio.wait_for(reader.frames.get(), 10) == StreamEnd(None, None)
        return grown, quiet, len(reader._buffer)

    grown, quiet, ended = asyncio.run(main())
    assert grown >= 300_000 and quiet == SMALL_BUFFER_BYTES and ended == 0


def test_a_large_frame_ended_by_a_small_read_keeps_the_grown_buffer() -> None:
    """The next large frame from a busy producer reuses the buffer, not a new one."""
    big = (300_000).to_bytes(4, "big") + bytes(300_000)

    async def main() -> int:
        reader, peer = await reader_over_socketpair(timeout_s=30)
        peer.setblocking(True)
        await asyncio.to_thread(peer.sendall, big[:-1000])
        while reader._stop < len(big) - 1000:  # every byte sent so far is read
            await asyncio.sleep(0.01)
        peer.sendall(big[-1000:])  # the frame's end, in one read smaller than the buffer
        assert await asyncio.wait_for(reader.frames.get(), 10) == big[4:]
        reader.frame_taken()
        peer.close()
        return len(reader._buffer)

    assert asyncio.run(main()) >= 300_000


def test_many_small_frames_sent_at_once_are_read_in_few_reads() -> None:
    """A quiet connection's buffer is small, but a producer that sent a burst of small
    frames has its bytes read in growing reads, not one small buffer's worth at a time."""
    burst = b"".join(frame(n) for n in range(1, 401))  # about 125 kB of 314-byte frames

    async def main() -> tuple[int, int]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.sendall(burst)  # all of it waits in the kernel before the first read
        reader = FrameReader(max_frame_bytes=1 << 20, frame_timeout_s=30)
        reads = 0
        counted = reader.buffer_updated

        def count_reads(nbytes: int) -> None:
            nonlocal reads
            reads += 1
            counted(nbytes)

        reader.buffer_updated = count_reads  # type: ignore[method-assign]
        await asyncio.get_running_loop().create_connection(lambda: reader, sock=ours)
        frames = 0
        while frames < 400:
            assert isinstance(await asyncio.wait_for(reader.frames.get(), 10), bytes)
            reader.frame_taken()
            frames += 1
        theirs.close()
        return frames, reads

    frames, reads = asyncio.run(main())
    assert len(burst) // 8 > SMALL_BUFFER_BYTES  # a small buffer alone would take 8+ reads
    assert frames == 400 and reads <= 7, reads


@pytest.mark.parametrize("tail", [b"", b"\x00\x00\x10"], ids=["whole", "cut"])
def test_what_a_producer_wrote_before_it_went_away_is_read_to_the_end(tail: bytes) -> None:
    """A producer writes frames faster than they are taken (the reader pauses, the rest
    wait in the socket), then closes with an ack unread, as a producer that exits while
    a full spool holds its frames does. The next ack fails to go out and asyncio closes
    the socket; every frame the producer wrote still comes out, in order, as the handler
    takes them, then the end (truncated when the last frame was cut)."""
    bodies = [wire.encode_batch(b"S" * 16, n, 1, b'{"kind": "op"}' * 300) for n in range(1, 41)]

    async def main() -> list[bytes | StreamEnd]:
        reader, peer = await reader_over_socketpair(timeout_s=5)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        peer.sendall(b"".join(bodies) + tail)  # about 170 KiB: the socket holds it
        await asyncio.sleep(0.2)  # the reader reads, and pauses with frames waiting
        assert reader.frames.qsize() < len(bodies)
        assert reader.transport is not None
        reader.transport.write(b"ack")
        await asyncio.sleep(0.05)
        peer.close()  # its ack unread: the agent's side is reset
        reader.transport.write(b"ack")  # fails: asyncio closes the socket
        got: list[bytes | StreamEnd] = []
        while not got or not isinstance(got[-1], StreamEnd):
            got.append(await asyncio.wait_for(reader.frames.get(), 5))
            reader.frame_taken()
        return got

    items = asyncio.run(main())
    assert items[:-1] == [body[4:] for body in bodies]
    assert items[-1] == (StreamEnd("connection closed inside a frame", "truncated") if tail
                         else StreamEnd(None, None))
