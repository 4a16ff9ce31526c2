"""A spool full under `when_full = "block"`, as an operator meets it: the only sink's
endpoint is down, HTTP senders fill the spool. A sender gets a 503 with Retry-After
within seconds instead of a request held open, /readyz says the spool is full, the log
says once why events wait and for whom; once the endpoint is back, everything is
delivered and /readyz is ready again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.agentproc import REPO, AgentProcess, http_sink
from tests.aggregator.cli.newcomer import evagg
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

LINE = b'{"kind": "task", "name": "filler", "attrs": {"pad": "' + b"x" * 400 + b'"}}\n'


def post(agent: AgentProcess, body: bytes) -> tuple[int, str | None, float]:
    started = time.monotonic()
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, None, time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Retry-After"), time.monotonic() - started


def readyz(agent: AgentProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{agent.http_url}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def blocking_agent(agent_factory: Callable[..., AgentProcess], endpoint: ServerThread,
                   **options: str) -> AgentProcess:
    """An agent whose small spool blocks when full, its only sink's endpoint down (503)."""
    endpoint.answer_always(503)
    return agent_factory(sinks_toml=http_sink("collector", endpoint.url),
                         agent_toml='max_frame = "64KiB"',
                         spool_toml='max_bytes = "1MiB"\nsegment_bytes = "128KiB"\n'
                                    'when_full = "block"', **options).start()


def fill_to_the_brim(agent: AgentProcess) -> None:
    """Bodies of 100 events until one gets a 503, then of one event until one does."""
    sent = 0
    for lines in (100, 1):
        while post(agent, LINE * lines)[0] == 200:
            sent += lines
            assert sent < 10_000, "the spool never filled"


def test_a_full_blocking_spool_answers_503_and_says_why(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint)
    sent = 0
    while True:
        status, retry_after, took = post(agent, LINE * 100)
        if status != 200:
            break
        sent += 100
        assert sent < 10_000, "the spool never filled"
    # it waited 5 s for room already: an OTel SDK's 10 s export has time for a second try
    assert (status, retry_after) == (503, "1") and took < 15, (status, retry_after, took)
    assert readyz(agent) == (503, "spool full: new events wait for room\n")
    status = evagg("status", "--url", agent.http_url, "--interval", "0.1").stdout
    assert 'full: new events wait for room (when_full = "block")' in status, status
    said = [line for line in agent.log().splitlines() if "spool full (when_full=block)" in line]
    assert len(said) == 1 and "until collector delivers" in said[0], said
    endpoint.answer_always(200)
    wait_until(lambda: readyz(agent)[0] == 200, 60, lambda: f"ready again: {readyz(agent)}")
    assert "wait for room" not in evagg("status", "--url", agent.http_url).stdout
    assert post(agent, LINE)[0] == 200
    def filler() -> int:
        return len({e["event_id"] for e in endpoint.accepted_events() if e.get("name") == "filler"})

    wait_until(lambda: filler() == sent + 1, 60, lambda: f"{sent + 1} events at the endpoint")


def test_a_stop_with_the_spool_full_says_why_its_last_heartbeat_is_missing(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint, drain_timeout="2s")
    fill_to_the_brim(agent)  # no room left even for the small last heartbeat
    assert agent.stop() == 0
    said = [line for line in agent.log().splitlines() if "final heartbeat not written" in line]
    assert said and "the spool had no room for it within" in said[0], said
    assert "silence" in said[0]


def test_a_start_on_a_full_spool_is_not_held_by_its_start_heartbeat(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """The next agent on a spool left full: the heartbeat it writes as it starts finds no
    room, so it starts without it, says so, and its next heartbeat comes on time."""
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint, drain_timeout="2s")
    fill_to_the_brim(agent)
    assert agent.stop() == 0
    agent.start()  # ready, not held: the wait for room is bounded
    said = [line for line in agent.log().splitlines() if "start heartbeat not written" in line]
    assert said and "the spool had no room for it within" in said[0], said
    assert agent.metric('evagg_received_events_total{route="agent"}') == 0
    assert agent.proc is not None
    pid = agent.proc.pid
    endpoint.answer_always(200)  # room again: the periodic heartbeats go on (2 s here)
    wait_until(lambda: any(e.get("kind") == "agent" and e.get("pid") == pid
                           for e in endpoint.accepted_events()),
               60, "a heartbeat of the new agent at the endpoint")


