"""Which stored log file, and which bytes of it, answer one of Ray's log questions.

The same resolution Ray's dashboard makes (ray/dashboard/modules/log/log_manager.py),
from the store instead of a live cluster: a task attempt's stdout or stderr is the byte
range [start, end) its `taskLogInfo` named in its worker's file; an actor's log is the
whole file of the worker it ran in; a node's file is asked by name or by worker pid.
`lines` then keeps the last N lines of that range, cut exactly where Ray cuts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from dashboard.lake.errors import NotFound
from dashboard.lake.store import Store
from dashboard.raystate.logarchive import LogArchive, StoredPiece
from dashboard.raystate.schema import APPLICATION_ERROR
from sinks.raylogs.layout import LogFile

DEFAULT_LINES = 1000  # Ray's DEFAULT_LOG_LIMIT, also where Ray reads lines=0
_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")  # what Ray's filter_ansi_code removes
_WORKER_FILE = re.compile(r"worker-([0-9a-f]+)-([0-9a-f]+)-(\d+)\.(out|err)")

TASK_LOG_ROWS = """
SELECT node_id, actor_id, worker_id, state, error_type, attrs['ray_task_log_info'] AS info
FROM events_raw
WHERE source = 'ray' AND kind = 'task' AND task_id = $task AND coalesce(attempt, 0) = $attempt
  AND attrs['ray_session'] = $session
ORDER BY time
"""
SAME_FILE_STARTS = """
SELECT attrs['ray_task_log_info'] AS info
FROM events_raw
WHERE source = 'ray' AND kind = 'task' AND attrs['ray_session'] = $session
  AND contains(attrs['ray_task_log_info'], $name)
"""
WORKER_NODE = """
SELECT node_id FROM events_raw
WHERE source = 'ray' AND worker_id = $worker AND attrs['ray_session'] = $session
  AND coalesce(node_id, '') <> ''
LIMIT 1
"""
ACTOR_WORKERS = """
SELECT node_id, worker_id, attrs['worker_pid'] AS pid
FROM events_raw
WHERE source = 'ray' AND kind = 'actor' AND actor_id = $actor AND attrs['ray_session'] = $session
  AND coalesce(worker_id, '') <> ''
ORDER BY time DESC
"""
NODE_OF_IP = """
SELECT node_id FROM events_raw
WHERE source = 'ray' AND kind = 'node' AND attrs['ray_node_ip_address'] = $ip
  AND attrs['ray_session'] = $session
ORDER BY time DESC LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class LogAsk:
    """Ray's GetLogOptions, as its client sends them."""

    task_id: str | None = None
    attempt_number: int = 0
    actor_id: str | None = None
    node_id: str | None = None
    node_ip: str | None = None
    filename: str | None = None
    pid: int | None = None
    worker_id: str | None = None  # evagg's own (`evagg query logs --worker`): Ray has none
    suffix: str = "out"
    lines: int = DEFAULT_LINES
    filter_ansi_code: bool = False


@dataclass(frozen=True, slots=True)
class Found:
    log_file: LogFile
    pieces: list[StoredPiece]
    start: int
    end: int | None


def read_log(store: Store, archive: LogArchive, session: str, ask: LogAsk) -> bytes:
    """The bytes Ray's log route would send for `ask`; NotFound in Ray's words."""
    if ask.suffix not in ("out", "err"):
        raise NotFound(f"Suffix {ask.suffix} is not supported.")
    found = resolve(store, archive, session, ask)
    data = archive.read(found.pieces, found.start, found.end)
    lines = ask.lines or DEFAULT_LINES
    if lines != -1:
        data = data[tail_start(data, lines):]
    return _ANSI.sub(b"", data) if ask.filter_ansi_code else data


