"""What the freshness test (tests/test_freshness.py) and bench (bench/bench_freshness.py)
share: a newcomer's environment on the embedded default, where its lake is, and how long
until an event shows there or on a page, counted when the look that found it began."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.agentproc import REPO, query_lake, short_socket_dir
from tests.ports import free_port


def newcomer_env(home: Path) -> dict[str, str]:
    """This environment less its XDG_ and EVAGG_ settings, with `home` as HOME: no config
    file, the default socket, spool and lake, and an HTTP port of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "EVAGG_"))}
    return {**env, "HOME": str(home), "XDG_RUNTIME_DIR": str(short_socket_dir()),
            "EVAGG_HTTP_LISTEN": f"127.0.0.1:{free_port()}", "PYTHONPATH": str(REPO)}


def default_lake(env: dict[str, str]) -> Path:
    return Path(env["HOME"]) / ".local" / "share" / "evagg" / "parquet"  # the default sink


def lake_rows(lake: Path, sql: str) -> int:
    """The count `sql` gives, 0 while the lake has no file yet."""
    if not any(lake.rglob("*.parquet")):
        return 0
    return int(query_lake(lake, sql)[0][0])


def page_body(url: str) -> str:
    """The body of a 200 answer, or "" while the server is not there or answers otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return ""


def seconds_until(found: Callable[[], bool], since: float, give_up_s: float,
                  what: str) -> float:
    """Seconds from `since` (monotonic) to the start of the first look `found()` that said
    yes, so one slow look does not count as delay; fails once `give_up_s` have passed."""
    while True:
        asked = time.monotonic() - since
        if found():
            return asked
        assert asked < give_up_s, f"{what} not visible after {asked:.1f}s"
        time.sleep(0.2)
