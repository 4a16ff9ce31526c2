"""`evagg query logs`: a Ray task's or actor's log from the store, as `ray logs` prints it.

No Ray needed: the bytes come from the log pieces the agents kept (docs/ray-logs.md),
through the same resolution the dashboard's `/api/v0/logs/file` makes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dashboard.lake.errors import BadInput
from dashboard.lake.results import Result
from dashboard.lake.store import Store
from dashboard.raystate import sessions
from dashboard.raystate.logarchive import LogArchive
from dashboard.raystate.logfind import DEFAULT_LINES, LogAsk, read_log

Adder = Callable[[str, str, Callable[[Store, argparse.Namespace], Result]],
                 argparse.ArgumentParser]


def add_logs_parser(add: Adder) -> None:
    logs = add("logs", "a Ray task's, actor's or worker's stdout or stderr (as `ray logs` "
                       "prints it)", logs_of)
    which = logs.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", metavar="ID", help="Ray task id (hex)")
    which.add_argument("--actor", metavar="ID", help="Ray actor id (hex): its worker's file")
    which.add_argument("--worker", metavar="ID", help="Ray worker id (hex): its whole file, "
                                                     "where a task whose worker died printed "
                                                     "last")
    logs.add_argument("--attempt", type=int, default=0, help="the task's attempt (default 0)")
    logs.add_argument("--err", action="store_true", help="stderr instead of stdout")
    logs.add_argument("--tail", type=int, default=DEFAULT_LINES,
                      help=f"the last N lines (default {DEFAULT_LINES}, as Ray's); -1 for all")
    logs.add_argument("--session", help="Ray session name or a unique prefix of it "
                                        "(default: the one that ran the task or actor; "
                                        "Ray's clusters reuse ids, and an id several "
                                        "sessions hold asks for it)")


def logs_of(store: Store, args: argparse.Namespace) -> Result:
    if args.tail == 0 or args.tail < -1:
        raise BadInput("logs: --tail takes a number of lines above 0, or -1 for all")
    ask = LogAsk(task_id=args.task, attempt_number=args.attempt, actor_id=args.actor,
                 worker_id=args.worker, suffix="err" if args.err else "out", lines=args.tail)
    session = sessions.choose_for(store, args.session, task_id=args.task, actor_id=args.actor,
                                  worker_id=args.worker)
    data = read_log(store, LogArchive(store.options), session, ask)
    preamble = b""
    if args.tail > 0:  # what `ray logs` prints first whenever it tails
        preamble = (f"--- Log has been truncated to last {args.tail} lines. Use `--tail` flag "
                    "to toggle. Set to -1 for getting the entire file. ---\n\n").encode()
    return Result([], [], extra={"raw": preamble + data})
