"""`evagg query`: the views from the command line, as a table, JSON or CSV.

    evagg query [--data PATH|s3://bucket/prefix] summary
    evagg query tasks --state FAILED --error-type ValueError --since 2h
    evagg query steps --run RUN_ID
    evagg query search "bad shard"
    evagg query sql "SELECT name, count(*) FROM tasks GROUP BY 1"

Bad input (a flag, a value, SQL that does not parse) says what is wrong on stderr and
exits 2; missing data exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dashboard.cli.lake_flags import add_config_flag
from dashboard.cli.output import render
from dashboard.cli.query_artifacts import add_artifacts_parser
from dashboard.cli.query_logs import add_logs_parser
from dashboard.cli.query_traces import add_traces_parser
from dashboard.lake.errors import BadInput, DashboardError, NotFound
from dashboard.lake.results import Result
from dashboard.lake.store import ENGINES, Store, StoreOptions
from dashboard.questions import ledger, queries
from dashboard.questions.filters import TASK_SORTS, TaskFilter
from sinks.units import parse_duration

if TYPE_CHECKING:
    Parsers = argparse._SubParsersAction[argparse.ArgumentParser]

# A task's final_state is one of these (dashboard/sql/tasks.sql ranks them).
FINAL_STATES = ("PENDING", "SUBMITTED", "RUNNING", "FINISHED", "FAILED", "DEFINED", "UNKNOWN")
# What fits a terminal: the table's default; --wide, --json and --csv have every column
# of the tasks view, read off the view itself, so a column added to it shows up here.
SHORT_TASK_COLUMNS = ("task_id", "attempt", "name", "final_state", "node_id", "duration_s",
                      "error_type")
# what `steps --run` took for the run of ops without a run_id before it was named as the
# dashboard names it; scripts that pass it still work
OLD_NO_RUN_ROW = "(no run_id)"
SUMMARY_NOTE = ("tasks counts task attempts, as Ray's own summary does: a task Ray ran "
                "twice (a retry) counts 2")
DRIVERS_NOTE = ("; Ray's driver tasks ({n}) are counted only in the driver rows, as Ray "
                "leaves them out (evagg query tasks lists them)")


def default_data() -> str:
    from emitters.paths import user_data_dir

    return os.environ.get("EVAGG_DATA") or str(user_data_dir())


def add_cache_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--cache", metavar="DIR", default=default,
                        help="where the folded task table is kept (default: $EVAGG_CACHE_DIR, "
                             "else $XDG_CACHE_HOME/evagg, else ~/.cache/evagg)")
    parser.add_argument("--no-cache", dest="no_cache", action="store_const", const=True,
                        default=default, help="fold tasks in memory; write no cache file")


def cache_dir(args: argparse.Namespace) -> str | None:
    from dashboard.lake.fold import default_cache_dir

    if getattr(args, "no_cache", None):
        return None
    return str(getattr(args, "cache", None) or default_cache_dir())


def _store_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # The flags work before and after the subcommand; SUPPRESS keeps a subcommand's
    # unset copy from overwriting a value given before it.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--data", default=default,
                        help="local directory or s3://bucket/prefix (default: the lake of "
                             "--config, else $EVAGG_DATA, else the user's data directory)")
    add_config_flag(parser, default)
    parser.add_argument("--endpoint-url", default=default, help="S3-compatible endpoint URL")
    parser.add_argument("--region", default=default, help="S3 region")
    parser.add_argument("--engine", choices=ENGINES, default=default,
                        help="how to read S3: httpfs, pyarrow, or auto (httpfs, else pyarrow)")
    add_cache_flags(parser, default)
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json", dest="fmt", action="store_const", const="json", default=default,
                       help="print an array of JSON objects, every column (times in UTC, "
                            "ISO 8601), for programs")
    shape.add_argument("--csv", dest="fmt", action="store_const", const="csv", default=default,
                       help="print CSV with a header row, every column (maps and lists as "
                            "JSON text)")


def add_query_parser(subparsers: Parsers) -> argparse.ArgumentParser:
    query = subparsers.add_parser("query", help="query the Parquet store (DuckDB views)",
                                  description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    _store_flags(query, top=True)
    sub = query.add_subparsers(title="queries", metavar="QUERY")
    # the choices as they are when a command line is read: queries added later (ddl) too
    query.set_defaults(command=run_query, query_command=None, query_choices=sub.choices)

    def add(name: str, help_text: str, func: Callable[[Store, argparse.Namespace], Result]
            ) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        _store_flags(parser, top=False)
        parser.set_defaults(query_command=func)
        return parser

    add("summary", "task attempts by state, name, error, job and node (Ray's driver "
        "tasks in rows of their own)", _summary)
    tasks = add("tasks", "the task table, filtered", _tasks)
    tasks.add_argument("--state", help=f"final state: {', '.join(FINAL_STATES)}")
    tasks.add_argument("--name", help="function name")
    tasks.add_argument("--job", help="job id; a Ray job as the summary names it, "
                       "01000000@session_2026-..., keeps to that cluster's job; '(none)': "
                       "tasks sent without one")
    tasks.add_argument("--node", help="node id")
    tasks.add_argument("--session", help="a Ray session's name (session_2026-...) or its "
                       "start (session_2026-12-06: that day's clusters): Ray numbers jobs "
                       "from 01000000 again in every cluster, and `evagg query jobs` lists "
                       "each with its session")
    tasks.add_argument("--error-type", help="error type or exception class, e.g. ValueError "
                       "(a Ray failure is found by its class or by Ray's "
                       "TASK_EXECUTION_EXCEPTION); '(none)': the summary's (no error type)")
    tasks.add_argument("--since", help="ISO time or an age such as 15m, 2h, 3d")
    tasks.add_argument("--until", help="ISO time or an age")
    tasks.add_argument("--sort", choices=sorted(TASK_SORTS), default="time",
                       help="the order, newest or largest first (default time: when the "
                            "attempt was first seen pending, submitted, running or ended)")
    tasks.add_argument("--asc", action="store_true", help="oldest/smallest first")
    tasks.add_argument("--limit", type=int, default=100,
                       help="at most this many rows (default 100; at most 100000)")
    tasks.add_argument("--offset", type=int, default=0,
                       help="skip this many rows first, for the next page")
    shown = tasks.add_mutually_exclusive_group()
    shown.add_argument("--wide", action="store_true",
                       help="every column (the table shows a short set by default; --json "
                            "and --csv always have every column)")
    shown.add_argument("--columns", metavar="A,B,...",
                       help="these columns, any of the tasks view's (`--wide` shows them "
                            "all; docs/queries.md lists them)")
    steps = add("steps", "a training run's steps: ops, failures, seconds (wall time, each "
                "moment once), queue_s, metric spread", _steps)
    steps.add_argument("--run", "--run-id", dest="run", required=True,
                       help=f"run id ('' or '{queries.NO_RUN_ROW}' for ops sent without one)")
    add("runs", "training runs", _runs)
    add("jobs", "Ray's driver jobs: started, ended, and how evagg knows of the end", _jobs)
    add("agents", "node agents: last heartbeat, throughput, losses",
        lambda store, _a: queries.agents(store))
    ledger_parser = add("ledger", "a run's requests: enqueued, started, answered, failed, "
                                  "outstanding", _ledger)
    ledger_parser.add_argument("--run", "--run-id", dest="run", required=True,
                               help="run id")
    ledger_parser.add_argument("--outstanding-after", default="5m",
                               help="a request with no outcome this long after it was "
                                    "enqueued is outstanding (default 5m)")
    ledger_parser.add_argument("--list", action="store_true",
                               help="list the outstanding requests instead of the counts")
    search = add("search", "find tasks, ops and spans by id, name, error or stack", _search)
    search.add_argument("text")
    search.add_argument("--limit", type=int, default=100,
                        help="at most this many rows (default 100; at most 100000)")
    trace = add("timeline", "Ray tasks as a Chrome trace (as `ray timeline` writes it)",
                _timeline)
    trace.add_argument("--job", default="", help="Ray job id (default: every job)")
    trace.add_argument("--session", help="Ray session name or a unique prefix of it "
                                         "(default: the newest)")
    trace.add_argument("--out", required=True, help="the trace file to write (JSON)")
    add_traces_parser(add)
    add_logs_parser(add)
    add_artifacts_parser(add)
    sql = add("sql", "run your own SQL over the views", _sql)
    sql.add_argument("statement")
    return query


def run_query(args: argparse.Namespace) -> int:
    func = getattr(args, "query_command", None)
    if func is None:
        choices = ", ".join(getattr(args, "query_choices", None) or ())
        print(f"evagg query: choose a query: {choices}", file=sys.stderr)
        return 2
    try:
        if func is _tasks:
            _check_task_args(args)
        options = StoreOptions(location=args.data or default_data(),
                               endpoint_url=args.endpoint_url, region=args.region,
                               engine=args.engine or "auto", cache_dir=cache_dir(args),
                               on_long_fold=_tell, persist_after_exit=True)
        store = Store(options)
        try:
            _write(func(store, args), args)
        finally:
            # after the answer is out: task fragments the fold read in place are copied
            # into its cache, by a process of its own once this one exits when that
            # takes long (seconds, once per location; docs/queries.md)
            store.close()
    except DashboardError as exc:
        print(f"evagg query: {exc.message}", file=sys.stderr)
        return 2 if isinstance(exc, BadInput) else 1
    return 0


def _write(result: Result, args: argparse.Namespace) -> None:
    if "raw" in result.extra:  # bytes as stored (evagg query logs)
        sys.stdout.flush()
        sys.stdout.buffer.write(result.extra["raw"])
    else:
        sys.stdout.write(render(result, args.fmt or "table"))
        if "note" in result.extra and (args.fmt or "table") == "table":
            print(result.extra["note"], file=sys.stderr)  # for people: stdout stays the table
    sys.stdout.flush()


def _summary(store: Store, _args: argparse.Namespace) -> Result:
    """Tasks sent without a job id are one job row, failures without an error type one
    error row; each says so instead of reading empty.
    Under the table, a line says what `tasks` counts and where Ray's drivers went."""
    result = queries.summary(store)
    if not {"dimension", "value", "tasks"} <= set(result.columns):
        return result
    dimension, value = result.columns.index("dimension"), result.columns.index("value")
    drivers = 0
    for row in result.rows:
        if row[dimension] in queries.NO_VALUE_LABELS and not row[value]:
            row[value] = queries.NO_VALUE_LABELS[row[dimension]]
        if row[dimension] == "driver":
            drivers += int(row[result.columns.index("tasks")])
    result.extra["note"] = SUMMARY_NOTE + (DRIVERS_NOTE.format(n=drivers) if drivers else "")
    return result


