"""Every sink type, by the name a [[sinks]] table's `type` gives: the one list of them.

The types' modules are imported when a config's sinks are read, not when this module is:
the sinks load aiohttp and pyarrow, which `evagg status` and `evagg tail` do without.
"""

from __future__ import annotations

from functools import cache

from sinks.sink_type import SinkType


@cache
def sink_types() -> dict[str, SinkType]:
    from sinks.http.sink_type import HTTP
    from sinks.parquet.sink_type import PARQUET

    return {kind.name: kind for kind in (PARQUET, HTTP)}