PRODUCER = """
import json, sys, emitters
emitter = emitters.Emitter(socket=sys.argv[1], max_buffer_bytes=256 * 1024, exit_timeout=2.0)
for i in range(20_000):
    emitter.emit(kind="task", name="gone", task_id=f"g{i}", attrs={"pad": "y" * 200})
emitter.close()
print(json.dumps(emitter.stats().dropped))
"""


def test_a_producer_that_exits_while_the_spool_is_full_has_its_losses_counted(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """A batch job that ends while the spool is full: its frames wait behind the ones the
    spool cannot take, so its loss reports came too late (never, once it had exited), and
    `evagg status` said `lost none`. Its last report now comes on a fresh connection."""
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint)
    fill_to_the_brim(agent)  # the producer's first frame waits for room
    done = subprocess.run([sys.executable, "-c", PRODUCER, str(agent.socket_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    dropped = json.loads(done.stdout.strip().splitlines()[-1])
    assert dropped.get("buffer_full", 0) > 0, dropped  # the job itself knew
    wait_until(lambda: agent.metric(
        'evagg_producer_dropped_events_total{reason="buffer_full"}') == dropped["buffer_full"],
        30, lambda: f"the producer's buffer_full drops in /metrics: {dropped}")
    # the events it gave up on at its exit without sending them; those it had sent may
    # still be stored, so the agent counts no more than the job's own exit_deadline
    gave_up = agent.metric('evagg_producer_dropped_events_total{reason="exit_deadline"}')
    assert gave_up <= dropped["exit_deadline"], (gave_up, dropped)
    status = evagg("status", "--url", agent.http_url, "--interval", "0.1")
    assert "lost       none" not in status.stdout, status.stdout
    assert "by producers" in status.stdout and "buffer_full=" in status.stdout


# A batch job that writes faster than a full spool takes and then ends: it leaves the
# interpreter as scripts do, without calling close(). Its frames are 16 KiB (the agent
# above reads frames of up to 64 KiB), and the attrs differ by event so that no column
# is constant.
EXITING_PRODUCER = """
import sys, emitters
emitters.configure(socket=sys.argv[1], max_frame_bytes=16 * 1024, exit_timeout=1.0,
                   job_id="train-7", run_id="lr-sweep-3")
for i in range(int(sys.argv[2])):
    emitters.emit(kind="task", name="gone", task_id=f"g{i}", attrs={"pad": str(i) * 40})
"""


def lost_by_loss_events(events: list[dict[str, Any]]) -> int:
    """What the `loss` rows say was lost, as `evagg status`'s query counts them: each
    session's largest total per reason."""
    lost: dict[tuple[str, str], int] = {}
    for event in events:
        if event.get("kind") == "loss":
            key = (str(event.get("attrs", {}).get("session")), str(event.get("name")))
            metrics = event.get("metrics") or {}
            count = int(metrics.get("events_total", metrics.get("events", 0)))
            lost[key] = max(lost.get(key, 0), count)
    return sum(lost.values())


def test_every_event_of_a_producer_that_exits_while_the_spool_is_full_is_delivered_or_counted(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """The producer's frames that the agent had not read when it exited were neither
    stored nor counted: its last loss report, on a fresh connection, was stored first
    and made them look like resends already stored, and the agent closed a connection
    whose acks could no longer be written without reading the rest of its frames. Once
    the sink is back, each emitted event is delivered or counted lost, by the metrics,
    by `evagg status` and by the `loss` rows alike."""
    emitted = 3000
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint)
    fill_to_the_brim(agent)
    done = subprocess.run([sys.executable, "-c", EXITING_PRODUCER, str(agent.socket_path),
                           str(emitted)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    endpoint.answer_always(200)

    def gone() -> int:
        return len({e["event_id"] for e in endpoint.accepted_events() if e.get("name") == "gone"})

    def counted_lost() -> float:
        return agent.metric("evagg_producer_dropped_events_total")

    def accounted() -> bool:
        return gone() + counted_lost() >= emitted

    wait_until(accounted, 120, lambda: f"{emitted} events delivered or counted lost: "
               f"{gone()} delivered, {counted_lost():.0f} counted lost, the producer said "
               f"{done.stderr.strip()!r}")
    lost = counted_lost()
    assert gone() + lost == emitted, (gone(), lost)
    wait_until(lambda: lost_by_loss_events(endpoint.accepted_events()) == lost, 60,
               lambda: f"loss rows for {lost:.0f} events: {endpoint.accepted_events()[-5:]}")
    status = evagg("status", "--url", agent.http_url).stdout
    assert (f"lost       {lost:,.0f} events" if lost else "lost       none") in status, status


def test_an_exited_producers_frames_the_agent_stops_before_storing_are_counted_lost(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """The agent is stopped while the spool is still full and the frames of a producer
    that has exited wait for room: nobody can send them again. They were lost without a
    count; now the stopping agent counts them (`unstored_at_stop`) and, its last `loss`
    event having no room either, the next start reports them. Every emitted event is
    delivered or counted lost, in the `loss` rows and in `evagg status`. The producer's
    own reports of its drops among those frames stay its own: `evagg status` shows them
    as lost by producers, and their `loss` rows carry its pid, session, job and run (they
    were written as the agent's own losses, then without the job and run)."""
    emitted = 3000
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint, drain_timeout="2s")
    fill_to_the_brim(agent)
    producer = subprocess.Popen([sys.executable, "-c", EXITING_PRODUCER,
                                 str(agent.socket_path), str(emitted)], stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    _, stderr = producer.communicate(timeout=120)
    done = subprocess.CompletedProcess(producer.args, producer.returncode, "", stderr)
    assert done.returncode == 0, done.stderr
    assert agent.stop() == 0
    said = [line for line in agent.log().splitlines() if "unstored_at_stop" in line]
    assert said and "has exited and cannot send them again" in said[0], agent.log()[-3000:]
    endpoint.answer_always(200)
    agent.start()
    assert "reporting" in agent.log() and "the last run lost" in agent.log()

    def gone() -> int:
        return len({e["event_id"] for e in endpoint.accepted_events() if e.get("name") == "gone"})

    def counted_lost() -> int:
        return lost_by_loss_events(endpoint.accepted_events())

    wait_until(lambda: gone() + counted_lost() >= emitted, 120,
               lambda: f"{emitted} events delivered or counted lost: {gone()} delivered, "
               f"{counted_lost()} in loss rows, the producer said {done.stderr.strip()!r}")
    assert gone() + counted_lost() == emitted, (gone(), counted_lost())
    unstored = agent.metric('evagg_dropped_events_total{reason="unstored_at_stop"}')
    assert unstored > 0
    status = evagg("status", "--url", agent.http_url).stdout
    by_agent = [line for line in status.splitlines() if line.startswith("  by the agent")]
    assert by_agent and "unstored_at_stop=" in by_agent[0], status
    theirs = [e for e in endpoint.accepted_events()
              if e.get("kind") == "loss" and e.get("name") != "unstored_at_stop"]
    assert theirs, "the producer reported no drops in its last frames"  # exit_deadline
    for row in theirs:  # the producer's, as its stored reports are
        assert row["pid"] == producer.pid and row["attrs"].get("session"), row
        assert (row.get("job_id"), row.get("run_id")) == ("train-7", "lr-sweep-3"), row
        assert f"{row['name']}=" not in by_agent[0], status
    by_producers = [line for line in status.splitlines() if line.startswith("  by producers")]
    assert by_producers and all(f"{row['name']}=" in by_producers[0] for row in theirs), status


LIVE_PRODUCER = """
import sys, time, emitters
emitters.configure(socket=sys.argv[1], max_frame_bytes=16 * 1024)
for i in range(500):
    emitters.emit(kind="task", name="alive", task_id=f"a{i}", attrs={"pad": str(i) * 40})
print("sent", flush=True)
time.sleep(600)
"""


def test_a_live_producers_frames_left_at_a_stop_are_not_counted_lost(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """A producer that still runs keeps what the agent did not store and resends it to
    the next agent: counting it lost at the stop would count it twice."""
    endpoint = servers()
    agent = blocking_agent(agent_factory, endpoint, drain_timeout="2s")
    fill_to_the_brim(agent)
    producer = subprocess.Popen([sys.executable, "-c", LIVE_PRODUCER, str(agent.socket_path)],
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert producer.stdout is not None and producer.stdout.readline() == "sent\n"
        wait_until(lambda: agent.metric("evagg_open_connections") >= 1, 30,
                   "the producer's connection")
        assert agent.stop() == 0
        assert "unstored_at_stop" not in agent.log()
        endpoint.answer_always(200)
        agent.start()  # the producer reconnects and resends
        wait_until(lambda: len({e["event_id"] for e in endpoint.accepted_events()
                                if e.get("name") == "alive"}) == 500, 60,
                   "the live producer's 500 events delivered")
    finally:
        producer.kill()
        producer.wait()
