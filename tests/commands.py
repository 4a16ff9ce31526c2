"""`evagg` as a user runs it (a subprocess in the repository), `evagg check-config`, and
`evagg query` in process (its exit code and what it printed)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

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
