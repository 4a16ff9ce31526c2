"""Ray's own log client (`ray.util.state.get_log`) pointed at a dashboard URL.

Ray 2.60's client finds the dashboard through the GCS and refuses an http:// address,
so the child process replaces that one lookup with the URL, as docs/ray-logs.md's
one-liner does; everything else is Ray's code. One child answers many questions (Ray's
import alone takes seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_CHILD = """
import json, sys
import ray.util.state.api as api
api.ray_address_to_api_server_url = lambda address: address
from ray.util.state import get_log
out = []
for ask in json.loads(sys.stdin.read()):
    try:
        out.append("".join(get_log(**ask)))
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def get_logs(url: str, asks: list[dict[str, Any]]) -> list[Any]:
    """Each ask's text, or {"error": ...} where Ray's client raised."""
    done = subprocess.run([sys.executable, "-c", _CHILD],
                          input=json.dumps([{"address": url, **ask} for ask in asks]),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answers: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers
