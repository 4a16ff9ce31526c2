"""The open set: attempts, ops, jobs and actors that started on this node and have not
ended, with the local process whose exit ends them.

Fed with each batch's facts and ends (`facts.BatchFacts`), in any order (Ray's owner and
executor events of one attempt arrive in any order and POST): an end closes a key for
good (a late RUNNING after FINISHED opens nothing), and a start of a key only adds what
it knows. Only a process the agent saw alive itself is tracked (`procs.identity_of` at
first sighting, started no later than the event that names it), so a pid of another pid
namespace or machine is never declared gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aggregator.liveness import procs
from aggregator.liveness.end_memory import EndMemory
from aggregator.liveness.facts import TERMINAL, BatchFacts, Fact, Key, attempt_key
from aggregator.liveness.procs import Identity

CLOCK_SLACK_NS = 2_000_000_000  # boot time in /proc has whole seconds; clocks differ a little
MAX_CLOSED = 100_000  # ends remembered, so that a late start does not reopen its key
# Of a producer's ends that closed nothing (most of them: a training loop's ops are one
# FINISHED each), only the latest are: its own start comes before its end on its one
# connection, and 100,000 of them cost the agent some 20 MiB
MAX_LONE_ENDS = 10_000
# pids known to run `evagg emit` or not; a pid reused later keeps its first answer, which
# at worst leaves a task unwatched (nothing inferred), never ends one wrongly
MAX_MESSENGERS = 10_000


@dataclass(slots=True)
class Attempt:
    """An open task attempt or op, with what its inferred end repeats."""

    kind: str  # "task" or "op"
    ray: bool
    session: str
    key_id: str
    attempt: int
    state: str
    job_id: str | None = None
    run_id: str | None = None
    node_id: str | None = None
    worker_id: str | None = None
    name: str | None = None
    step: int | None = None
    task_id: str | None = None
    pid: int | None = None  # the process whose exit ends it


@dataclass(slots=True)
class Job:
    session: str
    job_id: str
    driver_pid: int
    ended: bool = False  # Ray exported its end: its open attempts still end with the driver


@dataclass(slots=True)
class Actor:
    session: str
    actor_id: str
    job_id: str | None = None
    pid: int | None = None
    node_id: str | None = None
    worker_id: str | None = None


@dataclass(slots=True)
class Process:
    identity: Identity
    gone_ns: int | None = None  # when the agent found it gone


@dataclass
class Untracked:
    """Starts the open set did not take, by reason (evagg_liveness_untracked_total)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("not_visible", "too_many_processes", "too_many_attempts"), 0))  # 0s on /metrics

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1


