"""`evagg dlq replay`: each dead letter sent again with its original Idempotency-Key, its
pair deleted only once the endpoint took all of it.

A letter refused as too large (413) is sent in halves, each halved again while refused,
as the sink itself sends a batch (sinks/http/halves.py): a letter dead-lettered for its
size goes through at last. Where only some of its pieces are taken, the pieces left
become letters of their own, so the next replay sends only those.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from ssl import SSLContext
from typing import TYPE_CHECKING, Any

import aiohttp

from sinks.http.batches import Body, BodyFormat, gzip_body
from sinks.http.deadletter import DeadLetter, list_dead_letters, write_dead_letter
from sinks.http.endpoint import CONTENT_TYPES
from sinks.http.halves import Half, halves_of

if TYPE_CHECKING:
    from sinks.http.proxy import ProxyRoute

TOO_LARGE = "HTTP 413"


@dataclass(slots=True)
class ReplayReport:
    sent: int = 0  # batches the endpoint accepted; their files are deleted
    failed: int = 0  # batches still on disk (a split letter's pieces left count apiece)
    events_sent: int = 0
    partly: int = 0  # letters the endpoint took some pieces of; the rest kept as letters
    split: int = 0  # requests refused as too large (413), sent again in halves
    errors: list[str] = field(default_factory=list)  # "<key>: <reason>", one per failure


@dataclass(frozen=True, slots=True)
class _Left:
    """A piece of a letter the endpoint did not take, and its last answer."""
    piece: Half
    reason: str


@dataclass(slots=True)
class _Poster:
    session: aiohttp.ClientSession
    url: str
    headers: Mapping[str, str]
    gzip: bool
    proxy: tuple[dict[str, str], dict[str, Any]]
    splits: int = 0  # pieces sent again in halves

    async def post(self, key: str, body: Body, body_format: BodyFormat) -> str | None:
        """None on a 2xx, else a short reason ("HTTP 413", "timeout")."""
        headers = {**self.headers, **self.proxy[0], "Idempotency-Key": key,
                   "Content-Type": CONTENT_TYPES.get(body_format, "application/json")}
        if self.gzip:
            body = gzip_body(body)
            headers["Content-Encoding"] = "gzip"
        try:
            async with self.session.post(self.url, data=body, headers=headers,
                                         allow_redirects=False, **self.proxy[1]) as response:
                return None if 200 <= response.status < 300 else f"HTTP {response.status}"
        except TimeoutError:
            return "timeout"
        except aiohttp.ClientError as exc:
            return type(exc).__name__

    async def deliver(self, piece: Half, body_format: BodyFormat) -> list[_Left]:
        """Send `piece`, in halves while it is refused as too large; what is left."""
        reason = await self.post(piece.key, piece.body, body_format)
        if reason is None:
            return []
        halves = halves_of(piece.key, piece.body, body_format) if reason == TOO_LARGE else []
        if not halves:
            return [_Left(piece, reason)]
        self.splits += 1
        return [left for half in halves for left in await self.deliver(half, body_format)]


async def replay_dead_letters(
    directory: Path,
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    timeout_s: float = 10.0,
    gzip: bool = False,
    keys: Collection[str] | None = None,
    ssl: SSLContext | None = None,
    proxy: ProxyRoute | None = None,
) -> ReplayReport:
    """POST each dead letter (or those in `keys`) to `url`; delete the ones taken.
    `ssl`: the sink's TLS context (`sinks.http.tls.client_ssl`); None, the system CAs.
    `proxy`: the sink's route (`sinks.http.proxy.proxy_route`); None: direct."""
    report = ReplayReport()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(ssl=True if ssl is None else ssl)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        poster = _Poster(session, url, headers or {}, gzip,
                         proxy.for_endpoint(url) if proxy else ({}, {}))
        for letter in list_dead_letters(directory):
            if keys is None or letter.key in keys:
                await _replay_one(poster, letter, report)
    report.split = poster.splits
    return report


async def _replay_one(poster: _Poster, letter: DeadLetter, report: ReplayReport) -> None:
    try:
        body = letter.body_path.read_bytes()
    except OSError as exc:
        report.failed += 1
        report.errors.append(f"{letter.key}: cannot read {letter.body_path.name}: "
                             f"{exc.strerror or exc}")
        return
    body_format: BodyFormat = "ndjson" if letter.body_format == "ndjson" else "json"
    left = await poster.deliver(Half(letter.key, letter.events, body), body_format)
    if sum(piece.piece.events for piece in left) == letter.events:  # nothing taken: it stays
        report.failed += 1
        report.errors.append(f"{letter.key}: {_refusal(left)}")
        return
    if not _keep_pieces(letter, left, report):
        return
    for piece in left:
        report.failed += 1
        report.errors.append(f"{piece.piece.key}: {piece.reason} ({piece.piece.events} of "
                             f"letter {letter.key}'s events, kept as a letter of their own)")
    report.sent += not left
    report.partly += bool(left)
    report.events_sent += letter.events - sum(piece.piece.events for piece in left)
    letter.meta_path.unlink(missing_ok=True)  # sidecar first: no half entries
    letter.body_path.unlink(missing_ok=True)


def _refusal(left: list[_Left]) -> str:
    """Why nothing of a letter was taken: its answer, or its halves' answers."""
    if len(left) == 1:
        return left[0].reason
    reasons = sorted({piece.reason for piece in left})
    return f"{', '.join(reasons)} for each of its {len(left)} pieces, sent in halves"


def _keep_pieces(letter: DeadLetter, left: list[_Left], report: ReplayReport) -> bool:
    """Write the pieces left as letters of their own (before the letter goes: a crash
    between keeps both); False, and none written, where the disk will not take them."""
    written: list[DeadLetter] = []
    try:
        for piece in left:
            written.append(_keep(letter, piece))
    except OSError as exc:
        for piece_letter in written:  # the letter stays whole: its pieces would go twice
            piece_letter.meta_path.unlink(missing_ok=True)
            piece_letter.body_path.unlink(missing_ok=True)
        report.failed += 1
        report.errors.append(f"{letter.key}: cannot write the pieces left as letters of "
                             f"their own ({exc.strerror or exc}); the letter stays whole, "
                             "and its pieces taken go again, under the same keys")
        return False
    return True


def _keep(letter: DeadLetter, left: _Left) -> DeadLetter:
    """A piece of `letter` the endpoint refused still, as a dead letter of its own."""
    status = left.reason.removeprefix("HTTP ")
    return write_dead_letter(letter.body_path.parent, key=left.piece.key, body=left.piece.body,
                      status=int(status) if status.isdigit() else letter.status,
                      response=f"at replay: {left.reason}", url=letter.url,
                      events=left.piece.events, body_format=letter.body_format,
                      sink=letter.sink, first_offset=letter.first_offset,
                      last_offset=letter.last_offset)