def _tasks(store: Store, args: argparse.Namespace) -> Result:
    flt = TaskFilter.from_mapping({
        "state": args.state, "name": args.name, "job": args.job, "node": args.node,
        "session": args.session, "error_type": args.error_type, "since": args.since,
        "until": args.until})
    if not 1 <= args.limit <= 100_000 or args.offset < 0:
        raise BadInput("--limit must be 1..100000 and --offset not negative")
    columns = _task_columns(args, store.columns("tasks"))
    return queries.tasks(store, flt, sort=args.sort, order="asc" if args.asc else "desc",
                         limit=args.limit, offset=args.offset, columns=columns)


def _check_task_args(args: argparse.Namespace) -> None:
    """Refuse what can only ever match nothing, before the store is opened."""
    state = (args.state or "").strip().upper()
    if state.isidentifier() and state not in FINAL_STATES:  # malformed: TaskFilter says so
        raise BadInput(f"--state {args.state}: not a task state; a task's final state is "
                       f"one of {', '.join(FINAL_STATES)}")
    if args.columns is not None and not _chosen_columns(args):
        raise BadInput("--columns: none given: name one or more columns, e.g. "
                       "--columns task_id,name,final_state")


def _chosen_columns(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(c.strip() for c in (args.columns or "").split(",") if c.strip())


def _task_columns(args: argparse.Namespace, available: list[str]) -> tuple[str, ...]:
    """The columns to show: --columns, every column of the view (--wide, --json, --csv),
    else the short set that fits a terminal."""
    if args.columns is not None:
        chosen = _chosen_columns(args)
        unknown = [c for c in chosen if c not in available]
        if unknown:
            raise BadInput(f"--columns: {', '.join(unknown)}: not a column of the tasks "
                           f"view; choose from {', '.join(available)}")
        return chosen
    if args.wide or (args.fmt or "table") != "table":
        return tuple(available)
    return tuple(c for c in SHORT_TASK_COLUMNS if c in available)


def _jobs(store: Store, _args: argparse.Namespace) -> Result:
    """The `jobs` view (dashboard/sql/ends.sql): an end Ray never exported says how evagg
    inferred it."""
    return store.execute("SELECT * FROM jobs ORDER BY started_at, job_id")


def _runs(store: Store, _args: argparse.Namespace) -> Result:
    """Ops sent without a run_id form a run of their own; its row says so."""
    result = queries.runs(store)
    if "run_id" in result.columns:
        index = result.columns.index("run_id")
        for row in result.rows:
            row[index] = row[index] or queries.NO_RUN_ROW
    return result


def _steps(store: Store, args: argparse.Namespace) -> Result:
    unnamed = args.run in (queries.NO_RUN_ROW, OLD_NO_RUN_ROW)
    return queries.steps(store, "" if unnamed else args.run)


def _ledger(store: Store, args: argparse.Namespace) -> Result:
    try:
        after = parse_duration(args.outstanding_after)
    except ValueError as exc:
        raise BadInput(f"--outstanding-after: {exc}") from None
    query = ledger.outstanding_query if args.list else ledger.summary_query
    result = store.execute(*query(args.run, after))
    if not result.rows:
        raise NotFound(f"no requests for run {args.run!r}")
    return result


def _search(store: Store, args: argparse.Namespace) -> Result:
    if not 1 <= args.limit <= 100_000:
        raise BadInput("--limit must be 1..100000")
    return queries.search(store, args.text, args.limit)


def _tell(message: str) -> None:
    """A line on stderr before a long wait (a first query of a large store)."""
    print(f"evagg query: {message}", file=sys.stderr, flush=True)


def _timeline(store: Store, args: argparse.Namespace) -> Result:
    from dashboard.raystate.timeline import write_trace

    try:
        written = write_trace(store, args.session, args.job, args.out)
    except OSError as exc:
        raise BadInput(f"cannot write {args.out}: {exc.strerror}") from None
    return Result(list(written), [list(written.values())])


def _sql(store: Store, args: argparse.Namespace) -> Result:
    if not has_statement(args.statement):
        raise BadInput("sql: the statement is empty (give a query such as "
                       "\"SELECT count(*) FROM tasks\")")
    return store.execute(args.statement, user_sql=True)


def has_statement(sql: str) -> bool:
    """False for SQL with nothing to run (blank, only comments or semicolons), which
    DuckDB accepts silently; SQL that does not parse is left for execute to report."""
    import duckdb

    if not sql.strip():
        return False
    try:
        return bool(duckdb.extract_statements(sql))
    except duckdb.Error:
        return True
