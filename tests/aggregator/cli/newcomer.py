"""Run the installed `evagg` command as a user would: its exit code, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.agentproc import REPO


def evagg_command() -> list[str]:
    """The console script beside this interpreter (a virtualenv's bin/evagg), else the
    module, which runs the same `main()`."""
    script = Path(sys.executable).parent / "evagg"
    return [str(script)] if script.exists() else [sys.executable, "-m", "aggregator"]


def evagg(*args: str, stdin: str | None = None, timeout: float = 60,
          env: dict[str, str] | None = None, inherit: bool = True
          ) -> subprocess.CompletedProcess[str]:
    """`env` adds to this process's environment, or replaces it with `inherit=False`."""
    base = dict(os.environ) if inherit else {}
    return subprocess.run([*evagg_command(), *args], cwd=REPO, input=stdin, text=True,
                          capture_output=True, timeout=timeout,
                          env={**base, "PYTHONPATH": str(REPO), **(env or {})})
