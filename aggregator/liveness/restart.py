"""The open set across an agent restart: a snapshot file in the state directory, then
the spool's newest records replayed over it.

The snapshot (`liveness.json`, written atomically when the set changed, at most every
five seconds) holds the open attempts and the identity of every tracked process, which no
record holds: only with it can the next agent tell that a pid it finds gone, or taken by
another process, is the worker it was. The replay adds what arrived after the last
snapshot (the spool's last segment is never deleted), records of every route read
newest first up to the same bounds as the Ray eventId recall, then applied oldest
first. A snapshot from another boot (the machine restarted) says every process in it is
gone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from aggregator.liveness import procs
from aggregator.liveness.facts import BatchFacts, attempt_key, facts_of
from aggregator.liveness.openset import Actor, Attempt, Job, OpenSet, Process
from aggregator.liveness.procs import Identity
from aggregator.spool import Spool
from sinks.durable import publish_file
from sinks.schema import batch_from_bytes

SNAPSHOT = "liveness.json"
SEEN = "liveness.seen"
REPLAY_BYTES = 64 * 2**20
REPLAY_RECORDS = 10_000


def parts_of(open_set: OpenSet) -> dict[str, Any]:
    """Shallow copies, taken on the loop; orjson writes the dataclasses in a thread."""
    return {"attempts": list(open_set.attempts.values()), "jobs": list(open_set.jobs.values()),
            "actors": list(open_set.actors.values()),
            "processes": [[p.identity.pid, p.identity.start_ticks, p.gone_ns]
                          for p in open_set.processes.values()]}


def save(parts: dict[str, Any], state_dir: Path) -> None:
    """Write the snapshot of `parts_of` (in a worker thread: it syncs the file)."""
    body = orjson.dumps({"boot_id": procs.boot_id(), **parts})
    staged = state_dir / f".{SNAPSHOT}.{os.getpid()}.tmp"
    staged.write_bytes(body)
    publish_file(staged, state_dir / SNAPSHOT)


def load(open_set: OpenSet, state_dir: Path) -> bool:
    """Read the snapshot into `open_set`; False when there is none. A damaged one raises."""
    try:
        saved: dict[str, Any] = orjson.loads((state_dir / SNAPSHOT).read_bytes())
    except FileNotFoundError:
        return False
    _load_parts(open_set, saved, same_boot=saved.get("boot_id") == procs.boot_id())
    return True


def _load_parts(open_set: OpenSet, saved: dict[str, Any], same_boot: bool) -> None:
    """What a snapshot held; from another boot, every process in it is gone."""
    for pid, ticks, gone_ns in saved.get("processes", []):
        open_set.processes[pid] = Process(Identity(pid, ticks if same_boot else -1), gone_ns)
    for item in saved.get("attempts", []):
        attempt = Attempt(**item)
        open_set.add(attempt_key(attempt.kind, attempt.session, attempt.key_id,
                                 attempt.attempt), attempt)
    for item in saved.get("jobs", []):
        open_set.jobs[(item["session"], item["job_id"])] = Job(**item)
    for item in saved.get("actors", []):
        open_set.actors[(item["session"], item["actor_id"])] = Actor(**item)


class SeenLog:
    """One line per process at its first sighting ("pid ticks"), and one more for each
    process found to be a job's driver ("pid ticks driver"), appended at once (no fsync:
    a kill -9 of the agent keeps it; a power cut starts a new boot, in which every pid it
    names is gone anyway). It closes the gap between two snapshots: the replayed records
    say which attempts and jobs were open, this which of their processes were here, which
    the next agent can no longer ask of a process that exited meanwhile. Each start reads
    it and then begins it again after writing a snapshot that holds what it said."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / SEEN
        self._handle: IO[str] | None = None

    def read(self, open_set: OpenSet) -> None:
        try:
            lines = self.path.read_text(encoding="ascii", errors="replace").splitlines()
        except FileNotFoundError:
            return
        same_boot = bool(lines) and lines[0] == f"boot {procs.boot_id()}"
        for line in lines[1:]:
            pid, ticks, *role = line.split(" ")
            if pid.isdigit() and ticks.isdigit():
                open_set.known[int(pid)] = Identity(int(pid), int(ticks) if same_boot else -1)
                if role == ["driver"]:
                    open_set.known_drivers.add(int(pid))

    def begin(self) -> None:
        self.close()
        self._handle = self.path.open("w", encoding="ascii", buffering=1)
        self._handle.write(f"boot {procs.boot_id()}\n")

    def add(self, identity: Identity) -> None:
        if self._handle is not None:
            self._handle.write(f"{identity.pid} {identity.start_ticks}\n")

    def add_driver(self, identity: Identity) -> None:
        if self._handle is not None:
            self._handle.write(f"{identity.pid} {identity.start_ticks} driver\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def replay(open_set: OpenSet, spool: Spool) -> int:
    """Apply the facts of the spool's newest records, oldest first; records that cannot
    be read are skipped and counted in the answer."""
    found: list[BatchFacts] = []
    unreadable = 0
    for payload in _newest_payloads(spool):
        try:
            found.append(facts_of(batch_from_bytes(payload)))
        except Exception:  # damaged, or of another schema: the rest still counts
            unreadable += 1
    for facts in reversed(found):
        open_set.apply(facts)
    return unreadable


def _newest_payloads(spool: Spool) -> Iterator[bytes]:
    read = 0
    last = spool.next_offset - 1
    first = max(spool.first_offset, last - REPLAY_RECORDS + 1)
    for offset in range(last, first - 1, -1):
        records = spool.read(offset, max_bytes=1, max_records=1)
        if not records or records[0].offset != offset:
            continue  # dropped by policy: a gap in the offsets
        yield records[0].payload
        read += records[0].size
        if read >= REPLAY_BYTES:
            return
