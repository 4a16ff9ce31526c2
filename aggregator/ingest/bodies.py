"""Request bodies as the routes read them: gzip and deflate inflated by the agent itself.

aiohttp's own decompression answers a `br` or `zstd` body with a plain-text 400 ("Please
install `Brotli`") before any route sees it, where OTLP/HTTP asks for a 415 with a
`google.rpc.Status`. So the agent's HTTP server runs with `auto_decompress=False`, and
each route checks the Content-Encoding first and inflates through `inflate`: at most
the body limit, as aiohttp counted it (the inflated size).
"""

from __future__ import annotations

import zlib

INFLATED = frozenset({"gzip", "deflate"})


class BodyRefused(Exception):
    """A body the agent cannot read; `status` to answer, `reason` for evagg_bad_input_total."""

    def __init__(self, text: str, status: int, reason: str) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason


def encoding_name(header: str | None) -> str:
    """The Content-Encoding, lower case; "identity" when none is given."""
    return (header or "identity").strip().lower() or "identity"


def inflate(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """`body` inflated when `encoding` is gzip or deflate, as is otherwise; BodyRefused for
    a broken stream (400) or one inflating past `max_bytes` (413)."""
    if encoding not in INFLATED:
        return body
    inflater = zlib.decompressobj(_window_bits(body, encoding))
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BodyRefused(f"cannot read the body: invalid {encoding} data ({exc})", 400,
                          "bad_encoding") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise BodyRefused(f"body inflates past {max_bytes} bytes: send it in smaller parts",
                          413, "too_large")
    if not inflater.eof:
        raise BodyRefused(f"cannot read the body: truncated {encoding} data", 400,
                          "bad_encoding")
    return out


def _window_bits(body: bytes, encoding: str) -> int:
    if encoding == "gzip":
        return 16 + zlib.MAX_WBITS
    # HTTP's "deflate" is a zlib stream, but some clients send raw deflate: tell by the
    # zlib header (compression method 8, header checksum a multiple of 31).
    zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and int.from_bytes(body[:2]) % 31 == 0
    return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
