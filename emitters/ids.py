"""Identifiers drawn from os.urandom, so `random.seed()` in user code can never repeat them."""

from __future__ import annotations

import os
import time


def new_event_id(time_ns: int | None = None) -> str:
    """A UUIDv7 string: 48 bits of milliseconds, then random bits; sorts by time."""
    ms = (time.time_ns() if time_ns is None else time_ns) // 1_000_000
    raw = bytearray(ms.to_bytes(6, "big") + os.urandom(10))
    raw[6] = 0x70 | (raw[6] & 0x0F)  # version 7
    raw[8] = 0x80 | (raw[8] & 0x3F)  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_trace_id() -> str:
    """32 hex digits (W3C trace-id), never all zero."""
    while True:
        value = os.urandom(16)
        if any(value):
            return value.hex()


def new_span_id() -> str:
    """16 hex digits (W3C parent-id), never all zero."""
    while True:
        value = os.urandom(8)
        if any(value):
            return value.hex()


def new_session_id() -> bytes:
    return os.urandom(16)
