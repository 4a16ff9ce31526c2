"""Small conversions from what the store keeps to what Ray's State API shows.

The store keeps Ray's nested fields as the JSON Ray sent (camelCase, ids in base64);
Ray's State API shows them as protobuf's MessageToDict with preserved field names
(snake_case) and the ids it decodes in hex.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")
# The id fields Ray decodes to hex in the messages it shows (actor death causes, ...).
_ID_KEYS = {"actor_id", "owner_id", "node_id", "worker_id", "job_id", "task_id",
            "placement_group_id", "creator_job_id", "parent_task_id"}


# The view's final_state -> Ray's state name (Ray names the sub-state of PENDING; the
# page's rows get theirs from the raw events, a summary counts them as the first).
RAY_STATE_OF = {"SUBMITTED": "SUBMITTED_TO_WORKER", "PENDING": "PENDING_ARGS_AVAIL",
                "DEFINED": "NIL", "UNKNOWN": "NIL"}


def func_or_class_name(function: str | None, task_type: str | None) -> str:
    """Ray's call string of module.Class.function: the function, or Class.method for
    actor tasks."""
    parts = str(function or "").split(".")
    actor = task_type in ("ACTOR_TASK", "ACTOR_CREATION_TASK")
    return ".".join(parts[-2:] if actor else parts[-1:])


def ms_floor(us: int) -> int:
    """Microseconds -> Ray's milliseconds (Ray floors nanoseconds // 1e6)."""
    return int(us // 1000)


def json_or(text: str | None, default: Any) -> Any:
    """The JSON in `text`, or `default` when there is none or it does not parse."""
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def snake(name: str) -> str:
    return _CAMEL.sub(lambda m: "_" + m.group(1).lower(), name)


def b64_to_hex(value: str) -> str:
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value


def camel_to_snake(value: Any, *, ids: bool = False) -> Any:
    """A JSON value with its keys in snake_case; with ids=True, base64 ids in hex."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = snake(str(key))
            if ids and name in _ID_KEYS and isinstance(item, str):
                out[name] = b64_to_hex(item)
            else:
                out[name] = camel_to_snake(item, ids=ids)
        return out
    if isinstance(value, list):
        return [camel_to_snake(v, ids=ids) for v in value]
    return value


def to_int(text: str | None, default: int | None = None) -> int | None:
    try:
        return int(text) if text not in (None, "") else default
    except ValueError:
        return default
