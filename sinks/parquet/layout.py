"""Where every Parquet file of a lake lives, and what a compacted file says it replaced.

The one owner of the key layout: the sink writes keys with `object_key`, `evagg compact`
finds partitions with `is_partition_directory` and names its output with
`compacted_name`, the S3 store recognises its own uploads with `node_of` and
`spool_prefix`, and the dashboard's fold reads the cover list with `parse_covers`.
A key is `date=YYYY-MM-DD/hour=HH/node=<node>/part-<spool>-<first offset>.parquet`:
derived from the spool, so a retry after a crash rewrites the same key (exactly once).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote

Cover = tuple[str, int]  # (file name, size) of a file a compacted file replaced
COMPACTED_PREFIX: Final = "compacted-"
COMPACTION_META_KEY: Final = "evagg.compacted"  # Parquet key-value metadata of a merged file
_PARTITION_DIRECTORY: Final = re.compile(r"(?:^|/)date=[^/]+/hour=[^/]+/node=[^/]+$")
_NS_PER_SECOND: Final = 1_000_000_000
# Task fragments (sinks/fragments/): `_tasks/<partition>/<compacted file's stem>.pq`. The
# root starts with `_` (Hive's and Spark's hidden prefix) and the files do not end in
# `.parquet`, so neither a listing of the lake nor a `**/*.parquet` glob reads them as
# events.
TASKS_ROOT: Final = "_tasks"
FRAGMENT_SUFFIX: Final = ".pq"
# The event files below a lake's root, as a DuckDB or Spark glob: never `**/*.parquet`,
# which descends into _artifacts/ too, where a shipped file that is itself Parquet stops a
# read with a Hive partition mismatch (docs/parquet-layout.md).
EVENT_GLOB: Final = "date=*/hour=*/node=*/*.parquet"


def partition_for(received_ns: int) -> str:
    """The Hive partition of a receive time: `date=YYYY-MM-DD/hour=HH` (UTC)."""
    t = time.gmtime(received_ns // _NS_PER_SECOND)
    return f"date={t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}/hour={t.tm_hour:02d}"


def object_key(received_ns: int, node_id: str, spool_id: str, first_offset: int) -> str:
    directory = f"{partition_for(received_ns)}/{node_directory(node_id)}"
    return f"{directory}/{spool_prefix(_path_safe(spool_id))}{first_offset:020d}.parquet"


def node_directory(node_id: str) -> str:
    """The `node=<node>` level under an hour, escaped as the sink writes it."""
    return f"node={_path_safe(node_id)}"


def spool_prefix(spool_id: str) -> str:
    """The start of every file name one spool writes (`part-<spool>-`)."""
    return f"part-{spool_id}-"


def spool_prefix_of(name: str) -> str | None:
    """The `part-<spool>-` start of a file name the sink wrote, None for any other name."""
    return name.rsplit("-", 1)[0] + "-" if name.startswith("part-") else None


def node_of(directory: str) -> str | None:
    """The `node=<node>` level of a partition directory, None when it has none."""
    return next((p for p in directory.split("/") if p.startswith("node=")), None)


def is_partition_directory(directory: str) -> bool:
    """Whether a directory is a leaf `date=/hour=/node=` partition, where files live."""
    return _PARTITION_DIRECTORY.search(directory) is not None


def is_lake_file(name: str) -> bool:
    """A finished Parquet file of the lake (a store's staging names start with a dot)."""
    return name.endswith(".parquet") and not name.startswith(".")


def is_compacted_name(name: str) -> bool:
    return name.startswith(COMPACTED_PREFIX)


def compacted_name(input_names: Iterable[str]) -> str:
    """The merged file's name, from its inputs: the same inputs always give the same name,
    so two runs that merge the same files write one file."""
    digest = hashlib.sha256("\n".join(sorted(input_names)).encode()).hexdigest()
    return f"{COMPACTED_PREFIX}{digest[:24]}.parquet"


def fragment_directory(partition_directory: str) -> str:
    """Where the task fragments of a `date=/hour=/node=` directory live."""
    return f"{TASKS_ROOT}/{partition_directory}"


def fragment_key(partition_directory: str, compacted: str) -> str:
    """The key of the task fragment of a compacted file in `partition_directory`: named
    after that file, so one merge writes one fragment."""
    stem = compacted.removesuffix(".parquet")
    return f"{fragment_directory(partition_directory)}/{stem}{FRAGMENT_SUFFIX}"


def compacted_of_fragment(name: str) -> str:
    """The compacted file's name a fragment file's name stands for."""
    return name.removesuffix(FRAGMENT_SUFFIX) + ".parquet"


def is_fragment_name(name: str) -> bool:
    return name.startswith(COMPACTED_PREFIX) and name.endswith(FRAGMENT_SUFFIX)


def encode_covers(inputs: list[str], covers: Iterable[Cover]) -> dict[bytes, bytes]:
    """The key-value metadata a compacted file carries: its inputs and every original file
    (name, size) whose rows it holds."""
    value = json.dumps({"version": 1, "inputs": inputs, "covers": sorted(covers)}).encode()
    return {COMPACTION_META_KEY.encode(): value}


def parse_covers(raw: bytes | str | None) -> set[Cover]:
    """What a compacted file's metadata says it covers (empty when it is not ours)."""
    try:
        recorded = json.loads(raw) if raw else {}
        return {(str(name), int(size)) for name, size in recorded.get("covers", [])}
    except (ValueError, TypeError, AttributeError):
        return set()


def _path_safe(value: str) -> str:
    """Hive-style escaping, so that an odd node id cannot add a directory level."""
    return quote(value, safe="-_.")
