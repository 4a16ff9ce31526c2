"""A Ray body read into Arrow columns by DuckDB's compiled JSON reader: one row per Ray
event, every value still its JSON text, for `json_rows.py` to check and map.

DuckDB reads the whole body (written to a file: `read_json` reads files), each event as
its minified JSON text, and transforms that into the fields Ray sends today in task
definition and lifecycle events. A field that is not among them (one Ray adds later, a
note of another producer) or a null is told apart by the text's length: the event is
exactly as long as the fields it was read into only when it holds nothing else
(`json_checks.exact`).

DuckDB's reader takes some JSON orjson refuses. A NaN, an infinity or a number past a
double lands in a value, which `json_rows` checks for the type Ray sends (or an orjson
parse of the body follows, which refuses it); a trailing comma leaves no trace in the
values, so a body with one, or with a byte order mark, is not read here at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from typing import Any, Final

import pyarrow as pa

from aggregator.ray.task_shapes import DEFINITION_TAKEN, LIFECYCLE_TAKEN

ENVELOPE: Final = ("eventId", "sourceType", "eventType", "timestamp", "severity", "message",
                   "sessionName", "nodeId")
# Today's payload fields: those the mapping takes, and those it keeps in attrs.
DEFINITION: Final = (*sorted(DEFINITION_TAKEN.camel), "requiredResources", "taskType",
                     "language", "refIds", "labelSelector", "isDetachedActor")
LIFECYCLE: Final = (*sorted(LIFECYCLE_TAKEN.camel - {"taskState"}), "taskLogInfo")
DEFINITIONS: Final = {"TASK_DEFINITION_EVENT": "taskDefinitionEvent",
                      "ACTOR_TASK_DEFINITION_EVENT": "actorTaskDefinitionEvent"}
LIFECYCLE_EVENT: Final = "TASK_LIFECYCLE_EVENT"
LIFECYCLE_KEY: Final = "taskLifecycleEvent"
_STEP: Final = {"state": "JSON", "timestamp": "JSON"}

_TRAILING_COMMA: Final = re.compile(rb",[ \t\r\n]*[\]}]")
_BOM: Final = b"\xef\xbb\xbf"


def _type(fields: tuple[str, ...]) -> dict[str, Any]:
    return {n: [_STEP] if n == "stateTransitions" else "JSON" for n in fields}


def _structure() -> str:
    """Every event as the fields Ray sends today: the envelope's, and the payload of each
    task event type (both definition types share theirs), each value a JSON text."""
    event: dict[str, Any] = dict.fromkeys(ENVELOPE, "JSON")
    event.update(dict.fromkeys(DEFINITIONS.values(), _type(DEFINITION)))
    event[LIFECYCLE_KEY] = _type(LIFECYCLE)
    return json.dumps(event)


QUERY: Final = f"""
WITH raw AS MATERIALIZED (
  SELECT json AS j FROM read_json('{{path}}', format = 'array', records = false,
                                  columns = {{json: 'JSON'}})
)
SELECT j::VARCHAR AS text, strlen(j) AS size,
  try(json_transform(j, '{_structure()}')) AS event
FROM raw
"""


class ColumnarReadError(Exception):
    """DuckDB did not read the body, or it holds JSON only DuckDB takes: the Python path
    maps it whole, and refuses it if it is not Ray's JSON."""


def read_events(body: bytes) -> pa.Table:
    """One row per event of the body, in the body's order: `text`, the event's minified
    JSON text (the same values as the body's: an event this path does not take is parsed
    from it alone), `size`, its length, and `event`, its fields as `_structure` names
    them (null where the event is not an object of objects there)."""
    if not body.strip() or body.startswith(_BOM) or _TRAILING_COMMA.search(body):
        raise ColumnarReadError("JSON that only DuckDB reads")  # it reads nothing as []
    state = _thread_state()
    try:
        with open(state.path, "wb") as file:
            file.write(body)
        return state.connection.execute("EXECUTE ray_body").to_arrow_table()
    except OSError as exc:  # a full tmpfs, a file size limit: the Python path needs none
        raise ColumnarReadError(f"the body's file: {exc}") from None
    except state.errors as exc:
        raise ColumnarReadError(str(exc)[:200]) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(state.path)  # no body stays in the tmpfs, nor a file after a kill


class _ThreadState(threading.local):
    """One DuckDB cursor and one file per decode thread, reused across bodies."""

    connection: Any = None
    path = ""
    errors: tuple[type[BaseException], ...] = ()


_STATE = _ThreadState()
_DATABASE: list[Any] = []  # the one in-memory DuckDB the decode threads' cursors share
_OPENING = threading.Lock()
# DuckDB's allocator keeps what a query freed up to 128 MiB by default: the agent's RSS
# budget (docs/performance.md) cannot lend it that.
_SETTINGS: Final[dict[str, str | bool | int | float | list[str]]] = {
    "threads": 1, "allocator_flush_threshold": "4MB",
    "allocator_bulk_deallocation_flush_threshold": "4MB"}


def _thread_state() -> _ThreadState:
    state = _STATE
    if state.connection is None:
        import duckdb  # about 30 MiB of RSS: loaded with the first body that needs it

        with _OPENING:
            if not _DATABASE:
                _DATABASE.append(duckdb.connect(config=_SETTINGS))
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="evagg-ray-", suffix=".json", dir=folder)
        os.close(fd)  # a name of our own; each body is written there, read and removed
        connection = _DATABASE[0].cursor()
        connection.execute("PREPARE ray_body AS " + QUERY.replace("{path}", path))
        state.path, state.errors, state.connection = path, (duckdb.Error,), connection
    return state
