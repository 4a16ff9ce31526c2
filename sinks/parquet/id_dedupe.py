"""Which rows of an hour's files to keep so that each event_id is written once.

The hour merge (sinks/parquet/compact.py) runs inside the agent, under the agent's
memory limit, over hours of millions of events. Holding every id of the hour as text
(36 bytes a UUID, plus a hash table over them) made the merge's memory grow by about
250 bytes per event. Instead each id is reduced to a 64-bit fingerprint as its file is
read, a batch at a time, and only the fingerprints (8 bytes per event) are sorted.
Ids whose fingerprints repeat (the real duplicates: a retried send, and the rare pair of
different ids that happen to share one) are then read again and compared whole, so the
answer is exact; only those ids are ever held as text, in Arrow. Each merge seeds the
hash with random bits of its own, so that no producer can choose ids that share
fingerprints and send every row down that slower path.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ID_COLUMN: Final = "event_id"
BATCH_ROWS: Final = 65_536  # ids read at a time: bounds the byte matrix of one batch
# ids compared whole at once, where that many repeat (a producer that resends all): each
# part more reads the hour's ids again, each holds about 150 MiB of UUIDs
CANDIDATES_AT_ONCE: Final = 1_000_000
# bytes of ids gathered into one matrix: its byte positions are int64, eight times this
_GATHER_BYTES: Final = 1 << 20
_LONG_ID: Final = 256  # bytes: an id longer than this is hashed alone
_MULTIPLIER: Final = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant
_MIX_1: Final = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finalizer
_MIX_2: Final = np.uint64(0x94D049BB133111EB)


def first_occurrences(inputs: list[Path], footers: list[pq.FileMetaData]) -> np.ndarray:
    """A mask over all rows of `inputs`, in order: True where an event_id is seen first,
    and for rows without one."""
    seed = int.from_bytes(os.urandom(8), "little")
    prints = np.empty(sum(f.num_rows for f in footers), dtype=np.uint64)
    has_id = np.zeros(len(prints), dtype=bool)
    at = 0
    for batch in _id_batches(inputs, footers):
        prints[at:at + len(batch)] = fingerprints(batch, seed)
        has_id[at:at + len(batch)] = batch.is_valid().to_numpy(zero_copy_only=False)
        at += len(batch)
    keep = np.ones(len(prints), dtype=bool)
    shared = _repeated_values(prints[has_id])
    if not len(shared):
        return keep
    candidates = np.flatnonzero(has_id & _is_in(prints, shared))
    # Equal ids have equal fingerprints, so candidates split by fingerprint are decided
    # part by part: however many rows repeat, no more than a part's ids are held at once.
    parts = -(-len(candidates) // CANDIDATES_AT_ONCE)
    part_of = prints[candidates] % np.uint64(parts)
    for part in range(parts):
        chosen = candidates[part_of == part] if parts > 1 else candidates
        keep[chosen] = _first_of_each(_ids_at(inputs, footers, chosen))
    return keep


def fingerprints(ids: pa.Array, seed: int = 0) -> np.ndarray:
    """A 64-bit hash of each id's UTF-8 bytes under `seed` (a null's is that of some id:
    the caller tells nulls apart). Ids of one length are hashed together as a matrix of
    8-byte words; a batch holds few lengths."""
    ids = ids.cast(pa.string())
    out = np.zeros(len(ids), dtype=np.uint64)
    if not len(ids) or ids.null_count == len(ids):
        return out
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32, count=len(ids) + 1,
                            offset=ids.offset * 4)
    data = np.frombuffer(ids.buffers()[2] or b"", dtype=np.uint8)
    lengths = np.diff(offsets)
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        if length > _LONG_ID:
            out[rows] = np.array([_hash_one(data[offsets[r]:offsets[r + 1]], seed)
                                  for r in rows], dtype=np.uint64)
            continue
        step = _GATHER_BYTES // max(int(length), 1)
        for at in range(0, len(rows), step):
            part = rows[at:at + step]
            out[part] = _hash_rows(data, offsets[part], int(length), seed)
    return out


def _hash_one(id_bytes: np.ndarray, seed: int) -> int:
    """A long id's hash, alone (ids this long are rare; as a matrix they cost a loop
    step per 8 bytes)."""
    keyed = hashlib.blake2b(id_bytes.tobytes(), digest_size=8, key=seed.to_bytes(8, "little"))
    return int.from_bytes(keyed.digest(), "little")


def _hash_rows(data: np.ndarray, starts: np.ndarray, length: int, seed: int) -> np.ndarray:
    """The hash of the `length` bytes at each of `starts` in `data`, as a matrix of 8-byte
    words (the caller keeps rows times length within _GATHER_BYTES)."""
    words = -(-length // 8)
    matrix = np.zeros((len(starts), words * 8), dtype=np.uint8)
    if length:
        matrix[:, :length] = data[starts[:, None] + np.arange(length)]
    h = np.full(len(starts), length + 1, dtype=np.uint64)  # the length, so padding counts
    h ^= np.uint64(seed)
    h *= _MULTIPLIER
    for word in matrix.view(np.uint64).T:
        h = (h ^ word) * _MULTIPLIER
        h ^= h >> np.uint64(29)
    h ^= h >> np.uint64(30)
    h *= _MIX_1
    h ^= h >> np.uint64(27)
    h *= _MIX_2
    return h ^ (h >> np.uint64(31))


def _repeated_values(prints: np.ndarray) -> np.ndarray:
    """The fingerprints that occur more than once (usually none), sorted; `prints` is a
    copy of the caller's, sorted here in place."""
    prints.sort()
    repeats = prints[1:][prints[1:] == prints[:-1]]
    return _distinct_sorted(repeats)


