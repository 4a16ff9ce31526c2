"""`evagg dashboard`: the web dashboard over a local directory or an s3:// prefix.

    evagg dashboard --data PATH|s3://bucket/prefix [--listen 127.0.0.1:8050]

The application itself is dashboard/web/app.py; this module is the command, kept free of
aiohttp at import time so that registering it costs the CLI nothing.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path
from typing import Any

from dashboard.cli.lake_flags import add_config_flag
from dashboard.lake.errors import BadInput, DashboardError, NoData
from dashboard.lake.store import ENGINES, Store, StoreOptions
from dashboard.web import DEFAULT_LISTEN
from sinks.locations import is_s3_url
from sinks.units import MOST_CONNECTIONS

# A local relist is one os.walk: every 2 s keeps a new file's events on the page within
# seconds (the agent closes a local file 5 s after it opened). On S3 a relist is LISTs.
LOCAL_REFRESH_S = 2.0
S3_REFRESH_S = 5.0
# A browser opens six connections to a host; 256 leaves room for many tabs and the Ray
# State API's clients, and under the 1024 descriptors a shell's soft limit usually allows.
MAX_CONNECTIONS = 256
log = logging.getLogger("evagg.dashboard")
DESCRIPTION = """\
Serve the web dashboard: tasks, training runs, ops, traces and agents, read from the
Parquet files the agent writes (a local directory or an s3:// prefix). Open the address
it prints in a browser; new files show up by themselves. It also answers Ray's State
API, so Ray's own tools work on clusters that are gone (docs/ray.md):

    evagg dashboard                        # the agent's default data directory
    evagg dashboard --data s3://bucket/prefix --listen 0.0.0.0:8050
    ray list tasks --address http://127.0.0.1:8050 --filter state=FAILED
"""


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"--listen must be HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def reachable_from_elsewhere(host: str) -> bool:
    """Whether serving on `host` lets other machines in (0.0.0.0, an interface's address)."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: it may resolve to any interface


def add_dashboard_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "dashboard", help="web dashboard over the Parquet store", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="local directory or s3://bucket/prefix (default: the "
                                       "lake of --config, else $EVAGG_DATA, else the user's "
                                       "data directory)")
    add_config_flag(parser)
    parser.add_argument("--listen", default=DEFAULT_LISTEN,
                        help="HOST:PORT to serve on (default: %(default)s, this machine only; "
                             "0.0.0.0:8050 for every interface)")
    parser.add_argument("--port", type=int, metavar="PORT",
                        help="serve on this port of --listen's host (--port 8055 is "
                             "--listen 127.0.0.1:8055)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint URL")
    parser.add_argument("--region", help="S3 region")
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help="how to read S3: httpfs, pyarrow, or auto (httpfs, else pyarrow)")
    from dashboard.cli.query import add_cache_flags

    add_cache_flags(parser, None)
    parser.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                        help=f"how often to look for new files (default {LOCAL_REFRESH_S:g} on "
                             f"a local directory, {S3_REFRESH_S:g} on s3://, where a LIST costs); "
                             "0 lists the store again for every request")
    parser.add_argument("--query-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="stop a page's query after this long (default 60)")
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                        help="connections served at once; one more is closed at once, so "
                             "that programs holding connections open cannot take the file "
                             "descriptors the dashboard reads the store with (default "
                             "%(default)s: a browser tab opens up to six; raise it for many "
                             "tabs or Ray State API clients, within `ulimit -n`)")
    parser.set_defaults(command=run_dashboard)
    return parser


def open_store(args: argparse.Namespace) -> Store:
    from dashboard.cli.query import cache_dir, default_data

    location = args.data or default_data()
    if not args.data and not is_s3_url(location):
        # The agent's own default: a dashboard started before the first file waits for it
        # (an explicit --data that does not exist is more likely a typo, and says so).
        Path(location).expanduser().mkdir(parents=True, exist_ok=True)
    refresh = args.refresh
    if refresh is None:
        refresh = S3_REFRESH_S if is_s3_url(location) else LOCAL_REFRESH_S
    if refresh < 0 or args.query_timeout <= 0:
        raise BadInput("--refresh must be >= 0 and --query-timeout > 0")
    options = StoreOptions(location=location, endpoint_url=args.endpoint_url,
                           region=args.region, engine=args.engine, refresh_s=refresh,
                           cache_dir=cache_dir(args), on_long_fold=_tell,
                           persist_in_background=True)
    store = Store(options)
    try:
        store.refresh(views=False)  # folds new files; the views wait for a page that needs them
    except NoData as exc:  # start anyway: the pages say so and pick files up when they come
        log.warning("%s", exc.message)
    except DashboardError:
        store.close()
        raise
    return store


def _tell(message: str) -> None:
    """A line before a long wait: the first open of a large store folds it all."""
    print(f"evagg dashboard: {message}", file=sys.stderr, flush=True)


def run_dashboard(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
        if args.port is not None:
            if not 0 <= args.port <= 65535:
                raise BadInput(f"--port must be 0 to 65535, not {args.port}")
            port = args.port
        if not 1 <= args.max_connections <= MOST_CONNECTIONS:
            raise BadInput(f"--max-connections must be 1 to {MOST_CONNECTIONS}, not "
                           f"{args.max_connections}")
        store = open_store(args)
    except DashboardError as exc:
        print(f"evagg dashboard: {exc.message}", file=sys.stderr)
        return 2 if isinstance(exc, BadInput) else 1
    from dashboard.web.app import create_app
    from dashboard.web.serving import serve_until_stopped

    def announce() -> None:  # once the port is open
        described = store.describe()
        print(f"evagg dashboard: {described['location']} ({described['engine']}, "
              f"{described['files']} file{'' if described['files'] == 1 else 's'}) on "
              f"http://{host}:{port}/", flush=True)
        if store.note:
            print(f"evagg dashboard: {store.note}", flush=True)
        if reachable_from_elsewhere(host):
            print(f"evagg dashboard: {host}:{port} can be reached from other machines, and "
                  "the dashboard has no login: anyone who reaches it reads the store",
                  file=sys.stderr, flush=True)

    try:
        serve_until_stopped(create_app(store, timeout_s=args.query_timeout, listen_host=host),
                            host, port, announce, max_connections=args.max_connections)
    except OSError as exc:
        print(f"evagg dashboard: cannot listen on {host}:{port}: {exc.strerror}; another "
              "dashboard may hold it: choose another with --port", file=sys.stderr)
        return 1
    return 0