def resolve(store: Store, archive: LogArchive, session: str, ask: LogAsk) -> Found:
    if ask.actor_id:
        return _actor(store, archive, session, ask)
    if ask.task_id:
        return _task(store, archive, session, ask)
    if ask.worker_id:
        return _worker(store, archive, session, ask)
    node = ask.node_id or node_of_ip(store, session, ask.node_ip)
    if ask.filename:
        return _whole(archive, session, node, lambda name: name == ask.filename.rsplit(
            "/", 1)[-1] if ask.filename else False, ask.filename)
    if ask.pid is not None:
        return _whole(archive, session, node, lambda name: _is_worker_file(
            name, None, ask.pid, ask.suffix), f"pid {ask.pid}")
    raise NotFound("Could not find a log file: give a task_id, an actor_id, or a node_id "
                   "(or node_ip) with a filename or pid")


def tail_start(data: bytes, lines: int) -> int:
    """Where the last `lines` lines of `data` start, as Ray's
    find_start_offset_last_n_lines_from_offset finds it (an unended last line counts)."""
    if lines <= 0 or not data:
        return len(data) if lines == 0 else 0
    if not data.endswith(b"\n"):
        lines -= 1
    at = len(data)
    for _ in range(lines + 1):
        at = data.rfind(b"\n", 0, at)
        if at == -1:
            return 0
    return at + 1


def _task(store: Store, archive: LogArchive, session: str, ask: LogAsk) -> Found:
    rows = store.execute(TASK_LOG_ROWS, {"task": ask.task_id, "attempt": ask.attempt_number,
                                         "session": session}).records()
    if not rows:
        raise NotFound(f"Could not find log file for task: {ask.task_id} (attempt "
                       f"{ask.attempt_number}) with suffix: {ask.suffix}")
    info: dict[str, Any] = {}
    node = ""
    ends: list[int] = []
    for row in rows:  # the executor sends the starts, and the ends once it knows them
        if row["info"]:
            found = _snake(orjson.loads(row["info"]))
            info.update(found)
            node = row["node_id"] or node
            ends.append(int(found.get(f"std{ask.suffix}_end", 0)))
    actor = next((r["actor_id"] for r in rows if r["actor_id"]), None)
    if not info and actor:
        # Ray's words, with the command that reads the actor's log from the lake: `ray
        # logs actor` needs a live cluster's address (docs/ray-logs.md)
        raise NotFound(f"For actor task, please query actor log for actor({actor}): e.g. "
                       f"evagg query logs --actor {actor} (add --err for its stderr). Or set "
                       "RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING=1 in actor's runtime env or when "
                       "starting the cluster.")
    path = info.get(f"std{ask.suffix}_file")
    if not path:
        worker = next((r["worker_id"] for r in reversed(rows) if r["worker_id"]), None)
        raise NotFound(f"Could not find log file for task attempt:{ask.task_id}"
                       f"({ask.attempt_number}): Ray named no log file for it"
                       + _worker_hint(worker, ask.suffix))
    start = int(info.get(f"std{ask.suffix}_start", 0))
    name = str(path).rsplit("/", 1)[-1]
    # An end not past the start is not known yet when only RUNNING events (flushed mid-task)
    # carry it; the executor's later report (no state, or the end's), a FINISHED, or a
    # FAILED for the task's own exception (its worker lived to say so) says the attempt
    # printed nothing. One whose end never came (its worker or node died) runs to the
    # next task's start in the file, or to the file's end.
    end_at: int | None = max(ends, default=start)
    reported = any(r["info"] and r["state"] != "RUNNING" for r in rows) or any(
        r["state"] == "FINISHED" or r["error_type"] == APPLICATION_ERROR for r in rows)
    if end_at is not None and end_at <= start and not reported:
        end_at = _next_start(store, session, name, ask.suffix, start)
    candidates = {f: p for f, p in archive.files(session, node or "_").items() if f.name == name}
    return _choose(candidates, start, end_at, name)


def _next_start(store: Store, session: str, name: str, suffix: str, start: int) -> int | None:
    starts = []
    for (text,) in store.execute(SAME_FILE_STARTS, {"session": session, "name": name}).rows:
        other = _snake(orjson.loads(text))
        if str(other.get(f"std{suffix}_file", "")).endswith("/" + name):
            at = int(other.get(f"std{suffix}_start", 0))
            if at > start:
                starts.append(at)
    return min(starts, default=None)


