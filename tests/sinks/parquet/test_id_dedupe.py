"""The hour merge keeps the first row of each event_id, exactly, from fingerprints."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sinks.parquet.id_dedupe as id_dedupe
from sinks.parquet.id_dedupe import fingerprints, first_occurrences

ids_strategy = st.lists(st.one_of(st.none(), st.sampled_from(["a", "a\x00", "", "é", "ab"]),
                                  st.text(max_size=40)), max_size=60)


def first_seen(ids: list[str | None]) -> list[bool]:
    seen: set[str] = set()
    out = []
    for event_id in ids:
        out.append(event_id is None or event_id not in seen)
        if event_id is not None:
            seen.add(event_id)
    return out


def write_files(folder: Path, parts: list[list[str | None]], idless: int = 0) -> tuple[
        list[Path], list[pq.FileMetaData]]:
    paths = []
    for i, part in enumerate(parts):
        path = folder / f"part-{i}.parquet"
        pq.write_table(pa.table({"event_id": pa.array(part, pa.string()),
                                 "n": pa.array(range(len(part)), pa.int64())}), path,
                       row_group_size=7)
        paths.append(path)
    if idless:
        path = folder / "idless.parquet"
        pq.write_table(pa.table({"n": pa.array(range(idless), pa.int64())}), path)
        paths.append(path)
    return paths, [pq.read_metadata(p) for p in paths]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=ids_strategy, cuts=st.lists(st.integers(0, 60), max_size=4), idless=st.integers(0, 3))
def test_the_mask_keeps_the_first_row_of_each_id(tmp_path: Path, ids: list[str | None],
                                                cuts: list[int], idless: int) -> None:
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    bounds = sorted({0, len(ids), *(min(c, len(ids)) for c in cuts)})
    parts = [ids[a:b] for a, b in itertools.pairwise(bounds)] or [[]]
    paths, footers = write_files(folder, parts, idless)
    assert first_occurrences(paths, footers).tolist() == first_seen(ids) + [True] * idless


def test_ids_whose_fingerprints_collide_are_still_told_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every id shares one fingerprint: the whole ids decide.
    monkeypatch.setattr(id_dedupe, "fingerprints",
                        lambda ids, seed: np.zeros(len(ids), dtype=np.uint64))
    ids: list[str | None] = ["x", "y", "x", None, "z", "y", None, "w"]
    paths, footers = write_files(tmp_path, [ids[:3], ids[3:]])
    assert first_occurrences(paths, footers).tolist() == first_seen(ids)


@pytest.mark.parametrize("at_once", [1_000_000, 2])
def test_a_batch_boundary_inside_a_file_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: int) -> None:
    # and many repeats decided a part at a time decide the same
    monkeypatch.setattr(id_dedupe, "BATCH_ROWS", 3)
    monkeypatch.setattr(id_dedupe, "CANDIDATES_AT_ONCE", at_once)
    ids: list[str | None] = [str(i % 5) for i in range(17)]
    paths, footers = write_files(tmp_path, [ids[:11], ids[11:]], idless=4)
    assert first_occurrences(paths, footers).tolist() == first_seen(ids) + [True] * 4


def test_distinct_ids_get_distinct_fingerprints() -> None:
    # Real shapes: UUIDv7 text, Ray's hex ids of several lengths, ids that differ
    # only in a trailing zero byte or in their last word.
    ids = [str(uuid.uuid4()) for _ in range(100_000)]
    ids += [f"{i:032x}" for i in range(50_000)] + [f"{i:048x}" for i in range(50_000)]
    ids += ["a", "a\x00", "a\x00\x00", "", "12345678", "123456789"]
    prints = fingerprints(pa.array(ids))
    assert len(np.unique(prints)) == len(ids)
    assert (fingerprints(pa.array(ids[:10])) == prints[:10]).all()  # the same in any batch


def test_a_sliced_array_is_hashed_from_its_own_offset() -> None:
    ids = pa.array(["first", "second", "third", "fourth"])
    assert (fingerprints(ids.slice(2)) == fingerprints(pa.array(["third", "fourth"]))).all()


def test_ids_longer_than_a_gather_are_hashed_whole(tmp_path: Path) -> None:
    # A producer may send any id: two of 3 MiB that differ only in their last byte, and
    # one sent twice; each is hashed alone, not as a matrix of the batch's rows. And ids
    # on either side of the length where that starts.
    long_a, long_b = "x" * (3 << 20) + "a", "x" * (3 << 20) + "b"
    ids: list[str | None] = [long_a, "short", long_b, long_a]
    paths, footers = write_files(tmp_path, [ids])
    assert first_occurrences(paths, footers).tolist() == [True, True, True, False]
    prints = fingerprints(pa.array([long_a, long_b, long_a]))
    assert prints[0] != prints[1] and prints[0] == prints[2]
    edge = [c * n for n in (255, 256, 257) for c in "ab"]
    assert len(set(fingerprints(pa.array(edge + edge)).tolist())) == len(edge)


def ids_sharing_one_unseeded_fingerprint(count: int) -> list[str]:
    """Printable 16-byte ids that share one fingerprint under seed 0, made by running the
    hash's steps backwards, as a producer could if the hash had no secret."""
    mult, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1

    def step(x: int) -> int:
        y = (x * mult) & mask
        return y ^ (y >> 29)

    def unstep(z: int) -> int:
        return ((z ^ (z >> 29) ^ (z >> 58)) * pow(mult, -1, 1 << 64)) & mask

    def word(b: bytes) -> int:
        return int.from_bytes(b, "little")

    target = b"evt-0000-0000-01"
    start = (17 * mult) & mask
    end = step(step(start ^ word(target[:8])) ^ word(target[8:]))
    found, rng = [target.decode()], np.random.default_rng(0)
    while len(found) < count:
        first = bytes(rng.integers(0x30, 0x7b, 8, dtype=np.uint8))
        second = (unstep(end) ^ step(start ^ word(first))).to_bytes(8, "little")
        if all(0x20 <= c < 0x7f for c in second):
            found.append((first + second).decode())
    return found


def test_ids_made_to_collide_do_not_under_a_merges_own_seed(tmp_path: Path) -> None:
    crafted = ids_sharing_one_unseeded_fingerprint(20)
    assert len(set(fingerprints(pa.array(crafted)).tolist())) == 1  # the attack, unseeded
    seeded = fingerprints(pa.array(crafted), seed=0x5EED_0F_A_3E26E)
    assert len(set(seeded.tolist())) == len(crafted)
    paths, footers = write_files(tmp_path, [crafted + crafted[:3]])
    assert first_occurrences(paths, footers).tolist() == [True] * 20 + [False] * 3
