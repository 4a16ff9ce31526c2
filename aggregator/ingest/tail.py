"""`GET /v1/tail`: follow events as they are spooled, as NDJSON, filtered by kind and name."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import orjson
import pyarrow as pa
from aiohttp import web

from aggregator.spool import Spool
from sinks.filters import EventFilter
from sinks.schema import batch_from_bytes

_TIME_COLUMNS = ("time", "received")


async def stream_tail(request: web.Request, spool: Spool, *, kinds: list[str],
                      names: list[str], is_ready: Callable[[], bool]) -> web.StreamResponse:
    """Until the client goes away or the agent starts draining."""
    # The position is taken before the headers go out: a client that has seen them sees
    # every event sent after that.
    position = spool.next_offset
    event_filter = EventFilter.of(kinds=kinds, names=names)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        while is_ready() and request.transport is not None \
                and not request.transport.is_closing():
            records = spool.read(position, max_records=100)
            if not records:
                await spool.wait_for(position, 1.0)
                continue
            position = records[-1].offset + 1
            table = pa.Table.from_batches([batch_from_bytes(r.payload) for r in records])
            table = event_filter.apply(table)
            if table.num_rows:
                await response.write(tail_lines(table))
            await asyncio.sleep(0)
    return response


def tail_lines(table: pa.Table) -> bytes:
    """Rows as NDJSON with times as integer nanoseconds and maps as objects."""
    for column in _TIME_COLUMNS:
        index = table.schema.get_field_index(column)
        table = table.set_column(index, column, table[column].cast(pa.int64()))
    rows = table.to_pylist()
    return b"".join(orjson.dumps(_compact(row)) + b"\n" for row in rows)


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if v is not None}
    for key in ("metrics", "attrs"):
        if key in out:
            out[key] = dict(out[key])
    return out
