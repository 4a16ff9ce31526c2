"""How soon an event sent with `evagg emit` is visible, on the embedded default.

    python bench/bench_freshness.py [--events 10]

docs/queries.md ("Freshness") promises about ten seconds: the file an event goes into
closes 5 s after it opened (roll_interval), the agent's consumer looks every second and
the dashboard relists a local store every 2 s. This bench starts an agent as a newcomer
does (no config file, an empty HOME) and a dashboard on it, then sends one finished task
at a time and times it from the agent's acknowledgement until a DuckDB query of the lake
finds it, and until the dashboard's /api/tasks lists it; each time is counted when the
query that found it was asked, so a slow query does not count as delay. tests/test_freshness.py
keeps the behaviour (the event arrives, its file closes within seconds) and prints its one
time; this prints the spread, and the promise beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.aggregator.cli.newcomer import evagg, evagg_command  # noqa: E402
from tests.freshness import (  # noqa: E402
    default_lake,
    lake_rows,
    newcomer_env,
    page_body,
    seconds_until,
)
from tests.ports import free_port  # noqa: E402

PROMISE_S = 10.0  # docs/queries.md, "Freshness"
GIVE_UP_S = 60.0


def wait_up(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the {what} did not start")
        time.sleep(0.3)


def time_one(env: dict[str, str], lake: Path, base: str, task_id: str) -> tuple[float, float]:
    """Send a finished task; seconds until the lake has it, and until the dashboard lists it."""
    sent = evagg("emit", "--kind", "task", "--name", "freshness", "--state", "FINISHED",
                 "--field", f'task_id="{task_id}"', env=env, inherit=False)
    if sent.returncode != 0:
        raise SystemExit(sent.stderr)
    taken = time.monotonic()  # `evagg emit` returns once the agent acknowledged it
    sql = f"SELECT count(*) FROM events WHERE task_id = '{task_id}'"
    in_files = seconds_until(lambda: bool(lake_rows(lake, sql)), taken, GIVE_UP_S, task_id)
    url = f"{base}/api/tasks?name=freshness"
    return in_files, seconds_until(lambda: task_id in page_body(url), taken, GIVE_UP_S,
                                   task_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10, help="tasks sent, one at a time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evagg-fresh-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = newcomer_env(home)
        lake = default_lake(env)
        port = free_port()
        log = (Path(tmp) / "processes.log").open("wb")
        agent = subprocess.Popen([*evagg_command(), "run"], cwd=REPO, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        dashboard = subprocess.Popen(
            [*evagg_command(), "dashboard", "--listen", f"127.0.0.1:{port}"], cwd=REPO,
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_up(lambda: evagg("status", env=env, inherit=False).returncode == 0,
                    agent, "agent")
            base = f"http://127.0.0.1:{port}"
            wait_up(lambda: bool(page_body(f"{base}/api/info")), dashboard, "dashboard")
            lake_s, dashboard_s = [], []
            for n in range(args.events):
                in_files, on_page = time_one(env, lake, base, f"fresh{n}")
                lake_s.append(in_files)
                dashboard_s.append(on_page)
                print(f"fresh{n}: lake {in_files:.1f}s, dashboard {on_page:.1f}s", flush=True)
        finally:
            for proc in (dashboard, agent):
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            log.close()
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, {args.events} events, "
          f"promise {PROMISE_S:.0f}s (docs/queries.md)")
    for where, times in (("lake", lake_s), ("dashboard", dashboard_s)):
        print(f"{where:>9}: median {statistics.median(times):.1f}s, "
              f"min {min(times):.1f}s, max {max(times):.1f}s")


if __name__ == "__main__":
    main()
