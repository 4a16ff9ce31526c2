"""HTTP sinks through a real agent: a flaky endpoint gets every event, a healthy one keeps
its pace meanwhile, and permanent 4xx answers go to dead letters that replay delivers."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sinks.http.options import HttpOptions
from tests.agentproc import REPO, AgentProcess, http_sink
from tests.producers import producer_report, start_producer
from tests.sinks.certs import make_pki
from tests.sinks.flaky_server import ONE_IN_THREE
from tests.sinks.http.through_loop import resent_after_stored
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until


def task_ids(server: ServerThread) -> set[str]:
    """The tasks of every batch `server` answered with a 2xx."""
    return {str(e.get("task_id")) for s in list(server.server.requests)
            if 200 <= s.status < 300 for e in s.events if e.get("kind") == "task"}


def test_flaky_endpoint_gets_everything_while_a_healthy_sink_keeps_pace(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    flaky, healthy = servers(), servers()
    flaky.do(lambda: flaky.server.answer(500, times=3))
    flaky.do(lambda: flaky.server.answer(429, times=2, retry_after="1"))
    flaky.do(lambda: flaky.server.answer(503, times=1, retry_after="1"))
    flaky.do(lambda: flaky.server.answer(200, times=1, delay_s=2.0))  # past the 1 s timeout

    def two_batches_stored(events: list[dict[str, Any]]) -> bool:
        return len({s.key for s in flaky.server.requests if s.stored}) >= 2

    # The outage starts between successes: every request after the endpoint has stored two
    # batches waits, unanswered, until the port closes under it. Stopping on a poll instead
    # races the rest of the batches, which go in a fraction of a second once one succeeds;
    # holding only the first let the sink's other requests in flight (up to 4) deliver
    # everything before the port closed.
    unanswered = asyncio.Event()
    for _ in range(2 * HttpOptions.max_in_flight):  # the sink's default
        flaky.do(lambda: flaky.server.answer_when(two_batches_stored, 200, hold=unanswered))
    agent = agent_factory(sinks_toml=http_sink("flaky", flaky.server.url, "gzip = true")
                          + http_sink("healthy", healthy.server.url, 'format = "json"')).start()
    producers = [start_producer(agent.socket_path, f"h{n}", 4000) for n in range(3)]
    wait_until(lambda: flaky.server.held >= 1, 60,
               "the scripted answers, two stored batches and the requests after them")
    flaky.call(flaky.server.stop())  # connections refused for a while
    flaky.do(unanswered.set)  # nothing is waiting on it once the port closed
    total = 12_000
    assert 0 < len(task_ids(flaky)) < total
    for proc in producers:
        assert producer_report(proc)["flushed"]

    wait_until(lambda: len(task_ids(healthy)) == total, 60, "the healthy sink")
    # the healthy sink finished while the flaky one was still refusing connections
    assert len(task_ids(flaky)) < total
    flaky.call(flaky.server.start())
    wait_until(lambda: len(task_ids(flaky)) == total, 120, "the flaky sink to catch up")
    assert agent.stop() == 0

    statuses = {s.status for s in flaky.server.requests}
    assert {500, 429, 503, 200} <= statuses
    # every retried batch kept its Idempotency-Key, so counting each key once counts
    # every event once
    per_key: dict[str, int] = {}
    for key, seen in flaky.server.batches().items():
        accepted = [s for s in seen if 200 <= s.status < 300]
        assert accepted, f"batch {key} never accepted"
        per_key[key] = sum(1 for e in accepted[0].events if e.get("kind") == "task")
    assert sum(per_key.values()) == total
    assert all(s.content_encoding == "gzip" for s in flaky.server.requests)


def test_sigterm_while_the_endpoint_is_down_exits_at_the_deadline_and_a_restart_delivers(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    endpoint.call(endpoint.server.stop())  # connections refused: the endpoint is down
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.server.url),
                          drain_timeout="3s").start()
    assert producer_report(start_producer(agent.socket_path, "down", 3000))["flushed"]
    failed = 'evagg_delivery_errors_total{kind="connect",sink="collector"}'
    wait_until(lambda: agent.metric(failed) >= 1, 30, "the sink to find the endpoint down")
    assert agent.proc is not None
    stopping = time.monotonic()
    assert agent.stop(timeout=60) == 0
    took = time.monotonic() - stopping
    log = agent.log()
    print(f"\nexited {took:.1f}s after SIGTERM with a 3 s drain deadline")
    # the deadline and the in-flight grace, then a shutdown of well under a second here;
    # 15 s for it on a loaded machine: a drain without the deadline never ends at all
    assert took < 3 + 5 + 15
    said = [line for line in log.splitlines() if "cannot deliver while draining" in line]
    assert len(said) == 1  # said once, with where, how long and what stays
    assert endpoint.server.url in said[0] and "s more" in said[0]
    assert "undelivered events stay spooled" in said[0]
    assert "events to deliver at the deadline" in log and "they stay spooled" in log
    assert "records" not in "".join(said)  # the user counts events, as status does

    endpoint.call(endpoint.server.start())
    agent.start()

    def tasks() -> list[str]:
        return [str(e.get("task_id")) for s in list(endpoint.server.requests) if s.stored
                for e in s.events if e.get("kind") == "task"]

    wait_until(lambda: len(tasks()) >= 3000, 60, "the restarted agent to deliver the rest")
    labels = '{sink="collector",type="http"}'
    assert 1 <= agent.metric(f"evagg_sink_concurrency_limit{labels}") <= 4  # max_in_flight
    assert agent.metric(f"evagg_sink_answer_latency_seconds{labels}") > 0
    assert "# TYPE evagg_sink_requests_in_flight gauge" in agent.metrics()
    lost_answers = agent.metric('evagg_delivery_errors_total{kind="timeout"') \
        + agent.metric('evagg_delivery_errors_total{kind="connect"')
    assert agent.stop() == 0
    assert sorted(set(tasks())) == sorted(f"down-{i}" for i in range(3000))  # every one
    # Once each, but for what docs/sinks-http.md allows: a batch whose answer was lost
    # (a timeout on a loaded machine) is sent again with its key, one copy per lost answer.
    stored = [s for s in endpoint.server.requests if s.stored]
    first_of = {s.key: s for s in reversed(stored)}
    resent = [s for s in stored if first_of[s.key] is not s]
    assert all(s.events == first_of[s.key].events for s in resent)  # the same rows
    copies = sum(1 for s in resent for e in s.events if e.get("kind") == "task")
    assert len(tasks()) == 3000 + copies and len(resent) <= lost_answers, \
        (len(tasks()), len(resent), lost_answers)


def test_an_endpoint_failing_one_request_in_three_costs_a_retry_per_failure_not_a_storm(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    endpoint.do(lambda: endpoint.server.rotate(ONE_IN_THREE))  # 500s, 429s, slow 200s
    sink = (f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{endpoint.server.url}"\n'
            'batch_max_events = 500\nbatch_interval = "200ms"\n')  # the default 10 s timeout
    agent = agent_factory(sinks_toml=sink).start()
    assert producer_report(start_producer(agent.socket_path, "rot", 10_000))["flushed"]

    def tasks() -> list[str]:
        return [str(e.get("task_id")) for s in list(endpoint.server.requests) if s.stored
                for e in s.events if e.get("kind") == "task"]

    wait_until(lambda: len(set(tasks())) >= 10_000, 120, "every event at the endpoint")
    assert agent.stop() == 0
    requests, batches = len(endpoint.server.requests), len(endpoint.server.batches())
    print(f"\n{requests} requests for {batches} batches")
    assert sorted(tasks()) == sorted(f"rot-{i}" for i in range(10_000))  # each one, once
    assert resent_after_stored(endpoint.server) == []
    assert requests <= 1.7 * batches
    assert "sink collector failed" not in agent.log()  # the loop never backed off


def test_permanent_4xx_goes_to_dead_letters_and_replay_delivers(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    endpoint = servers()
    endpoint.do(lambda: endpoint.server.answer(400, times=None, text="schema mismatch"))
    # tasks only: the agent's own heartbeats, each refused and dead-lettered in turn, kept
    # the lag above 0 on a machine whose disk was slow to fsync them
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.server.url,
                                               'kinds = ["task"]')).start()
    assert producer_report(start_producer(agent.socket_path, "dl", 1500))["flushed"]
    wait_until(lambda: agent.metric('evagg_sink_lag_events{sink="collector"}') == 0, 60,
               "the collector sink to move past the rejected batches")
    assert "# TYPE evagg_http_sink_dead_lettered_events_total counter" in agent.metrics()

    def dead_letters_match() -> bool:  # what an operator alerts on: each refused event
        dead = agent.metric('evagg_http_sink_dead_lettered_events_total{sink="collector"}')
        return dead >= 1500 and dead == sum(len(s.events) for s in endpoint.server.requests)

    wait_until(dead_letters_match, 30, "the dead-letter counter to count every refused event")
    assert agent.metric('evagg_http_sink_requests_4xx_total{sink="collector"}') >= 1
    assert agent.stop() == 0

    listed = evagg("dlq", "list", "--sink", "collector", "--config", str(agent.config_path))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert re.match(r"\d+ dead-lettered batches \(\d+ events\) in /", lines[-2]), lines
    assert lines[-1] == ("`evagg dlq replay --sink collector` sends them again (--url to "
                         "send them elsewhere)")
    # a line per batch: when, the answer, its events, its key (no Python reprs)
    assert all(re.fullmatch(r"\S+Z  HTTP 400  \d+ events  key \S+  http://\S+  "
                            r"'schema mismatch'", line) for line in lines[:-2]), lines

    endpoint.do(lambda: endpoint.server.answer(200, times=None))
    replayed = evagg("dlq", "replay", "--sink", "collector", "--config",
                     str(agent.config_path))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert re.fullmatch(r"sent \d+ batches \(\d+ events\) to http://\S+; their files are "
                        r"deleted\n", replayed.stdout), replayed.stdout
    delivered = {str(e.get("task_id")) for s in endpoint.server.requests if s.status == 200
                 for e in s.events if e.get("kind") == "task"}
    assert delivered == {f"dl-{i}" for i in range(1500)}
    again = evagg("dlq", "list", "--sink", "collector", "--config", str(agent.config_path))
    assert "0 dead-lettered batches" in again.stdout


def test_mutual_tls_with_a_private_ca_from_the_config_and_replay_over_it(
        agent_factory: Callable[..., AgentProcess], servers: Callable[..., ServerThread],
        tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    endpoint = servers(pki.server_context(require_client_cert=True))
    endpoint.do(lambda: endpoint.server.answer(400, times=1, text="one batch refused"))
    # tasks only, as above: the agent's heartbeats (one as it starts, then every 2 s) each
    # count as delivered only at the delivery loop's next flush after their POST, so with
    # them the lag reads 0 only for moments between two, which the wait below may miss
    tls = (f'tls_ca_file = "{pki.ca.cert}"\ntls_cert_file = "{pki.client.cert}"\n'
           f'tls_key_file = "{pki.client.key}"\nkinds = ["task"]')
    agent = agent_factory(sinks_toml=http_sink("secure", endpoint.server.url, tls)).start()
    assert producer_report(start_producer(agent.socket_path, "tls", 2000))["flushed"]
    wait_until(lambda: agent.metric('evagg_sink_lag_events{sink="secure"}') == 0, 60,
               "the https sink to deliver")
    assert agent.stop() == 0
    replayed = evagg("dlq", "replay", "--sink", "secure", "--config", str(agent.config_path))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    delivered = {str(e.get("task_id")) for s in endpoint.server.requests if s.status == 200
                 for e in s.events if e.get("kind") == "task"}
    assert delivered == {f"tls-{i}" for i in range(2000)}
    assert endpoint.server.url.startswith("https://")


def evagg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_unknown_sink_for_dlq_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    config.write_text('[[sinks]]\nname = "lake"\ntype = "parquet"\n'
                      f'url = "{tmp_path / "lake"}"\n')
    result = evagg("dlq", "list", "--sink", "nope", "--config", str(config))
    assert result.returncode == 2 and "no http sink named 'nope'" in result.stderr


def test_a_413_sends_the_batch_in_halves_and_dead_letters_only_an_event_too_large_alone(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    # The endpoint takes bodies up to 20 kB (nginx's client_max_body_size, an API
    # gateway's limit): the sink's batches of 500 events are larger.
    endpoint = servers()
    endpoint.do(lambda: setattr(endpoint.server, "max_body", 20_000))
    agent = agent_factory(sinks_toml=http_sink("collector", endpoint.url)).start()
    assert producer_report(start_producer(agent.socket_path, "big", 2000))["flushed"]
    wait_until(lambda: len(task_ids(endpoint)) == 2000, 90, "every event, in smaller requests")
    assert 413 in {s.status for s in endpoint.server.requests}
    assert all(s.wire_bytes <= 20_000 for s in endpoint.server.requests if s.stored)
    labels = '{sink="collector",type="http"}'
    assert agent.metric(f"evagg_sink_split_batches_total{labels}") >= 1
    assert agent.metric(f"evagg_sink_dead_lettered_events_total{labels}") == 0
    assert "as too large (HTTP 413); sending it in halves" in agent.log()

    # one event larger than the endpoint takes: dead-lettered alone, and counted
    endpoint.do(lambda: setattr(endpoint.server, "max_body", 1_000))
    sent = evagg("emit", "--socket", str(agent.socket_path), "--kind", "task", "--name",
                 "huge", "--field", "task_id=huge-1", "--field", "error=" + "x" * 2000)
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: agent.metric(f"evagg_sink_dead_lettered_events_total{labels}") >= 1,
               60, "the one event too large to dead letters")
    letters = evagg("dlq", "list", "--sink", "collector", "--config", str(agent.config_path))
    assert "HTTP 413" in letters.stdout and "1 events" in letters.stdout, letters.stdout
    assert agent.stop() == 0


def test_a_sink_pointed_at_elasticsearch_bulk_or_loki_push_is_warned_about_at_once(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    # the sink's bare events are not what _bulk or Loki's push take: say so before every
    # batch comes back 400 and fills the dead letters
    sinks = (http_sink("search", "http://127.0.0.1:9/logs-evagg/_bulk")
             + http_sink("logs", "http://127.0.0.1:9/loki/api/v1/push")
             + http_sink("relay", "http://127.0.0.1:9/ingest"))
    agent = agent_factory(sinks_toml=sinks)
    checked = evagg("check-config", "--config", str(agent.config_path))
    assert checked.returncode == 0, checked.stderr
    warned = [line for line in checked.stderr.splitlines() if "config warning" in line]
    assert len(warned) == 2, checked.stderr
    assert "(search).url: Elasticsearch/OpenSearch _bulk needs an action line" in warned[0]
    assert "(logs).url: Loki's push API" in warned[1]
    assert all("Backends you may already run" in line for line in warned)
    agent.start()
    assert "_bulk needs an action line" in agent.log()
    assert agent.stop() == 0
