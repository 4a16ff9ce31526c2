"""What an operator scrapes from a real agent: every sink's own counts with its `sink`
label (Parquet on disk and on S3, HTTP), the names docs/metrics.md promises, and losses
that producers report, all read through prometheus_client's parser."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggregator.gauges import SINK_COUNT_HELP, SINK_GAUGE_HELP
from tests.agentproc import REPO, AgentProcess, http_sink
from tests.sinks.moto_server import MotoS3, aws_env
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(agent: AgentProcess) -> tuple[Samples, set[str]]:
    """Every sample by (name, labels), and every family and sample name."""
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(agent.metrics()):
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, names


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def post_events(agent: AgentProcess, events: list[dict[str, Any]]) -> None:
    body = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def documented_agent_metrics() -> list[str]:
    """The names in the table of the agent's own metrics in docs/metrics.md."""
    text = (REPO / "docs" / "metrics.md").read_text()
    table = text.split("## The agent's own metrics", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(evagg_[a-z0-9_]+)`", table, flags=re.MULTILINE)


def test_every_sink_reports_its_counts_and_the_documented_names_stay(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    web = servers()
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\n'
             'roll_interval = "1s"\n\n' + http_sink("web", web.server.url))
    agent = agent_factory(sinks_toml=sinks).start()
    post_events(agent, [{"kind": "task", "name": "fit", "task_id": f"t{i}"} for i in range(40)])
    post_events(agent, [  # what an emitter sends when its buffer overflowed, and a stranger
        {"kind": "loss", "name": "buffer_full", "state": "DROPPED", "metrics": {"events": 5}},
        {"kind": "loss", "name": "made-up reason", "metrics": {"events": 2}}])
    agent.wait_delivered(42, sink="lake")
    agent.wait_delivered(42, sink="web")
    wait_until(lambda: value(scrape(agent)[0], "evagg_sink_requests_2xx_total",
                             sink="web", type="http") > 0, 30, "the web sink's count")

    samples, names = scrape(agent)
    lake = {"sink": "lake", "type": "parquet"}
    assert value(samples, "evagg_sink_files_written_total", **lake) >= 1
    assert value(samples, "evagg_sink_events_written_total", **lake) >= 42
    written = sum(p.stat().st_size for p in agent.lake_dir.rglob("*.parquet"))
    assert 0 < value(samples, "evagg_sink_bytes_written_total", **lake) <= written
    assert not [key for key in samples if key[0] == "evagg_sink_publish_failures_total"]

    # the HTTP sink's counts: under the contract's names and, unchanged, the old ones
    for count in ("requests_2xx", "bytes_sent", "events_sent", "dead_lettered_events"):
        new = value(samples, f"evagg_sink_{count}_total", sink="web", type="http")
        assert value(samples, f"evagg_http_sink_{count}_total", sink="web") == new
    assert value(samples, "evagg_sink_events_sent_total", sink="web", type="http") >= 42

    # the emitter's loss is counted once, apart from the agent's own losses; a reason no
    # emitter has is folded into "other"
    assert value(samples, "evagg_producer_dropped_events_total", reason="buffer_full") == 5
    assert value(samples, "evagg_producer_dropped_events_total", reason="other") == 2
    assert not [key for key in samples if key[0] == "evagg_dropped_events_total"
                and samples[key]]  # each of the agent's own reasons is there, at 0
    # a heartbeat later (in the lake, with any loss rows it wrote): still once
    beats = agent.query("SELECT count(*) FROM events WHERE kind = 'agent'")[0][0]
    wait_until(lambda: agent.query("SELECT count(*) FROM events WHERE kind = 'agent'")[0][0]
               > beats, 30, "a heartbeat after the losses, in the lake")
    assert agent.query("SELECT count(*) FROM events WHERE kind = 'loss'") == [(2,)]

    missing = [name for name in documented_agent_metrics()
               if name not in names and name.removesuffix("_total") not in names]
    assert missing == []
    assert agent.stop() == 0


def test_each_sink_family_says_what_it_measures(agent_factory: Callable[..., AgentProcess],
                                                servers: Callable[..., ServerThread]) -> None:
    """A dashboard builder reads HELP in the metric browser: every family of the sinks'
    own counts and values says what it measures (and the unit where it has one), not one
    sentence shared by all of them."""
    web = servers()
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\n'
             'roll_interval = "1s"\n\n' + http_sink("web", web.server.url))
    agent = agent_factory(sinks_toml=sinks).start()
    post_events(agent, [{"kind": "task", "name": "fit", "task_id": "t1"}])
    agent.wait_delivered(1, sink="web")
    helps = {family.name: family.documentation
             for family in text_string_to_metric_families(agent.metrics())
             if family.name.startswith("evagg_sink_")}
    assert len(helps) > 20
    shared = {name: text for name, text in helps.items()
              if list(helps.values()).count(text) > 1}
    assert shared == {}
    generic = [name for name, text in helps.items()
               if text in (SINK_COUNT_HELP, SINK_GAUGE_HELP)]
    assert generic == []  # each family its own words, none the fallback
    assert "moving average" in helps["evagg_sink_answer_latency_seconds"].lower()
    assert "seconds until" in helps["evagg_sink_file_closes_in_seconds"].lower()
    assert agent.stop() == 0


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def test_a_failed_s3_upload_shows_on_metrics(agent_factory: Callable[..., AgentProcess],
                                             moto: MotoS3) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"  # never created: every upload fails
    sinks = ('[[sinks]]\nname = "s3lake"\ntype = "parquet"\n'
             f'url = "s3://{bucket}/lake/"\nendpoint_url = "{moto.endpoint_url}"\n'
             'path_style = true\nroll_interval = "1s"\n')
    agent = agent_factory(sinks_toml=sinks, env=aws_env()).start()
    post_events(agent, [{"kind": "task", "name": "fit", "task_id": f"t{i}"} for i in range(10)])
    s3lake = {"sink": "s3lake", "type": "parquet"}

    def failed_uploads() -> float:
        return value(scrape(agent)[0], "evagg_sink_publish_failures_total",
                     reason="s3_no_such_bucket", **s3lake)

    wait_until(lambda: failed_uploads() >= 1, 30, "the failed upload on /metrics")
    samples, _ = scrape(agent)
    assert value(samples, "evagg_sink_files_written_total", **s3lake) == 0
    assert value(samples, "evagg_sink_s3_puts_total", **s3lake) == 0
    assert ("evagg_sink_s3_retries_total", frozenset(s3lake.items())) in samples
    assert value(samples, "evagg_sink_permanent_error", sink="s3lake") == 1
    assert value(samples, "evagg_sink_lag_events", sink="s3lake") >= 10
    agent.kill()  # a drain would wait out its deadline: the bucket never comes


def test_every_sink_has_a_last_delivery_from_its_start_and_keeps_it_through_a_reload(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """An alert on `time() - evagg_sink_last_delivery_timestamp_seconds` must see a sink
    that never delivers (wrong credentials from day one), and a reload must not reset
    what it watches."""
    import signal
    import time

    from tests.ports import free_port

    before = time.time()
    nowhere = f"http://127.0.0.1:{free_port()}/ingest"
    agent = agent_factory(sinks_toml=(
        '[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\nroll_interval = "1s"\n'
        + http_sink("collector", nowhere))).start()
    series = 'evagg_sink_last_delivery_timestamp_seconds{{sink="{}"}}'
    never = agent.metric(series.format("collector"))
    assert before <= never <= time.time()  # when it was started
    wait_until(lambda: agent.metric(series.format("lake")) > never, 30,
               lambda: agent.metrics())
    delivered = agent.metric(series.format("lake"))
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reloaded: sinks" in agent.log(), 30, agent.log)
    assert agent.metric(series.format("collector")) == never  # not reset by the reload
    assert agent.metric(series.format("lake")) >= delivered
