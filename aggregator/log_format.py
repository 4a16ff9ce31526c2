"""The agent's own log lines: text for people (under systemd, each line with its priority
for the journal), or one JSON object per line for log pipelines (Loki, Elasticsearch,
CloudWatch) that a Kubernetes node ships from the container's stderr, as Vector's and the
OpenTelemetry Collector's `json` log format.

Chosen with `--log-format` or `EVAGG_LOG_FORMAT` (`text`, the default, or `json`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Final

import orjson

FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message"}`, and `"exception"` with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line).decode()


class JournalFormatter(logging.Formatter):
    """Text for journald: each line led by its syslog priority (`<4>` a warning), as
    sd-daemon(3) asks of a service writing to the journal through stderr, so that
    `journalctl -p warning` finds the agent's warnings; no time of our own, since the
    journal stamps every line."""

    PRIORITIES: Final = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4,
                         logging.INFO: 6, logging.DEBUG: 7}

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = self.PRIORITIES.get(record.levelno, 6)
        # every line of a traceback too: journald reads a prefix per line
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def stderr_is_the_journal(environ: Mapping[str, str] | None = None) -> bool:
    """Whether stderr is the journal's stream (systemd sets JOURNAL_STREAM to its
    device:inode), not a pipe or file a child of the service redirected it to."""
    stream = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    try:
        found = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return f"{found.st_dev}:{found.st_ino}" == f"{device}:{inode}" and bool(inode)


def utc_clock(timestamp: float) -> str:
    """A time of day as the agent's words say it (status, the log's reminders): UTC, one
    zone on every node."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(timestamp))


def log_format_from_environment() -> str:
    """`EVAGG_LOG_FORMAT`, or "text"; a value that is neither is a clear error."""
    value = os.environ.get("EVAGG_LOG_FORMAT", "text").strip().lower() or "text"
    if value not in FORMATS:
        raise ValueError(f"EVAGG_LOG_FORMAT: {value!r} is not one of {', '.join(FORMATS)}")
    return value


QUIET_LIBRARIES = ("botocore", "boto3", "s3transfer")


def configure_logging(*, verbose: bool, log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    text = JournalFormatter() if stderr_is_the_journal() else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else text)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    # boto's INFO lines ("Found credentials in environment variables", once per client:
    # two dozen after an agent's restart looks back at its hours) say nothing to act on
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(logging.DEBUG if verbose else logging.WARNING)
    if log_format == "json":  # nothing else may write raw lines to stderr
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], error: BaseException,
                  trace: TracebackType | None) -> None:
    logging.getLogger("evagg").critical("uncaught %s", kind.__name__,
                                        exc_info=(kind, error, trace))


def _log_uncaught_in_thread(hook: threading.ExceptHookArgs) -> None:
    if hook.exc_value is not None:
        logging.getLogger("evagg").critical(
            "uncaught %s in thread %s", hook.exc_type.__name__,
            hook.thread.name if hook.thread else "?",
            exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback))
