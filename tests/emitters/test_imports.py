"""`import emitters` loads the standard library and orjson only, so that any worker can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Everything a producer touches without an integration: emit, op, flush, stats, close.
_PRODUCER = """
import sys
at_start = set(sys.modules)  # what site and .pth files loaded before us
import emitters
emitters.configure(socket=sys.argv[1], exit_timeout=0.1)
emitters.emit(kind="task", name="import-check")
with emitters.op("step", step=1) as op:
    op.metric(loss=0.5)
emitters.flush(0.1)
emitters.stats()
emitters.close(timeout_s=0.1)
print("\\n".join(sorted({name.partition(".")[0] for name in set(sys.modules) - at_start})))
"""


def test_the_producer_api_imports_only_the_standard_library_and_orjson(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAGG_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", _PRODUCER, str(tmp_path / "none.sock")],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    allowed = set(sys.stdlib_module_names) | {"emitters", "orjson", "__main__"}
    assert "emitters" in loaded
    assert sorted(loaded - allowed) == []
