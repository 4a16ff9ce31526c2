"""`evagg query ddl`: print the statements that give another engine a lake's `events`
and `tasks` (sinks/fragments/ddl.py writes them; this only prints)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dashboard.cli.lake_flags import add_config_flag
from sinks.fragments.dialects import DIALECTS
from sinks.locations import is_s3_url, no_such_lake

DESCRIPTION = """\
Print the SQL that creates evagg's `events` and `tasks` over a lake in another engine:
Spark (temporary views: paste into spark-sql, or run each statement with spark.sql()),
Trino (Hive connector external tables and views), Athena (external tables and views) or
a plain DuckDB. Nothing is run, and evagg needs no access to that engine.

  evagg query ddl --dialect spark s3://bucket/evagg > evagg-spark.sql
  evagg query ddl --dialect trino --schema evagg s3://bucket/evagg

`tasks` merges the task fragments under _tasks/ with the raw events of the hours that
have none. A lake without _tasks/ gets an empty task_fragments (every hour folds raw):
print the statements again once the agents write fragments.
"""


def add_ddl_parser(query: argparse.ArgumentParser, default_data: Callable[[], str]) -> None:
    """Register `ddl` among the subcommands of `evagg query`'s parser; `default_data`
    gives the lake when the command line names none, as for every `evagg query`."""
    sub = next(action for action in query._actions
               if isinstance(action, argparse._SubParsersAction))
    ddl = sub.add_parser("ddl", help="print the SQL that creates events and tasks over a "
                                     "lake in Spark, Trino, Athena or DuckDB",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    ddl.add_argument("lake", nargs="?", metavar="LAKE",
                     help="local directory or s3://bucket/prefix (default: --data, else "
                          "$EVAGG_DATA, else the user's data directory)")
    ddl.add_argument("--dialect", required=True, choices=DIALECTS,
                     help="the engine whose SQL to print")
    ddl.add_argument("--schema", default="evagg",
                     help="Trino's schema / Athena's database for the tables (default evagg)")
    ddl.add_argument("--catalog", default="hive",
                     help="Trino's catalog, a Hive connector (default hive)")
    # as every query takes them, before or after its name (SUPPRESS keeps a value given
    # before `ddl`)
    ddl.add_argument("--endpoint-url", default=argparse.SUPPRESS,
                     help="S3-compatible endpoint URL: where the lake's task fragments "
                          "are looked for, and what DuckDB's printed secret names")
    ddl.add_argument("--region", default=argparse.SUPPRESS, help="S3 region")
    add_config_flag(ddl, argparse.SUPPRESS)
    ddl.set_defaults(command=run_ddl, default_data=default_data)


def run_ddl(args: argparse.Namespace) -> int:
    from sinks.fragments.ddl import check_names, script
    from sinks.fragments.ddl_lake import Lake, lake_has_fragments

    location = args.lake or getattr(args, "data", None) or args.default_data()
    try:
        lake = Lake.parse(location)
        check_names(args.schema, args.catalog)
        if not is_s3_url(lake.url) and not Path(lake.url).is_dir():
            print(f"evagg query ddl: {no_such_lake(location)}", file=sys.stderr)
            return 1
        if args.dialect in ("trino", "athena") and not is_s3_url(lake.url):
            print(f"evagg query ddl: {args.dialect} reads tables on S3 (or HDFS): the "
                  f"statements name the local path {lake.url}; give the s3:// prefix the "
                  f"lake is copied to", file=sys.stderr)
        fragments = lake_has_fragments(lake)
        if fragments is None:
            fragments = _s3_has_fragments(lake.url, getattr(args, "endpoint_url", None),
                                          getattr(args, "region", None))
        text = script(args.dialect, lake.url, fragments=fragments, schema=args.schema,
                      catalog=args.catalog, endpoint_url=getattr(args, "endpoint_url", None))
    except ValueError as exc:
        print(f"evagg query ddl: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _s3_has_fragments(url: str, endpoint_url: str | None, region: str | None) -> bool:
    """Whether an S3 lake holds a task fragment; when that cannot be looked up, assume it
    does and say so (a table over a missing _tasks/ fails at once, in plain words)."""
    from sinks.locations import S3Location
    from sinks.parquet.layout import TASKS_ROOT

    where = S3Location.parse(url)
    try:
        from sinks.parquet.s3 import make_client

        client: Any = make_client(endpoint_url=endpoint_url, region=region,
                                  path_style=endpoint_url is not None)
        answer = client.list_objects_v2(Bucket=where.bucket,
                                        Prefix=f"{where.prefix}{TASKS_ROOT}/", MaxKeys=1)
        return bool(answer.get("KeyCount"))
    except Exception as exc:  # no boto3, no credentials, no network: print regardless
        print(f"evagg query ddl: could not look for {url}/{TASKS_ROOT}/ ({exc}); the "
              f"statements assume the lake has task fragments", file=sys.stderr)
        return True
