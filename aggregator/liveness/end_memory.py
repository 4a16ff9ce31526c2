"""The keys of attempts that ended, so that a start arriving after its own end opens
nothing: the latest `limit` of them, or a little more.

It is fed once per stored batch, on the event loop, and most batches of a busy node are
ends (a training loop's ops are each one FINISHED event), while a lookup comes with every
start (most of Ray's rows). So a batch's ends arrive as one frozenset made in the decode
thread and are kept as they are, in arrival order, for forgetting (the oldest set whole;
small sets are merged, so there are never more than about sixteen), and one set of all of
them answers lookups. A key ended in two batches leaves that set with the older one,
which only forgets it early.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from aggregator.liveness.facts import Key

MERGE_BELOW = 16  # sets smaller than limit/16 are merged into the newest


class EndMemory:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sets: deque[frozenset[Key]] = deque()
        self._size = 0  # the sum of the sets' sizes (a key in two sets counts twice)
        self._all: set[Key] = set()

    def add(self, keys: Iterable[Key]) -> None:
        added = keys if isinstance(keys, frozenset) else frozenset(keys)
        if not added:
            return
        if self._sets and len(self._sets[-1]) + len(added) <= self.limit // MERGE_BELOW:
            newest = self._sets.pop()
            self._size -= len(newest)
            added = newest | added
        self._sets.append(added)
        self._size += len(added)
        self._all |= added
        while self._size - len(self._sets[0]) >= self.limit:  # the rest still holds `limit`
            oldest = self._sets.popleft()
            self._size -= len(oldest)
            self._all -= oldest

    def __contains__(self, key: object) -> bool:
        return key in self._all

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._all)
