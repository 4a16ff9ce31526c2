"""The README's first command: `evagg run --demo` on the embedded default, no config."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import duckdb

from tests.agentproc import REPO, short_socket_dir
from tests.ports import free_port


def newcomer_env(home: Path, runtime: Path | None = None) -> dict[str, str]:
    """An empty HOME, no EVAGG_ settings, a port of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVAGG_", "XDG_"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime or short_socket_dir()),
               EVAGG_HTTP_LISTEN=f"127.0.0.1:{free_port()}", PYTHONPATH=str(REPO))
    return env


def run_demo(home: Path, runtime: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`evagg run --demo 80` as a newcomer runs it."""
    return subprocess.run([sys.executable, "-m", "aggregator", "run", "--demo", "80"],
                          cwd=REPO, env=newcomer_env(home, runtime), capture_output=True,
                          text=True, timeout=120)


def test_the_demo_beside_a_running_agent_says_to_stop_that_one_first(tmp_path: Path) -> None:
    runtime = short_socket_dir()
    running = subprocess.Popen([sys.executable, "-m", "aggregator", "run"], cwd=REPO,
                               env=newcomer_env(tmp_path, runtime), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert running.stdout is not None
        for line in running.stdout:  # until it is up: its spool locked, its socket bound
            if "evagg agent ready:" in line:
                break
        done = run_demo(tmp_path, runtime)
    finally:
        running.terminate()
        running.wait(60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "is in use by another evagg agent" in done.stderr, done.stderr
    assert "the demo starts an agent of its own on the defaults: stop the running one" \
        in done.stderr, done.stderr

def test_demo_writes_parquet_whose_task_durations_agree_with_their_states(
    tmp_path: Path,
) -> None:
    done = run_demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lake = tmp_path / ".local" / "share" / "evagg" / "parquet"
    assert f"Parquet written under {lake}" in done.stdout
    assert "report made-up durations" in done.stdout  # nobody mistakes them for timings
    # Every op's average shows a figure, not 0: the no-op ops take about a microsecond
    # (milliseconds on a machine busy with other work).
    op_rows = [line for line in done.stdout.splitlines() if "│ op" in line and "FINISHED" in line]
    assert len(op_rows) == 3 and all(re.search(r"│ (?!0\.0 )\d+\.\d (µs|ms|s) ", r)
                                     for r in op_rows), op_rows
    # The demo's events outlive it in the default store: it says so, and how to clear them.
    assert f"The demo's events stay in\n  {lake}\nbeside" in done.stdout
    assert f"rm -r {lake}\n" in done.stdout and "WHERE source <> 'demo'" in done.stdout
    con = duckdb.connect()
    rows = con.execute(
        "SELECT r.time, f.time, f.duration_s FROM read_parquet($glob) AS r "
        "JOIN read_parquet($glob) AS f USING (task_id) "
        "WHERE r.state = 'RUNNING' AND f.state IN ('FINISHED', 'FAILED')",
        {"glob": f"{lake}/**/*.parquet"}).fetchall()
    assert len(rows) == 10  # 80 events: ten steps, one task each
    for running, ended, reported in rows:
        between = (ended - running).total_seconds()
        # both times are the demo's own, so they agree to the file's microsecond
        assert 0.01 <= reported <= 0.2 and abs(between - reported) <= 2e-6


def test_demo_and_the_sql_it_prints_read_the_events_beside_a_shipped_parquet_file(
    tmp_path: Path,
) -> None:
    """A lake that holds a shipped file which is itself Parquet (a profile exported as
    Parquet, shipped from a [[files]] directory into `_artifacts/`): the demo's query, and
    the same SQL copied from its output, read the event files alone. With `**` in the glob
    the demo ended in a traceback ("Hive partition mismatch ... key "v" not found")."""
    lake = tmp_path / ".local" / "share" / "evagg" / "parquet"
    shipped = lake / "_artifacts" / "node=gpu-1" / "profile.parquet" / "v=0001"
    shipped.mkdir(parents=True)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT 'matmul' AS op, 12.5 AS self_cuda_us) "
                f"TO '{shipped / 'profile.parquet'}' (FORMAT parquet)")
    done = run_demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    # the table it printed counts the demo's ten steps of ops
    assert re.search(r"│ op +│ forward +│ FINISHED │ +10 │", done.stdout), done.stdout
    # and the SQL it printed, run by hand, gives the same rows
    sql = done.stdout.split("Query it with DuckDB:\n\n", 1)[1].split(";\n", 1)[0]
    rows = con.execute(sql).fetchall()
    assert ("op", "forward", "FINISHED", 10) in [row[:4] for row in rows]
    assert sum(row[3] for row in rows) == 80


def test_the_demo_on_a_port_another_program_holds_says_the_same(tmp_path: Path) -> None:
    """The port a running agent (or anything) listens on: the same advice, by the clash's
    type, not by its words."""
    env = newcomer_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["EVAGG_HTTP_LISTEN"] = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "aggregator", "run", "--demo", "80"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "something is already listening on" in done.stderr, done.stderr
    assert "the demo starts an agent of its own on the defaults" in done.stderr, done.stderr
