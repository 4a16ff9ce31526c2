"""Ray log pieces read back from a local lake as docs/ray-logs.md tells a user to: the
pieces of one generation in offset order, decompressed and joined."""

from __future__ import annotations

from pathlib import Path

from sinks.raylogs.layout import decompress_piece
from tests.aggregator.raylogs.rayevents import NODE_HEX, SESSION


def generations(lake: Path, name: str, session: str = SESSION,
                node: str = NODE_HEX) -> dict[int, bytes]:
    """Every generation's bytes; fails if two pieces overlap or leave a gap."""
    folder = lake / "_logs" / f"session={session}" / f"node={node}" / name
    out: dict[int, bytes] = {}
    if not folder.is_dir():
        return out
    for gen_dir in sorted(folder.iterdir()):
        data = b""
        for piece in sorted(gen_dir.glob("*.zst")):
            start, end = (int(part) for part in piece.name.removesuffix(".zst").split("-"))
            assert start == len(data), f"{piece}: starts at {start}, expected {len(data)}"
            body = decompress_piece(piece.read_bytes(), end - start)
            assert len(body) == end - start, piece
            data += body
        out[int(gen_dir.name.removeprefix("gen="))] = data
    return out


def shipped(lake: Path, name: str) -> bytes:
    """The first generation's bytes."""
    return generations(lake, name).get(0, b"")
