"""Dropping the events of a batch Ray sends again.

Ray's exporter resends a batch byte for byte when our answer is slow (over its 3 s
timeout) or not 2xx, and sends nothing else meanwhile, so remembering the eventIds of
recently stored events catches every resend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any


def ray_event_id(item: Any) -> str | None:
    """The raw eventId of a Ray event (the dedupe key), in either casing; or an id as is."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    value = item.get("eventId") or item.get("event_id")
    return value if isinstance(value, str) and value else None


class RecentEventIds:
    """Ray eventIds stored lately, to drop the events of a resent batch.

    Ray resends a batch byte for byte when the answer is slow (> 3 s) or not 2xx and
    sends nothing else meanwhile, so a window of recent ids catches every resend. Two
    generations of sets bound memory (about 2 x `capacity` ids, ~120 bytes each); when
    the young one fills, the old one is dropped whole. Two steps: `filter_new` only
    looks, `confirm` remembers once the batch is in the spool, so a failed write never
    makes Ray's resend look like a duplicate. Not persisted: after an agent restart a
    resend can be stored twice, and readers of the Parquet dedupe on event_id anyway.
    Accepts raw eventIds or the event objects themselves.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = max(1, capacity)
        self._young: set[str] = set()
        self._old: set[str] = set()
        self._lock = threading.Lock()

    def filter_new(self, events: Iterable[Any], *, remember: bool = False) -> list[bool]:
        """True for each event not seen before (repeats within `events` count as seen).
        Events without an id are always new."""
        out: list[bool] = []
        batch: dict[str, None] = {}  # ordered, so generations age in arrival order
        with self._lock:
            for event in events:
                event_id = ray_event_id(event)
                if event_id is None:
                    out.append(True)
                    continue
                new = not (event_id in batch or event_id in self._young or event_id in self._old)
                batch[event_id] = None
                out.append(new)
            if remember:
                self._add(batch)
        return out

    def split_new(self, events: list[Any]) -> tuple[list[int], list[str]]:
        """The indexes of the events not seen before (as `filter_new`), and their ids in
        order, for `confirm` once they are stored."""
        fresh: list[int] = []
        fresh_ids: list[str] = []
        batch: set[str] = set()
        with self._lock:
            young, old = self._young, self._old
            for index, event in enumerate(events):
                event_id = (event.get("eventId") or event.get("event_id")
                            if type(event) is dict else ray_event_id(event))
                if type(event_id) is not str or not event_id:
                    fresh.append(index)
                elif not (event_id in batch or event_id in young or event_id in old):
                    batch.add(event_id)
                    fresh.append(index)
                    fresh_ids.append(event_id)
        return fresh, fresh_ids

    def confirm(self, events: Iterable[Any]) -> None:
        """Remember these events as stored."""
        found = [i for i in map(ray_event_id, events) if i is not None]
        with self._lock:
            self._add(found)

    def _add(self, event_ids: Iterable[str]) -> None:
        young = self._young
        for event_id in event_ids:
            young.add(event_id)
            if len(young) >= self._capacity:
                self._old, self._young = young, set()
                young = self._young

    def __contains__(self, event: object) -> bool:
        event_id = ray_event_id(event)
        return event_id is not None and (event_id in self._young or event_id in self._old)

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
