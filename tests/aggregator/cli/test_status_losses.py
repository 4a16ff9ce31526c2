"""`evagg status` after a producer lost events: what was lost, by whom and why.

The producer is the emitter library against a real agent: two events too large for its
frames, and one the agent refused alone in its frame (a nack).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable

import orjson

from tests.agentproc import AgentProcess, http_sink
from tests.aggregator.cli.losing_producer import lose_three_events
from tests.aggregator.cli.newcomer import evagg
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until


def test_status_says_what_producers_lost_and_why(agent: AgentProcess) -> None:
    lose_three_events(agent)
    result = evagg("status", "--url", agent.http_url, "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "lost       3 events (each loss is also a `loss` row in the lake)" in lines
    producers = next(line for line in lines if line.startswith("  by producers"))
    assert "unencodable=1 (the producer could not encode the event)" in producers
    assert "too_large=2 (one event larger than the producer's max_frame_bytes)" in producers
    assert "lost       none" not in result.stdout
    as_json = orjson.loads(evagg("status", "--url", agent.http_url, "--interval", "0.1",
                                 "--json").stdout)
    assert as_json["producer_dropped"] == {"too_large": 2, "unencodable": 1}
    assert as_json["dropped"] == {}


def test_status_with_nothing_lost_says_none(agent: AgentProcess) -> None:
    result = evagg("status", "--url", agent.http_url, "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    assert "lost       none" in result.stdout.splitlines()


def test_the_query_status_gives_names_the_producer_that_lost_them(agent: AgentProcess) -> None:
    lose_three_events(agent)
    text = evagg("status", "--url", agent.http_url, "--interval", "0.1").stdout
    which = next(line for line in text.splitlines() if line.startswith("  which ones"))
    sql = which.split("evagg query sql ", 1)[1].strip().strip('"')
    agent.stop()
    answer = evagg("query", "--data", str(agent.lake_dir), "--no-cache", "sql", sql, "--json")
    assert answer.returncode == 0, answer.stderr
    rows = orjson.loads(answer.stdout)
    assert {(row["pid"], row["reason"], row["events"]) for row in rows} == {
        (os.getpid(), "unencodable", 1.0), (os.getpid(), "too_large", 2.0)}


def test_a_sink_whose_endpoint_refused_events_for_good_says_so(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    endpoint.do(lambda: endpoint.server.answer(400, times=None, text="schema mismatch"))
    # tasks only: the agent's own heartbeats (one as it starts) would be refused too and
    # make the count in the line depend on when they were sent
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.server.url,
                                               'kinds = ["task"]')).start()
    sent = evagg("emit", "--socket", str(agent.socket_path), "--name", "refused-downstream")
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: agent.metric('evagg_sink_dead_lettered_events_total{sink="collector",')
               >= 1, 60, "the endpoint's refusal to be dead-lettered")
    text = evagg("status", "--url", agent.http_url, "--interval", "0.1").stdout
    line = next(line for line in text.splitlines() if line.startswith("sink collector"))
    assert "dead letters: 1 event waiting (evagg dlq list --sink collector)" in line, line
    # The endpoint is fixed and the operator replays: status no longer sends them to dlq.
    endpoint.do(lambda: endpoint.server.answer(200, times=None))
    replayed = evagg("dlq", "replay", "--sink", "collector", "--config", str(agent.config_path))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    text = evagg("status", "--url", agent.http_url, "--interval", "0.1").stdout
    line = next(line for line in text.splitlines() if line.startswith("sink collector"))
    assert "dead letters" not in line and "dead-lettered" not in line, line


def test_a_spool_that_dropped_for_room_says_so_at_once(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """`when_full = "drop_oldest"` with the only sink down: the loss is in `evagg status`
    and in the log (how many, whose) within seconds, not at the next heartbeat, five
    minutes away here."""
    agent = agent_factory(sinks_toml=http_sink("collector", "http://127.0.0.1:9/ingest"),
                          agent_toml='max_frame = "64KiB"',
                          spool_toml='max_bytes = "1MiB"\nsegment_bytes = "128KiB"\n'
                                     'when_full = "drop_oldest"',
                          heartbeat_interval="300s").start()
    line = b'{"kind": "task", "name": "filler", "attrs": {"pad": "' + b"x" * 400 + b'"}}\n'
    while agent.metric('evagg_spool_totals{total="dropped_records"}') == 0:
        post = urllib.request.Request(f"{agent.http_url}/v1/events", data=line * 100,
                                      method="POST")
        with urllib.request.urlopen(post, timeout=10) as answer:
            assert answer.status == 200
    wait_until(lambda: agent.metric('evagg_dropped_events_total{reason="drop_oldest"}') > 0,
               5, lambda: f"the loss on /metrics within 5 s:\n{agent.metrics()}")
    result = evagg("status", "--url", agent.http_url, "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    assert "lost       none" not in result.stdout
    by_agent = next(x for x in result.stdout.splitlines() if x.startswith("  by the agent"))
    assert "drop_oldest=" in by_agent, result.stdout
    said = [x for x in agent.log().splitlines() if "spool full: dropped the oldest" in x]
    assert len(said) == 1, said  # once a minute, however many segments went
    assert "not yet delivered to collector" in said[0] and "(when_full=drop_oldest)" in said[0]
