"""The event columns, defined once for producers and the agent.

Types are named here as plain strings so that this module needs nothing beyond
the standard library; `sinks.schema` turns them into the Arrow schema.
"""

from __future__ import annotations

from typing import Final

# An integer `time` is nanoseconds since 1970; one below this (1973-03-03) was sent in
# another unit (seconds, milliseconds, microseconds): refused, naming the unit it looks
# like, rather than stored in January 1970 where no view of recent events shows it.
EARLIEST_TIME_NS: Final = 10**17

# column name -> logical type. Order is the column order in Parquet.
EVENT_FIELDS: Final[dict[str, str]] = {
    "event_id": "string",
    "time": "timestamp_ns",
    "kind": "string",
    "source": "string",
    "name": "string",
    "state": "string",
    "task_id": "string",
    "attempt": "int32",
    "parent_id": "string",
    "job_id": "string",
    "run_id": "string",
    "node_id": "string",
    "worker_id": "string",
    "actor_id": "string",
    "host": "string",
    "pid": "int32",
    "uid": "int32",
    "trace_id": "string",
    "span_id": "string",
    "parent_span_id": "string",
    "step": "int64",
    "duration_s": "float64",
    "error_type": "string",
    "error_message": "string",
    "stack_trace": "string",
    "metrics": "map_string_float64",
    "nonfinite": "list_string",
    "attrs": "map_string_string",
    "received": "timestamp_ns",
}

# Stamped by the agent from the kernel or its own clock; a producer's value is ignored.
AGENT_STAMPED: Final[frozenset[str]] = frozenset({"pid", "uid", "received"})

# Every event must carry these.
REQUIRED: Final[tuple[str, ...]] = ("kind",)

KINDS: Final[tuple[str, ...]] = ("task", "op", "span", "worker", "agent", "loss")
TASK_STATES: Final[tuple[str, ...]] = ("PENDING", "SUBMITTED", "RUNNING", "FINISHED", "FAILED")
OP_STATES: Final[tuple[str, ...]] = ("STARTED", "FINISHED", "FAILED")

# Substrings that mark an environment variable or attribute as secret (upper-cased match).
SECRET_MARKERS: Final[tuple[str, ...]] = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "KEY",
    "CREDENTIAL",
    "AUTH",
    "SESSION",
    "COOKIE",
    "PRIVATE",
)
REDACTED: Final[str] = "[redacted]"


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def redact_environment(env: dict[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-looking names replaced."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}