def _worker_hint(worker: str | None, suffix: str) -> str:
    """What to read instead when an attempt's worker died before Ray named its range: the
    worker's whole file, whose last lines are what it printed last."""
    if not worker:
        return ""
    err = " --err" if suffix == "err" else ""
    return (f" (its worker died before saying where its output went, or it never ran); "
            f"worker {worker}'s whole file ends with what it printed last: "
            f"evagg query logs --worker {worker}{err}")


def _worker(store: Store, archive: LogArchive, session: str, ask: LogAsk) -> Found:
    found = store.execute(WORKER_NODE, {"worker": ask.worker_id, "session": session}).rows
    if not found:
        raise NotFound(f"Worker {ask.worker_id} not found.")
    return _whole(archive, session, str(found[0][0]), lambda name: _is_worker_file(
        name, ask.worker_id, None, ask.suffix), f"worker {ask.worker_id}")


def _actor(store: Store, archive: LogArchive, session: str, ask: LogAsk) -> Found:
    rows = store.execute(ACTOR_WORKERS, {"actor": ask.actor_id, "session": session}).records()
    if not rows:
        raise NotFound(f"Actor ID {ask.actor_id} not found.")
    for row in rows:  # the newest incarnation first, as Ray tries them
        pid = int(row["pid"]) if (row["pid"] or "").isdigit() else None
        files = {f: p for f, p in archive.files(session, row["node_id"] or "_").items()
                 if _is_worker_file(f.name, row["worker_id"], pid, ask.suffix)}
        if files:
            return _choose(files, 0, None, f"the {ask.suffix} file of actor {ask.actor_id}")
    raise NotFound(f"Could not find a log file for actor {ask.actor_id} with suffix "
                   f"{ask.suffix}: its worker's file is not in the store")


def _whole(archive: LogArchive, session: str, node: str | None, wanted: Any,
           what: str) -> Found:
    if not node:
        raise NotFound("Node id needs to be specified (node_id, or a node_ip the store "
                       "knows)")
    files = {f: p for f, p in archive.files(session, node).items() if wanted(f.name)}
    return _choose(files, 0, None, what)


def _choose(files: dict[LogFile, list[StoredPiece]], start: int, end: int | None,
            what: str) -> Found:
    """The newest generation that holds the range (a rotation starts a new one)."""
    if not files:
        raise NotFound(f"Could not find a log file ({what}) in the store: the agent on "
                       "that node did not collect it into this lake ([ray] log_dir; an "
                       "agent ships Ray's logs only into its first Parquet sink's lake: "
                       "docs/ray-logs.md)")
    ordered = sorted(files.items(), key=lambda item: item[0].generation, reverse=True)
    for log_file, pieces in ordered:
        if LogArchive.length(pieces) >= (end if end is not None else start):
            return Found(log_file, pieces, start, end)
    log_file, pieces = ordered[0]
    return Found(log_file, pieces, start, end)


def node_of_ip(store: Store, session: str, ip: str | None) -> str | None:
    if not ip:
        return None
    rows = store.execute(NODE_OF_IP, {"ip": ip, "session": session}).rows
    if not rows:
        raise NotFound(f"Cannot find matching node_id for a given node ip {ip}")
    return str(rows[0][0])


def _is_worker_file(name: str, worker_id: str | None, pid: int | None, suffix: str) -> bool:
    found = _WORKER_FILE.fullmatch(name)
    if found is None or found.group(4) != suffix:
        return False
    return ((worker_id is None or found.group(1) == worker_id)
            and (pid is None or int(found.group(3)) == pid))


def _snake(info: dict[str, Any]) -> dict[str, Any]:
    """taskLogInfo's camelCase keys (or snake_case with Ray's preserve option) as snake."""
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in info.items()}
