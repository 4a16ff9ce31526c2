"""Which log files Ray's own events name, and whether the agent may open them.

Only two kinds of name count: the stdout and stderr files of a task's `taskLogInfo`
(stored as attrs `ray_task_log_info`), and the worker files of a worker or actor Ray
exported (`worker-<worker id>-<job id>-<pid>.out|.err` in the session's logs directory,
found by worker id and pid). Nothing else under `log_dir` is ever opened.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

_LOG_SUFFIXES = (".out", ".err")
_WORKER_FILE = re.compile(r"worker-([0-9a-f]+)-([0-9a-f]+)-(\d+)\.(out|err)")  # Ray's own


@dataclass(frozen=True, slots=True)
class NamedFile:
    """A file Ray named: its path, or, for a worker, the pattern of its two files."""

    session: str
    node: str
    path: str  # absolute, as Ray wrote it; for a worker the logs directory
    worker: tuple[str, int] | None = None  # (worker id, pid) when found by pattern

    def matches(self, name: str) -> bool:
        """Whether a file name in the logs directory is this worker's .out or .err."""
        if self.worker is None:
            return False
        worker_id, pid = self.worker
        found = _WORKER_FILE.fullmatch(name)
        return found is not None and found.group(1) == worker_id and int(found.group(3)) == pid


def named_in(batch: pa.RecordBatch) -> list[NamedFile]:
    """The files a batch of Ray rows names (rows of other sources are skipped). Arrow
    picks the few rows that can name one first: making every row's attrs Python objects
    cost a quarter of the agent's CPU on Ray's export (bench/bench_ray_export.py)."""
    return files_named_by_rows(batch.filter(_may_name_files(batch)))


def files_named_by_rows(batch: pa.RecordBatch) -> list[NamedFile]:
    """The files a batch names, each row made Python and looked at."""
    rows = zip(*(batch.column(name).to_pylist()
                 for name in ("source", "kind", "node_id", "worker_id", "attrs")), strict=True)
    out: list[NamedFile] = []
    for source, kind, node, worker, attrs in rows:
        if source != "ray" or not attrs:
            continue
        found = dict(attrs)
        session = found.get("ray_session", "")
        if "ray_task_log_info" in found:
            out.extend(_task_files(session, node or "", found["ray_task_log_info"]))
        pid = found.get("worker_pid", "")
        if kind in ("worker", "actor") and worker and pid.isdigit():
            out.append(NamedFile(session, node or "", "", (worker, int(pid))))
    return out


def _may_name_files(batch: pa.RecordBatch) -> pa.Array:
    """Ray's rows with a task's log info, and Ray's worker and actor rows."""
    log_info = pc.map_lookup(batch.column("attrs"), pa.scalar("ray_task_log_info"), "first")
    worker = pc.is_in(batch.column("kind"), value_set=_worker_kinds())
    ray = pc.equal(batch.column("source"), "ray")
    return pc.fill_null(pc.and_kleene(ray, pc.or_kleene(pc.is_valid(log_info), worker)), False)


@functools.cache
def _worker_kinds() -> pa.Array:
    """Made on first use, not at import (as aggregator/liveness/facts.py's `_strings`)."""
    return pa.array(["worker", "actor"], type=pa.string())


def _task_files(session: str, node: str, text: str) -> list[NamedFile]:
    try:
        info: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(info, dict):
        return []
    out = []
    for key in ("stdoutFile", "stderrFile", "stdout_file", "stderr_file"):
        path = info.get(key)
        if isinstance(path, str) and path.endswith(_LOG_SUFFIXES) and os.path.isabs(path):
            out.append(NamedFile(session, node, path))
    return out


def session_logs_dir(log_dir: Path, session: str) -> Path | None:
    """`<log_dir>/<session>/logs`, or None for a session name that is not one name."""
    if not session or "/" in session or session in (".", ".."):
        return None
    return log_dir / session / "logs"


def inside(root: Path, path: str) -> bool:
    """Whether `path`, every link in it followed, stays under `root` (itself resolved)."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real.startswith(real_root.rstrip("/") + "/")

