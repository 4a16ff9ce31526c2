"""Ray's failure information -> the error columns (error_type, error_message, stack_trace).

Ray sends no separate exception-class or traceback field: the owner's FAILED task
event carries one text in `rayErrorInfo.errorMessage`, e.g.

    User exception:
    <ANSI>ray::boom()<ANSI> (pid=6525, ip=192.0.2.2)
      File "/job/workload.py", line 13, in boom
        raise ValueError("...")
    ValueError: intentional failure

The exception text is what follows the last traceback frame (it may span lines); the
stack is everything before it, less Ray's "User exception:" banner. Messages that are
not tracebacks (WORKER_DIED or OUT_OF_MEMORY prose) are kept whole as the message.
Actor, node and worker deaths (`deathCause`, `deathInfo`) map to the same columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `ValueError`, `mod.sub.MyError`, `ray.exceptions.RayTaskError(ValueError)`
_EXCEPTION_HEAD = re.compile(r"^([A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::(?:\s|$)|$)")
# Without a traceback before it, a head is a class only when it looks like one: dotted,
# wrapped (`RayTaskError(ValueError)`), or named like Python's exceptions; not "bye",
# "Killed" or "Note: ..." from a death's prose.
_EXCEPTION_NAME = re.compile(r"[.(]|(?:Error|Exception|Interrupt|Exit|Warning|Iteration)$")
_BANNER = "User exception:"
APPLICATION_ERROR = "TASK_EXECUTION_EXCEPTION"  # Ray's type for the task's own exception

# Where each kind of death keeps its type and its text (camelCase, snake_case).
_TYPE_KEYS = ("reason", "exitType", "exit_type", "errorType", "error_type")
_MESSAGE_KEYS = (
    "errorMessage", "error_message", "reasonMessage", "reason_message", "exitDetail",
    "exit_detail", "formattedExceptionString", "formatted_exception_string",
)


@dataclass(frozen=True, slots=True)
class ParsedError:
    message: str  # "ValueError: msg", or the whole text when it is not a traceback
    exception_class: str | None
    stack_trace: str | None


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse_error_message(text: str, *, bare_heads: bool = True) -> ParsedError:
    """The exception text, its class and the stack before it. Without a traceback, a
    head that looks like a class counts only with `bare_heads`."""
    lines = strip_ansi(text).replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[0].strip() == _BANNER:
        lines = lines[1:]
    if not lines:
        return ParsedError("", None, None)
    start, after_frames = _exception_start(lines)
    exception_text = "\n".join(lines[start:]).strip()
    match = _EXCEPTION_HEAD.match(exception_text)
    if match is None or not (after_frames or (bare_heads
                                              and _EXCEPTION_NAME.search(match.group(1)))):
        return ParsedError("\n".join(lines).strip(), None, None)
    stack = "\n".join(lines[:start]).rstrip() or None
    return ParsedError(exception_text, match.group(1), stack)


def _exception_start(lines: list[str]) -> tuple[int, bool]:
    """Index of the first line of the exception text (the first unindented line after
    the last frame), or the last line when there are no frames; and whether it follows
    a frame."""
    last_frame = -1
    for index, line in enumerate(lines):
        if line[:1].isspace() and line.lstrip().startswith('File "'):
            last_frame = index
    if last_frame >= 0:
        for index in range(last_frame + 1, len(lines)):
            if lines[index] and not lines[index][:1].isspace():
                return index, True
    return len(lines) - 1, False


def error_columns(error_type: Any, message: Any) -> dict[str, Any]:
    """Row fields for one failure: error_type, error_message, stack_trace and
    attrs["exception_class"] when the message is a Python traceback."""
    row: dict[str, Any] = {}
    if error_type:
        row["error_type"] = str(error_type)
    if not message:
        return row
    # A worker's, node's or actor's death is grouped by Ray's type: its prose may start
    # with a transport's error (`RpcError: Socket closed`), which names no exception of
    # the task's, and would split one kind of death in two groups. Only a traceback
    # names a class there.
    bare_heads = str(error_type or "") in ("", APPLICATION_ERROR)
    parsed = parse_error_message(str(message), bare_heads=bare_heads)
    row["error_message"] = parsed.message or None
    if parsed.stack_trace:
        row["stack_trace"] = parsed.stack_trace
    if parsed.exception_class:
        row["attrs"] = {"exception_class": parsed.exception_class}
    return row


def death_columns(death: Any, raw_attr: str) -> dict[str, Any]:
    """Error fields for an actor `deathCause` (a oneof of contexts) or a node/worker
    `deathInfo`; the whole object is kept as JSON in attrs[raw_attr]."""
    if not isinstance(death, dict) or not death:
        return {}
    inner = death
    contexts = [v for v in death.values() if isinstance(v, dict)]
    if len(contexts) == 1 and len(death) == 1:
        inner = contexts[0]
    error_type = _first(inner, _TYPE_KEYS)
    if error_type is None and inner is not death:
        context_name = re.sub(r"(?<!^)(?=[A-Z])", "_", next(iter(death))).upper()
        error_type = context_name.removesuffix("_CONTEXT")
    row = error_columns(error_type, _first(inner, _MESSAGE_KEYS))
    attrs = row.setdefault("attrs", {})
    attrs[raw_attr] = orjson.dumps(death, option=orjson.OPT_SORT_KEYS).decode()
    return row


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = obj.get(key)
        if value:
            return value
    return None
