"""The keys of attempts that ended, so that a start arriving after its own end opens
nothing: the latest `limit` of them, or a little more.

It is fed once per stored batch, on the event loop, and most batches of a busy node are
ends (a training loop's ops are each one FINISHED event). So it keeps a few sets instead
of one ordered dict: a batch's ends arrive as one frozenset made in the decode thread,
adding it costs an append (small sets are merged, so there are never more than about
sixteen), forgetting drops the oldest set whole, and a lookup probes each set.
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
        while self._size - len(self._sets[0]) >= self.limit:  # the rest still holds `limit`
            self._size -= len(self._sets.popleft())

    def __contains__(self, key: object) -> bool:
        return any(key in keys for keys in self._sets)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Key]:
        return iter(frozenset().union(*self._sets))