def _distinct_sorted(values: np.ndarray) -> np.ndarray:
    """np.unique of values already sorted, in one pass (np.unique hashes them again)."""
    if not len(values):
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def _is_in(prints: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """Whether each fingerprint is one of `shared` (sorted): by binary search a batch at
    a time, where np.isin would sort a copy of every fingerprint with its positions."""
    found = np.zeros(len(prints), dtype=bool)
    for start in range(0, len(prints), BATCH_ROWS):
        part = prints[start:start + BATCH_ROWS]
        at = np.minimum(np.searchsorted(shared, part), len(shared) - 1)
        found[start:start + BATCH_ROWS] = shared[at] == part
    return found


def _first_of_each(ids: pa.ChunkedArray) -> np.ndarray:
    """For ids in row order: True at the first row of each id. One hash of the ids, in
    Arrow: its dictionary encoding numbers them in the order they are first seen, so a
    row is a first exactly where the running highest number grows."""
    if not len(ids):
        return np.zeros(0, dtype=bool)
    encoded = ids.dictionary_encode()  # its chunks share one dictionary
    numbers = np.concatenate([chunk.indices.to_numpy() for chunk in encoded.chunks])
    highest = np.maximum.accumulate(numbers)
    first = np.concatenate(([True], highest[1:] > highest[:-1]))
    if not np.array_equal(numbers[first], np.arange(first.sum())):  # not first-seen order
        first[:] = False
        first[np.unique(numbers, return_index=True)[1]] = True
    return first


def _ids_at(inputs: list[Path], footers: list[pq.FileMetaData],
            positions: np.ndarray) -> pa.ChunkedArray:
    """The ids at these ascending row positions of all inputs taken together."""
    chunks: list[pa.Array] = []
    at = 0
    for batch in _id_batches(inputs, footers):
        lo, hi = np.searchsorted(positions, [at, at + len(batch)])
        if hi > lo:
            chunks.append(batch.take(pa.array(positions[lo:hi] - at)).cast(pa.string()))
        at += len(batch)
    return pa.chunked_array(chunks, type=pa.string())


def _id_batches(inputs: list[Path], footers: list[pq.FileMetaData]) -> Iterator[pa.Array]:
    """Every input's ids, in row order, a batch at a time (nulls for a file without them)."""
    for path, footer in zip(inputs, footers, strict=True):
        if ID_COLUMN not in footer.schema.names:
            for start in range(0, footer.num_rows, BATCH_ROWS):
                yield pa.nulls(min(BATCH_ROWS, footer.num_rows - start), pa.string())
            continue
        with pq.ParquetFile(path, metadata=footer) as file:
            for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=[ID_COLUMN]):
                yield batch.column(0)
