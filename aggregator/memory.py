"""Keep the agent's resident memory small under load (bench/bench_pipeline.py --pools).

The agent runs for months beside training jobs that want every byte of host memory, so
freed memory goes back to the kernel rather than sitting in allocator caches:

- Arrow's jemalloc pool, which hands freed pages back within a second, chosen through
  ARROW_DEFAULT_MEMORY_POOL before pyarrow loads (`prefer_returning_pool`), so every
  allocation Arrow makes comes from it from the first one on. Measured, not explained:
  switching pools later with `pyarrow.set_memory_pool()` left peak RSS some 40 MiB higher.
  Purging at once (decay 0) saved another 5 MiB for 20% more agent CPU: not taken.
- One glibc malloc arena for Python's own large objects (frames as bytes): by default
  every thread that allocates gets an arena of its own that keeps its freed pages.
- No pandas: pyarrow imports it, where installed, on its first conversion of Python
  objects, only to recognise pandas ones (`keep_pandas_out`): 30 MiB of peak RSS.

In bench_pipeline on one core, peak RSS fell from about 210 MiB (glibc's malloc for
Arrow) and 240 MiB (Arrow's default mimalloc) to about 155 MiB, at the same CPU per
event. Operators' own ARROW_DEFAULT_MEMORY_POOL and MALLOC_ARENA_MAX still win.
"""

from __future__ import annotations

import gc
import importlib.abc
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

POOL_VARIABLE: Final = "ARROW_DEFAULT_MEMORY_POOL"
PREFERRED_POOL: Final = "jemalloc"
_M_ARENA_MAX: Final = -8  # mallopt's parameter number, from glibc's malloc.h
# Young-generation collections every 50,000 net allocations instead of 700: a Ray or
# OTLP body makes some 20 objects per event, and at 700 the collector ran many times per
# body, re-walking live bodies (20-25% of the Ray path's CPU, bench/bench_ray_ingest.py).
GC_YOUNG_THRESHOLD: Final = 50_000


def prefer_returning_pool() -> None:
    """Call before anything imports pyarrow; later it would be too late to matter."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(POOL_VARIABLE, PREFERRED_POOL)


def arrow_pool_name() -> str:
    """The pool Arrow uses: not the preferred one where pyarrow was built without jemalloc."""
    import pyarrow as pa

    return str(pa.default_memory_pool().backend_name)


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses to import pandas: pyarrow then takes it as not installed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("this evagg command keeps pandas out (aggregator/memory.py)")


def keep_pandas_out() -> None:
    """pyarrow imports pandas, when it is installed, the first time it converts Python
    objects, and DuckDB the first time it binds a parameter, both only to recognise
    pandas objects: 30 MiB in the agent, and 0.25 s in `evagg query`, for nothing. For
    our own commands' processes only (never a library caller's); a pandas imported
    already stays."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


def calm_garbage_collector() -> None:
    """After start-up: the modules and config loaded so far live as long as the agent, so
    freeze them out of every later collection, and collect the young generation rarely."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def cap_malloc_arenas() -> None:
    """One glibc malloc arena for all the agent's threads, unless MALLOC_ARENA_MAX is set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    import ctypes.util  # here, not at the top: every evagg command imports this module

    name = ctypes.util.find_library("c")  # may run ldconfig: once, at the agent's start
    if name is None:
        return
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to cap
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mallopt(_M_ARENA_MAX, 1)