class OpenSet:
    def __init__(self, max_processes: int = 10_000, max_attempts: int = 100_000) -> None:
        self.max_processes = max_processes
        self.max_attempts = max_attempts
        self.attempts: dict[Key, Attempt] = {}  # changed through add and _drop only
        self.open_ops = 0  # of `attempts`, the ops: ends of ops can close only these
        self.jobs: dict[tuple[str, str], Job] = {}
        self.actors: dict[tuple[str, str], Actor] = {}
        self.processes: dict[int, Process] = {}
        self.closed = EndMemory(MAX_CLOSED)
        self.lone_ends = EndMemory(MAX_LONE_ENDS)
        self.untracked = Untracked()
        self.own_pid = os.getpid()
        self.known: dict[int, Identity] = {}  # seen by the last run (restart.SeenLog)
        self.known_drivers: set[int] = set()  # of those, the ones it took for a job's driver
        self.on_new: Callable[[Identity], None] | None = None  # each first sighting
        self.on_driver: Callable[[Identity], None] | None = None  # each driver found here
        self.changed = False  # since the last snapshot
        self._messengers: dict[int, bool] = {}  # pid -> runs `evagg emit` (_messenger)

    # -- facts -----------------------------------------------------------------------------

    def apply(self, found: BatchFacts) -> None:
        for fact in found.facts:
            if fact.kind in ("task", "op"):
                self._attempt_fact(fact)
            elif fact.source == "ray" and fact.kind == "job":
                self._job_fact(fact)
            elif fact.source == "ray" and fact.kind == "actor":
                self._actor_fact(fact)
        self._close_all(found.ends, every_end=False)
        self._close_all(found.ray_ends, every_end=True)

    def _close_all(self, keys: frozenset[Key], *, every_end: bool) -> None:
        """Each key's end, in one pass (on the loop for every op a producer ends). An end
        that closed an open attempt is remembered among `closed`, and so is every end
        with `every_end`; the others only among the latest `lone_ends`."""
        attempts = self.attempts
        if len(keys) <= len(attempts):
            closed_now = [key for key in keys if key in attempts]
        else:  # the open set is the smaller: most ends close nothing
            closed_now = [key for key in attempts if key in keys]
        for key in closed_now:
            self._drop(key)
        self.changed |= bool(closed_now)
        self.closed.add(keys if every_end else closed_now)
        if not every_end:
            self.lone_ends.add(keys)

    def ended(self, key: Key) -> bool:
        return key in self.closed or key in self.lone_ends

    def _attempt_fact(self, fact: Fact) -> None:
        key = attempt_key(fact.kind, fact.session, fact.key_id, fact.attempt)
        if not fact.key_id:
            return
        ray = fact.source == "ray" and fact.kind == "task"
        if fact.state in TERMINAL:  # facts_of gives ends as bare keys; this is the rest
            self._close_all(frozenset([key]), every_end=fact.source == "ray")
            return
        if self.ended(key) or fact.inferred:
            return
        if not ray and not self._producer_start(fact):
            return
        found = self.attempts.get(key)
        if found is None:
            if len(self.attempts) >= self.max_attempts:
                self.untracked.add("too_many_attempts")
                return
            found = self.add(key, Attempt(fact.kind, ray, fact.session, fact.key_id,
                                          fact.attempt, fact.state))
        self._learn(found, fact)
        self.changed = True

    def _producer_start(self, fact: Fact) -> bool:
        """An emitter's task RUNNING or op STARTED, from a process seen alive."""
        started = "RUNNING" if fact.kind == "task" else "STARTED"
        if fact.state != started or fact.pid is None or fact.pid == self.own_pid:
            return False
        if fact.pid not in self.processes and self._messenger(fact.pid):
            return False
        return self.see(fact.pid, fact.time_ns)

    def _messenger(self, pid: int) -> bool:
        """`evagg emit` sends for a task run elsewhere (a shell script's RUNNING, its end
        sent later by another `evagg emit`): its exit ends nothing. Asked once per pid."""
        found = self._messengers.get(pid)
        if found is None:
            if len(self._messengers) >= MAX_MESSENGERS:
                self._messengers.clear()
            found = self._messengers[pid] = procs.is_evagg_emit(pid)
        return found

    def _learn(self, found: Attempt, fact: Fact) -> None:
        for name in ("job_id", "run_id", "node_id", "worker_id", "name", "step", "task_id"):
            value = getattr(fact, name)
            if value is not None and value != "":
                setattr(found, name, value)
        if found.state != "RUNNING":
            found.state = fact.state
        if not found.ray:
            found.pid = fact.pid
        elif fact.state == "RUNNING" and fact.worker_pid and self.see(fact.worker_pid,
                                                                      fact.time_ns):
            found.pid = fact.worker_pid

    def _remember_end(self, key: Key) -> None:
        self.closed.add([key])

    def _job_fact(self, fact: Fact) -> None:
        key = (fact.session, fact.key_id)
        job = self.jobs.get(key)
        if fact.state == "FINISHED" and job is not None:
            job.ended = True
            self.changed = True
        elif (fact.state == "DEFINED" and job is None and fact.worker_pid
              and self._local_driver(fact)):
            self.jobs[key] = Job(fact.session, fact.key_id, fact.worker_pid)
            self.changed = True

    def _local_driver(self, fact: Fact) -> bool:
        """The driver runs here: its pid is alive, started before the job, and its command
        line is the entrypoint Ray recorded (Ray writes the driver's own argv there); or
        the last run found it so, and it may have exited since (a job defined after the
        last snapshot, its driver killed while the agent was down)."""
        pid = fact.worker_pid
        assert pid is not None
        if pid in self.known_drivers:
            self.known_drivers.discard(pid)
            return self.see(pid, fact.time_ns)
        line = procs.command_line(pid)
        name = (fact.name or "").removeprefix("(interactive_shell) ")
        if not line or line != name or not self.see(pid, fact.time_ns):
            return False
        if self.on_driver is not None:
            self.on_driver(self.processes[pid].identity)
        return True

    def _actor_fact(self, fact: Fact) -> None:
        key = (fact.session, fact.key_id)
        if fact.state == "DEAD":
            if self.actors.pop(key, None) is not None:
                self.changed = True
            self._remember_end(attempt_key("actor", *key, 0))
            return
        if attempt_key("actor", *key, 0) in self.closed or fact.inferred:
            return
        actor = self.actors.get(key)
        if actor is None:
            if len(self.actors) >= self.max_attempts:
                self.untracked.add("too_many_attempts")
                return
            actor = self.actors[key] = Actor(fact.session, fact.key_id)
        actor.job_id = fact.job_id or actor.job_id
        actor.node_id = fact.node_id or actor.node_id
        actor.worker_id = fact.worker_id or actor.worker_id
        if fact.state == "ALIVE" and fact.worker_pid and self.see(fact.worker_pid, fact.time_ns):
            actor.pid = fact.worker_pid
        self.changed = True

    # -- processes -------------------------------------------------------------------------

    def see(self, pid: int, event_ns: int) -> bool:
        """Track `pid` if it is alive here and was there at `event_ns`; False if not."""
        if pid in self.processes:
            return True
        identity = self.known.pop(pid, None)  # the last run saw it alive: it may be gone now
        if identity is None:
            identity = procs.identity_of(pid)
            if identity is None or procs.started_ns(identity) > event_ns + CLOCK_SLACK_NS:
                self.untracked.add("not_visible")  # another namespace, host, or a reused pid
                return False
        if len(self.processes) >= self.max_processes:
            self.untracked.add("too_many_processes")
            return False
        self.processes[pid] = Process(identity)
        self.changed = True
        if self.on_new is not None:
            self.on_new(identity)
        return True

    def living(self) -> list[Identity]:
        """The tracked processes not found gone yet, for `procs.gone_of` off the loop."""
        return [p.identity for p in self.processes.values() if p.gone_ns is None]

    def mark_gone(self, gone: Iterable[Identity], now_ns: int) -> None:
        for identity in gone:
            process = self.processes.get(identity.pid)
            if process is not None and process.identity == identity and process.gone_ns is None:
                process.gone_ns = now_ns
                self.changed = True

    def due(self, now_ns: int, grace_ns: int) -> list[Process]:
        """Processes gone for longer than the grace, taken out of the set."""
        out = [p for p in self.processes.values()
               if p.gone_ns is not None and p.gone_ns + grace_ns <= now_ns]
        for process in out:
            del self.processes[process.identity.pid]
        self.changed |= bool(out)
        return out

    # -- what ends with a process ----------------------------------------------------------

    def take_attempts(self, pids: set[int]) -> dict[int, list[Attempt]]:
        """The open attempts and ops that ran in `pids`, by pid (one pass over the set)."""
        found: dict[int, list[Attempt]] = {}
        for key in [key for key, a in self.attempts.items() if a.pid in pids]:
            attempt = self._take(key)
            found.setdefault(attempt.pid or 0, []).append(attempt)
        return found

    def take_job_attempts(self, job: Job) -> list[Attempt]:
        keys = [key for key, a in self.attempts.items()
                if a.ray and a.session == job.session and a.job_id == job.job_id]
        return [self._take(key) for key in keys]

    def take_actors(self, pid: int, job: Job | None = None) -> list[Actor]:
        """The actors on `pid`; with `job`, also that job's actors with no live worker."""
        keys = [key for key, a in self.actors.items()
                if a.pid == pid or (job is not None and a.session == job.session
                                    and a.job_id == job.job_id
                                    and (a.pid is None or a.pid not in self.processes))]
        return [self.actors.pop(key) for key in keys]

    def take_jobs(self, pid: int) -> list[Job]:
        keys = [key for key, job in self.jobs.items() if job.driver_pid == pid]
        return [self.jobs.pop(key) for key in keys]

    def _take(self, key: Key) -> Attempt:
        self._remember_end(key)
        return self._drop(key)

    # -- the only writers of `attempts`, which keep `open_ops` ---------------------------

    def add(self, key: Key, attempt: Attempt) -> Attempt:
        """Open `attempt` under `key` (a new key: the caller looked it up)."""
        self.attempts[key] = attempt
        self.open_ops += attempt.kind == "op"
        return attempt

    def _drop(self, key: Key) -> Attempt:
        attempt = self.attempts.pop(key)
        self.open_ops -= attempt.kind == "op"
        return attempt
