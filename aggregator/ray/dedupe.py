"""Dropping the events of a batch Ray sends again.

Ray's exporter resends a batch byte for byte when our answer is slow (over its 3 s
timeout) or not 2xx, and sends nothing else meanwhile. An id is remembered from the
moment a request takes it (in flight) until its write ends: stored, it stays remembered
(a window of the recent ones); failed, it is forgotten so the resend is stored.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

from aggregator.ray.values import text


def ray_event_id(item: Any) -> str | None:
    """The dedupe key of a Ray event: its raw eventId, in either casing, else the base64
    of its content's digest (what `content_id` stores it under); or an id as is.

    An eventId that is not a string (5) keys as its JSON text ("5"): the text the event's
    rows keep in attrs["ray_event_id"], so `ray_recall` rebuilds the same key."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    value = item.get("eventId") or item.get("event_id")
    if isinstance(value, str) and value:
        return value
    if value:
        try:
            return text(value)
        except TypeError:  # orjson.JSONEncodeError is one; the careful path rejects it
            return None
    return _content_key(item)


def content_id(item: dict[str, Any]) -> str:
    """An event without a usable eventId still gets a stable id: a digest of its content,
    in hex (the event_id its rows are stored under)."""
    return _content_digest(item).hex()


def _content_key(item: dict[str, Any]) -> str | None:
    """The same digest in base64, the form `ray_recall` rebuilds from a stored row; None
    for an event that cannot be encoded (the careful path rejects it)."""
    try:
        return base64.b64encode(_content_digest(item)).decode("ascii")
    except TypeError:  # orjson.JSONEncodeError is one
        return None


def _content_digest(item: dict[str, Any]) -> bytes:
    content = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(content, digest_size=28).digest()


class Claim:
    """One request's hold on the eventIds it is writing. `stored` is None while in flight,
    then whether the write succeeded; a request that meets these ids meanwhile waits for it
    (`RecentEventIds.outcome`)."""

    __slots__ = ("ids", "stored", "waiters")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.stored: bool | None = None
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []


class NewEvents(NamedTuple):
    """What `RecentEventIds.split_new` found in one body."""

    indexes: list[int]  # of the events to store
    ids: list[str]  # their eventIds, in order (events without one are always new)
    pending: list[Claim]  # other requests writing some of the rest now
    held: int  # how many of the rest those requests hold


class RecentEventIds:
    """Ray eventIds stored lately or being stored now, to drop the events of a resent batch.

    `split_new` marks the new ids of a body in flight under a `Claim`; `settle` ends the
    claim once the write is done: stored ids join the window, failed ones are forgotten,
    so a failed write never makes Ray's resend look like a duplicate. A resend that meets
    ids still in flight gets their claims, to wait for and answer by (`http_api`). The
    window is two generations of sets (about 2 x `capacity` ids, ~120 bytes each); when
    the young one fills, the old one is dropped whole. Not a file of its own: at start the
    agent refills it from the spool's newest records (`ray_recall`), so a batch spooled
    before a restart is dropped when Ray sends it again. Accepts raw eventIds or the
    event objects themselves.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = max(1, capacity)
        self._young: set[str] = set()
        self._old: set[str] = set()
        self._in_flight: dict[str, Claim] = {}
        self._lock = threading.Lock()

    def filter_new(self, events: Iterable[Any]) -> list[bool]:
        """True for each event not seen before nor in flight (repeats within `events` count
        as seen); looking remembers nothing (`confirm` does). Events without an id are
        always new. The handler uses `split_new`; this is the reference path's lookup."""
        out: list[bool] = []
        batch: set[str] = set()
        with self._lock:
            for event in events:
                event_id = ray_event_id(event)
                if event_id is None:
                    out.append(True)
                    continue
                new = not (event_id in batch or self._seen(event_id))
                batch.add(event_id)
                out.append(new)
        return out

    def split_new(self, events: list[Any], claim: Claim | None = None) -> NewEvents:
        """The events not seen before (as `filter_new`), their ids now in flight under
        `claim` until `settle` (or `confirm`); and the claims of other requests that hold
        some of the rest in flight. A claim settled already (its request was cancelled)
        takes no ids."""
        claim = Claim() if claim is None else claim
        fresh: list[int] = []
        fresh_ids: list[str] = []
        batch: set[str] = set()
        pending: dict[Claim, None] = {}
        held = 0
        with self._lock:
            young, old, in_flight = self._young, self._old, self._in_flight
            for index, event in enumerate(events):
                event_id = (event.get("eventId") or event.get("event_id")
                            if type(event) is dict else ray_event_id(event))
                if (type(event_id) is not str or not event_id) and type(event) is dict:
                    event_id = ray_event_id(event)  # the rare ids that are not strings
                if type(event_id) is not str or not event_id:
                    fresh.append(index)
                elif not (event_id in batch or event_id in young or event_id in old):
                    holder = in_flight.get(event_id)
                    if holder is not None:
                        pending[holder] = None
                        held += 1
                        continue
                    batch.add(event_id)
                    fresh.append(index)
                    fresh_ids.append(event_id)
            if claim.stored is None:
                claim.ids += fresh_ids
                in_flight.update(dict.fromkeys(fresh_ids, claim))
        return NewEvents(fresh, fresh_ids, list(pending), held)

    def settle(self, claim: Claim, stored: bool) -> None:
        """End a claim: its ids are remembered (stored) or forgotten (the write failed),
        and whoever waits for it learns which. A second call changes nothing."""
        with self._lock:
            if claim.stored is not None:
                return
            claim.stored = stored
            for event_id in claim.ids:
                if self._in_flight.get(event_id) is claim:
                    del self._in_flight[event_id]
            if stored:
                self._add(claim.ids)
            waiters, claim.waiters = claim.waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future, stored)

    async def outcome(self, claim: Claim) -> bool:
        """Wait until `claim` is settled; whether its ids were stored."""
        with self._lock:
            if claim.stored is not None:
                return claim.stored
            loop = asyncio.get_running_loop()
            future: asyncio.Future[bool] = loop.create_future()
            claim.waiters.append((loop, future))
        return await future

    def confirm(self, events: Iterable[Any]) -> None:
        """Remember these events as stored (ending the claims that held them)."""
        found = [i for i in map(ray_event_id, events) if i is not None]
        with self._lock:
            claims = {c: None for c in map(self._in_flight.get, found) if c is not None}
        for claim in claims:
            self.settle(claim, stored=True)
        with self._lock:
            self._add(found)

    def _seen(self, event_id: str) -> bool:
        return event_id in self._young or event_id in self._old or event_id in self._in_flight

    def _add(self, event_ids: Iterable[str]) -> None:
        young = self._young
        for event_id in event_ids:
            young.add(event_id)
            if len(young) >= self._capacity:
                self._old, self._young = young, set()
                young = self._young

    def __contains__(self, event: object) -> bool:
        """Whether the event is remembered as stored (in flight does not count)."""
        event_id = ray_event_id(event)
        return event_id is not None and (event_id in self._young or event_id in self._old)

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    @property
    def capacity(self) -> int:
        """How many stored ids the window surely holds: one generation (more ids than
        that, remembered at once, would push the oldest of them out again)."""
        return self._capacity

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


def _resolve(future: asyncio.Future[bool], stored: bool) -> None:
    if not future.done():  # the waiter may have given up (a timeout)
        future.set_result(stored)
