"""FramePacker (emitters/packing.py): a chunk of events is encoded in one orjson call and
gives the same NDJSON lines as encoding each event; an event that cannot be encoded, or
that holds the separator, costs only itself; frames never pass their size, and every
event lands in exactly one of them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from emitters import packing
from emitters.packing import FramePacker


def events(count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"e{i:05d}", "kind": "op", "name": "forward", "step": i,
             "duration_s": i / 7, "metrics": {"loss": 1 / (i + 1)}, "attrs": {"rank": "3"},
             "error_message": 'quotes " and },{ and \n newlines'} for i in range(count)]


def lines_of(payloads: list[tuple[bytes, int]]) -> list[bytes]:
    out = []
    for payload, count in payloads:
        found = payload.rstrip(b"\n").split(b"\n")
        assert len(found) == count
        out += found
    return out


def pack(packer: FramePacker, batch: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    payloads = packer.add(batch)
    last = packer.close()
    return payloads + ([last] if last else [])


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """orjson.dumps calls in the packer, by what they encode: a list (a chunk) or one event."""
    counted = Counter[str]()
    real_dumps = orjson.dumps

    def dumps(value: Any, *args: Any, **kwargs: Any) -> bytes:
        counted["list" if isinstance(value, list) else "one"] += 1
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(packing.orjson, "dumps", dumps)
    return counted


def test_one_orjson_call_per_chunk_gives_the_same_lines(calls: Counter[str]) -> None:
    batch = events(600)
    payloads = pack(FramePacker(2**24, Counter()), batch)
    assert calls == {"list": 3}  # 256 + 256 + 88 events, no per-event call
    calls.clear()
    assert lines_of(payloads) == [orjson.dumps(e) for e in batch]


def test_an_event_that_cannot_be_encoded_costs_only_itself() -> None:
    batch = events(10)
    batch[3]["attrs"] = {"bad": object()}  # no JSON form, and not mended by scrub()
    batch[5]["name"] = "lone \udc80 surrogate"  # mended by scrub()
    lost: Counter[str] = Counter()
    found = [orjson.loads(line) for line in lines_of(pack(FramePacker(2**24, lost), batch))]
    assert [e["event_id"] for e in found] == [f"e{i:05d}" for i in range(10) if i != 3]
    assert found[4]["name"] == "lone \\udc80 surrogate"
    assert lost == {"unencodable": 1}


@pytest.mark.parametrize("names", [
    ["loss", packing._SEPARATOR, "x"],  # a list item between two others: `,"<sep>",`
    ["a", packing._SEPARATOR, packing._SEPARATOR, "b"],  # two, sharing a comma
])
def test_an_event_holding_the_separator_is_still_one_line_of_its_own(
        names: list[str], calls: Counter[str]) -> None:
    batch = events(5)
    batch[2]["nonfinite"] = names  # the one place it could appear
    found = lines_of(pack(FramePacker(2**24, Counter()), batch))
    assert [orjson.loads(line) for line in found] == batch
    assert calls == {"list": 1, "one": 5}  # the line count caught it: one call per event


@pytest.mark.parametrize("max_bytes", [300, 1000, 7000, 60_000])
def test_frames_never_pass_their_size_and_hold_every_event_once(max_bytes: int) -> None:
    batch = events(700)
    packer = FramePacker(max_bytes, Counter())
    payloads = packer.add(batch[:300]) + packer.add(batch[300:])
    last = packer.close()
    payloads += [last] if last else []
    assert all(len(payload) <= max_bytes for payload, _ in payloads)
    assert lines_of(payloads) == [orjson.dumps(e) for e in batch]


def test_an_event_larger_than_a_frame_is_dropped_and_counted() -> None:
    batch = events(3)
    batch[1]["error_message"] = "x" * 5000
    lost: Counter[str] = Counter()
    found = lines_of(pack(FramePacker(1000, lost), batch))
    assert [orjson.loads(line)["event_id"] for line in found] == ["e00000", "e00002"]
    assert lost == {"too_large": 1}
