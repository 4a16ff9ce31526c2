"""Where a shipped file (an artifact) lives in the lake, shared by the agent and the readers.

```
<lake>/_artifacts/node=<node id>/<name>/v=<version>/<file name>
```

The `_artifacts` root starts with `_`, so no Hive listing or `evagg compact` walk reads it
as events; DuckDB's `**/*.parquet` glob does descend into it (a shipped file that is itself
Parquet is then read as events, or stops the query), so readers use the layout's glob,
`date=*/hour=*/node=*/*.parquet`. `<name>` is the file's path below its watched
directory, escaped into one key level; `<version>` counts the times the agent shipped a
different content under that name (0001 first); `<file name>` is the file's own last
path part, so a downloaded object keeps its name. An object is never rewritten with
other bytes: a file rewritten after shipping becomes the next version.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sinks.raylogs.layout import key_part

ARTIFACTS_ROOT: Final = "_artifacts"
ARTIFACT_KIND: Final = "artifact"  # the index event's kind


def artifact_key(node: str, name: str, version: int) -> str:
    """The object key of one version of one artifact of one node."""
    base = name.rsplit("/", 1)[-1]
    return (f"{ARTIFACTS_ROOT}/node={key_part(node)}/{key_part(name)}/"
            f"v={version:04d}/{key_part(base)}")


def artifact_event_id(node: str, name: str, version: int) -> str:
    """The index event's id: the same for the same version, so an event written again
    after a kill is recognisably the same one (readers keep one per id)."""
    digest = hashlib.sha256(f"{node}\0{name}\0{version}".encode()).hexdigest()
    return f"artifact-{digest[:32]}"
