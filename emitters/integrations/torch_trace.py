"""PyTorch profiler traces written where the agent ships them (docs/pytorch.md, "Traces").

    with torch.profiler.profile(schedule=..., on_trace_ready=emitters.torch.trace_handler(
            run_id="exp-42")) as prof:
        ...

Each trace is the Chrome trace JSON of `export_chrome_trace`, written as a hidden
`.<name>.tmp` beside its final name and renamed into place, so the agent (which never
ships hidden or `.tmp` names) sees only whole files. Only the standard library here;
torch hands the profiler in.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from emitters.paths import user_state_dir

log = logging.getLogger("evagg.torch")
TRACE_DIR_VARIABLE = "EVAGG_TRACE_DIR"
TRACE_SUFFIX = ".pt.trace.json"  # as torch's own tensorboard_trace_handler names them


def default_trace_dir() -> Path:
    """$EVAGG_TRACE_DIR, else `traces` in the user's evagg state directory."""
    configured = os.environ.get(TRACE_DIR_VARIABLE)
    return Path(configured) if configured else user_state_dir() / "traces"


class TraceHandler:
    """The `on_trace_ready` callback: one finished trace file per call. Never raises into
    the training loop: a trace that cannot be written is counted in `errors` and logged."""

    def __init__(self, directory: Path, run_id: str | None) -> None:
        self.directory = directory / run_id if run_id else directory
        self.written: list[Path] = []  # every trace file written, oldest first
        self.errors = 0

    def __call__(self, prof: Any) -> None:
        final = self.directory / self._name()
        scratch = final.with_name(f".{final.name}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(scratch))
            os.replace(scratch, final)
        except Exception as exc:  # a trace is worth less than the training run
            self.errors += 1
            log.warning("could not write the profiler trace %s (%s: %s); training goes on",
                        final, type(exc).__name__, exc)
            scratch.unlink(missing_ok=True)
            return
        self.written.append(final)

    @staticmethod
    def _name() -> str:
        return f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}{TRACE_SUFFIX}"


def trace_handler(dir: str | os.PathLike[str] | None = None,
                  run_id: str | None = None) -> TraceHandler:
    """A callback for `torch.profiler.profile(on_trace_ready=...)` that writes each trace
    into `dir` (default: $EVAGG_TRACE_DIR, else ~/.local/state/evagg/traces), under a
    folder named after `run_id` (default: the run `emitters.configure()` set, else
    $EVAGG_RUN_ID; none: in `dir` itself). Point a
    `[[files]]` table at `dir` and the agent ships every trace with its run."""
    directory = Path(dir) if dir is not None else default_trace_dir()
    return TraceHandler(directory, run_id or _configured_run_id())


def _configured_run_id() -> str | None:
    """The run `emitters.configure(run_id=...)` set, else $EVAGG_RUN_ID."""
    import emitters  # here: the package's face imports the emitter, which this precedes

    configured = emitters.get_emitter().identity.get("run_id")
    return str(configured) if configured else os.environ.get("EVAGG_RUN_ID") or None
