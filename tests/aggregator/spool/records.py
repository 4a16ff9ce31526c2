"""Test records for the spool's tests: a fixed size, so a segment holds four of them;
appending them, and the segment files they land in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from aggregator.spool import Spool
from aggregator.spool._segment import HEADER_SIZE, RECORD_OVERHEAD

T = TypeVar("T")
SESSION = bytes(range(1, 17))
PAYLOAD = 500  # bytes per test record unless a test says otherwise
FRAME = RECORD_OVERHEAD + PAYLOAD
SEGMENT = HEADER_SIZE + 4 * FRAME  # four records per segment


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def payload(i: int, size: int = PAYLOAD) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


async def fill(spool: Spool, n: int, *, start: int = 0, seq: bool = False) -> list[int]:
    offsets = []
    for i in range(start, start + n):
        result = await spool.append(payload(i), i % 7 + 1, received_ns=i,
                                    session=SESSION if seq else bytes(16), seq=i + 1 if seq else 0)
        assert result.offset is not None
        offsets.append(result.offset)
    return offsets


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def on_disk(directory: Path) -> int:
    """The segment files' sizes; one unlinked (in the background) meanwhile counts 0."""
    total = 0
    for path in segments(directory):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total
