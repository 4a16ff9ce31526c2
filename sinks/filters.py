"""Per-sink selection of events by kind, source and name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Keep an event when every non-empty list contains its value; empty lists keep all."""

    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @staticmethod
    def of(
        kinds: Sequence[str] = (), sources: Sequence[str] = (), names: Sequence[str] = ()
    ) -> EventFilter:
        return EventFilter(tuple(kinds), tuple(sources), tuple(names))

    @property
    def keeps_all(self) -> bool:
        return not (self.kinds or self.sources or self.names)

    def apply(self, table: pa.Table) -> pa.Table:
        if self.keeps_all or table.num_rows == 0:
            return table
        mask: pa.ChunkedArray | None = None
        for column, allowed in (
            ("kind", self.kinds),
            ("source", self.sources),
            ("name", self.names),
        ):
            if not allowed:
                continue
            hit = pc.fill_null(pc.is_in(table[column], value_set=pa.array(allowed)), False)
            mask = hit if mask is None else pc.and_(mask, hit)
        return table.filter(mask)
