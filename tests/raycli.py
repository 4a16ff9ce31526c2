"""Ray's own `ray` command, as a user runs it against evagg's State API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).with_name("ray"))


def ray_list(url: str, resource: str, *args: str) -> list[dict[str, Any]]:
    """`ray list RESOURCE --address URL --detail --format json ARGS`; fails the test on a
    non-zero exit, with what Ray printed."""
    done = subprocess.run([RAY, "list", resource, "--address", url, "--detail", "--format",
                           "json", "--limit", "10000", *args], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found
