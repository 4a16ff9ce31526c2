"""A node-hour's task fragment, built from its merged event file with DuckDB.

The hour merge (sinks/parquet/compact.py) calls `write_fragment` on the file it has just
merged, before publishing either: one row per task attempt of that file, the partial fold
of `task_fold.partial_select`, as Parquet with microsecond UTC timestamps. The merged file
holds one row per event_id, so the fragment's `events` count needs no dedupe.

DuckDB is imported here, on first use, in the thread that merges: an agent that never
merges an hour never loads it. One thread and a memory cap keep it from competing with
delivery: a node-hour of a million events folds in about a second, in memory. A busier
hour's fold (about 2.3 million events and up) goes past the cap and DuckDB writes the
rest to disk: to the folder the caller names, never to DuckDB's default (`.tmp` in the
working directory, which is `/` and read-only under systemd and in the DaemonSet), and
no more than the caller says the disk can spare.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sinks.fragments.dialects import dialect
from sinks.fragments.task_fold import FOLD_COLUMNS, partial_select

if TYPE_CHECKING:
    import duckdb

# Fits the DaemonSet's 1 GiB beside the agent; at 256MB a million events' fold would
# spill, for 0.3 CPU s more (docs/performance.md, the hour merge's memory).
MEMORY_LIMIT: Final = "512MB"
FRAGMENT_META_KEY: Final = "evagg.fragment"  # key-value metadata: the merged file's name
_DUCKDB = dialect("duckdb")


def duckdb_micros(column: str, nanos_types: bool) -> str:
    """A timestamp column as TIMESTAMPTZ in microseconds, cut down (not rounded, as DuckDB
    2's cast does), whichever unit the file has: DuckDB 2 reads Parquet nanoseconds as
    TIMESTAMPTZ_NS (`nanos_types`), 1.x as TIMESTAMPTZ already cut."""
    if not nanos_types:
        return column
    return f"CAST(date_trunc('microsecond', {column}) AS TIMESTAMPTZ)"


def fold_projection(present: set[str], nanos_types: bool) -> str:
    """FOLD_COLUMNS from a relation that has the columns `present`: missing ones NULL."""
    out = []
    for column, kind in FOLD_COLUMNS.items():
        if column not in present:
            out.append(f"CAST(NULL AS {kind}) AS {column}")
        elif kind == "TIMESTAMPTZ":
            out.append(f"{duckdb_micros(column, nanos_types)} AS {column}")
        else:
            out.append(column)
    return ", ".join(out)


class NoRoomToFold(OSError):
    """The fold needed more than MEMORY_LIMIT and more disk than it was given to spill to."""


@dataclass(frozen=True, slots=True)
class Spill:
    """Where the fold may write what does not fit under MEMORY_LIMIT, and how much."""

    directory: Path
    max_bytes: int


def write_fragment(events_file: Path, fragment: Path, events_name: str, spill: Spill) -> int:
    """Write the task fragment of `events_file` (a merged Parquet file) to `fragment`;
    returns its rows. `events_name` (the merged file's name in the lake) goes into the
    fragment's key-value metadata. Raises NoRoomToFold when `spill` is too small."""
    import duckdb

    # No insertion order to keep: a fragment's rows are merged in any order, and COPY
    # then streams them out instead of buffering its batches to write them in order.
    con = duckdb.connect(config={"threads": 1, "memory_limit": MEMORY_LIMIT,
                                 "preserve_insertion_order": False,
                                 "temp_directory": str(spill.directory)})
    try:
        # set here, not in the config above: DuckDB 1.5 takes it there and then ignores it
        con.execute(f"SET max_temp_directory_size = '{max(spill.max_bytes, 0)}B'")
        return _write(con, events_file, fragment, events_name,
                      nanos_types=int(duckdb.__version__.split(".")[0]) >= 2)
    except duckdb.OutOfMemoryException as exc:
        if "max_temp_directory_size" not in str(exc):
            raise  # a step that cannot spill ran out of memory: not the disk's doing
        raise NoRoomToFold(f"the task fragment's fold needed more than {MEMORY_LIMIT} of "
                           f"memory and more than the {max(spill.max_bytes, 0) // 2**20} MiB "
                           f"of disk it may use in {spill.directory.parent}: give that disk "
                           "room") from exc
    finally:
        con.close()


def _write(con: duckdb.DuckDBPyConnection, events_file: Path, fragment: Path,
           events_name: str, *, nanos_types: bool) -> int:
    source = f"read_parquet({_literal(str(events_file))})"
    present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    con.execute(f"CREATE TEMP VIEW fragment_rows AS SELECT "
                f"{fold_projection(present, nanos_types)} FROM {source}")
    meta = _literal(events_name)
    # No ORDER BY (a fifth of the time, and a merge needs no order); zstd's fastest
    # level: the fragment is read once per reader's first open.
    con.execute(f"COPY ({partial_select(_DUCKDB, 'fragment_rows')}) "
                f"TO {_literal(str(fragment))} (FORMAT parquet, COMPRESSION zstd, "
                f"COMPRESSION_LEVEL 1, "
                f"KV_METADATA {{'{FRAGMENT_META_KEY}': {meta}}})")
    found = con.execute(f"SELECT count(*) FROM read_parquet({_literal(str(fragment))})"
                        ).fetchone()
    return int(found[0]) if found else 0


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
