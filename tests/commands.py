"""`evagg` as a user runs it (a subprocess in the repository), `evagg check-config`, and
`evagg query` in process (its exit code and what it printed)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from dashboard.cli.query import add_query_parser, run_query
from tests.agentproc import REPO


def evagg(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="evagg")
    add_query_parser(parser.add_subparsers())
    code = run_query(parser.parse_args(["query", *args]))
    out, err = capsys.readouterr()
    return code, out, err


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    """`evagg check-config ARGS`, with the repository importable as an installed one is."""
    return evagg("check-config", *args, env={**os.environ, "PYTHONPATH": str(REPO)})


def evagg_sql(lake: Path) -> Callable[[str], list[dict[str, Any]]]:
    """`evagg query sql --json` over `lake`, as the user reads it; rows as dicts."""
    def run(sql: str) -> list[dict[str, Any]]:
        done = evagg("query", "sql", "--data", str(lake), "--cache", str(lake.parent / "cache"),
                     "--json", sql, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = orjson.loads(done.stdout)
        return rows
    return run
