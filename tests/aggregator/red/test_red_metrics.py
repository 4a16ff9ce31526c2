"""RED metrics derived from events: exact counts and buckets, capped and escaped labels,
the whole /metrics of a real agent parsed by prometheus_client, and the Grafana dashboard
naming only metrics that agent exports."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import emitters
from aggregator.config import ConfigError, load_config
from aggregator.decode.normalize import Stamp, rows_to_batch
from aggregator.red.metrics import DEFAULT_BUCKETS, MAX_LABEL_CHARS, RedMetrics
from tests.agentproc import REPO, AgentProcess

DASHBOARD = REPO / "deploy" / "grafana" / "evagg-dashboard.json"
STAMP = Stamp(1_700_000_000_000_000_000, 1, 1, "node", "host")


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return rows_to_batch(rows, STAMP).batch


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text, through prometheus_client's own parser."""
    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, metric: str, /, **labels: str) -> float:
    found = [v for n, lab, v in samples(text) if n == metric and lab == labels]
    assert len(found) == 1, (metric, labels, found)
    return found[0]


def total(text: str, metric: str, /, **labels: str) -> float:
    """The sum over every sample of `metric` that carries these labels (and maybe more)."""
    return sum(v for n, lab, v in samples(text)
               if n == metric and labels.items() <= lab.items())


# -- the derivation itself ------------------------------------------------------------------

def test_histogram_buckets_sum_and_count_match_the_observations() -> None:
    durations = [0.0, 0.001, 0.0011, 0.2, 5.0, 5.0001, 3599.0, 4000.0, 20000.0]
    rows = [{"kind": "op", "name": "fwd", "state": "FINISHED", "duration_s": d}
            for d in durations]
    rows += [{"kind": "op", "name": "fwd", "state": "RUNNING", "duration_s": 9.0},  # progress
             {"kind": "op", "name": "fwd", "state": "STARTED"},
             {"kind": "op", "name": "fwd", "state": "FINISHED"},  # no duration
             {"kind": "op", "name": "fwd", "state": "FAILED", "duration_s": 0.3}]
    red = RedMetrics()
    red.observe(batch(rows))
    text = red.render()
    observed = [*durations, 0.3]
    for bound in [*DEFAULT_BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else repr(bound)
        expected = sum(1 for d in observed if d <= bound)
        got = value(text, "evagg_event_duration_seconds_bucket", kind="op", name="fwd", le=le)
        assert got == expected, le
    assert value(text, "evagg_event_duration_seconds_count", kind="op", name="fwd") == 10
    assert value(text, "evagg_event_duration_seconds_sum", kind="op", name="fwd") \
        == pytest.approx(sum(observed))
    assert value(text, "evagg_events_total", kind="op", name="fwd", state="FINISHED") == 10
    assert value(text, "evagg_events_total", kind="op", name="fwd", state="RUNNING") == 1
    assert value(text, "evagg_events_total", kind="op", name="fwd", state="STARTED") == 1


def test_errors_by_type_and_unknown_for_a_failure_without_one() -> None:
    red = RedMetrics()
    red.observe(batch([
        {"kind": "task", "name": "load", "state": "FAILED", "error_type": "ValueError"},
        {"kind": "task", "name": "load", "state": "FAILED", "error_type": "ValueError"},
        {"kind": "task", "name": "load", "state": "FAILED"},
        {"kind": "op", "name": "rpc", "state": "FINISHED", "error_type": "Timeout"},
        {"kind": "task", "name": "load", "state": "FINISHED"},
        # a span fails by its status alone: this one handled the exception it recorded
        {"kind": "span", "name": "rpc", "state": "FINISHED", "error_type": "Timeout"},
    ]))
    text = red.render()
    assert value(text, "evagg_event_errors_total", kind="task", name="load",
                 error_type="ValueError") == 2
    assert value(text, "evagg_event_errors_total", kind="task", name="load",
                 error_type="unknown") == 1
    assert value(text, "evagg_event_errors_total", kind="op", name="rpc",
                 error_type="Timeout") == 1
    assert sum(v for n, _, v in samples(text) if n == "evagg_event_errors_total") == 4


def test_a_span_counts_once_however_often_it_arrives_and_other_kinds_always() -> None:
    red = RedMetrics()
    span = {"kind": "span", "name": "rl_iteration", "state": "FINISHED", "duration_s": 0.5,
            "attrs": {"service.name": "learner"}}
    failed = {**span, "name": "validate", "state": "FAILED", "error_type": "RayTaskError"}
    ops = [{"kind": "op", "name": "step", "state": "FINISHED", "event_id": "same-id"}] * 2
    first = [{**span, "event_id": f"s{i}"} for i in range(3)] + [{**failed, "event_id": "f"}]
    red.observe(batch([*first, first[0], *ops]))  # a copy within the batch
    red.observe(batch(first))  # the other exporter's copies, later
    text = red.render()
    service = {"service": "learner"}
    assert value(text, "evagg_events_total", kind="span", name="rl_iteration",
                 state="FINISHED", **service) == 3
    assert value(text, "evagg_events_total", kind="span", name="validate", state="FAILED",
                 **service) == 1
    assert value(text, "evagg_event_errors_total", kind="span", name="validate",
                 error_type="RayTaskError", **service) == 1
    assert value(text, "evagg_event_duration_seconds_count", kind="span", name="rl_iteration",
                 **service) == 3
    assert value(text, "evagg_events_total", kind="op", name="step", state="FINISHED") == 2


def test_label_values_are_escaped_and_read_back_exactly() -> None:
    names = ['quote"d', "back\\slash", "new\nline", "ünïcode ✓", "", "{braces}=,"]
    red = RedMetrics()
    red.observe(batch([{"kind": "op", "name": n, "state": "FINISHED", "duration_s": 0.5}
                       for n in names]))
    text = red.render()
    seen = {lab["name"] for n, lab, _ in samples(text) if n == "evagg_events_total"}
    assert seen == set(names)
    buckets = {lab["name"] for n, lab, _ in samples(text)
               if n == "evagg_event_duration_seconds_bucket"}
    assert buckets == set(names)


def test_names_per_kind_are_capped_and_the_rest_count_as_other() -> None:
    red = RedMetrics(max_names=3, max_error_types=2, max_kinds=2)
    red.observe(batch([{"kind": "op", "name": f"n{i}", "state": "FINISHED", "duration_s": 1.0}
                       for i in range(10)]))
    red.observe(batch([{"kind": "op", "name": f"n{i}", "state": "FAILED", "error_type": f"E{i}"}
                       for i in range(5)]))
    red.observe(batch([{"kind": k, "name": "x", "state": "FINISHED"} for k in "abc"]))
    text = red.render()
    op_names = {lab["name"] for n, lab, _ in samples(text)
                if n == "evagg_events_total" and lab["kind"] == "op"}
    assert op_names == {"n0", "n1", "n2", "other"}
    assert value(text, "evagg_events_total", kind="op", name="other", state="FINISHED") == 7
    assert value(text, "evagg_event_duration_seconds_count", kind="op", name="other") == 7
    assert total(text, "evagg_event_errors_total", kind="op", error_type="other") == 3
    kinds = {lab["kind"] for n, lab, _ in samples(text) if n == "evagg_events_total"}
    assert kinds == {"op", "a", "other"}  # two kinds kept, then "other"
    assert sum(v for n, _, v in samples(text) if n == "evagg_events_total") == 18
    assert value(text, "evagg_red_capped_events_total", label="name") == 7 + 2
    assert value(text, "evagg_red_capped_events_total", label="kind") == 2


def test_a_label_value_longer_than_the_limit_counts_as_other() -> None:
    """A name is producer text: 50 names of 100 KB made /metrics 19x its input."""
    red = RedMetrics()
    long_names = [f"{i}" + "x" * 100_000 for i in range(50)]
    red.observe(batch([{"kind": "op", "name": n, "state": "FINISHED", "duration_s": 1.0,
                        "error_type": n} for n in long_names]))
    red.observe(batch([{"kind": "op", "name": "x" * MAX_LABEL_CHARS, "state": "FINISHED"}]))
    text = red.render()
    assert len(text) < 100_000
    names = {lab["name"] for n, lab, _ in samples(text) if n == "evagg_events_total"}
    assert names == {"other", "x" * MAX_LABEL_CHARS}  # the limit itself is kept
    assert value(text, "evagg_events_total", kind="op", name="other", state="FINISHED") == 50
    assert value(text, "evagg_red_capped_events_total", label="name") == 50
    assert value(text, "evagg_red_capped_events_total", label="error_type") == 50


def test_values_that_share_a_label_are_one_series() -> None:
    """A producer's own "other", the cap's "other", a null name and "" never repeat a series."""
    red = RedMetrics(max_names=2)
    red.observe(batch([{"kind": "op", "name": n, "state": "FINISHED", "duration_s": 1.0}
                       for n in ("other", "a", "b", "c")]))
    red.observe(batch([{"kind": "op", "state": "FAILED"},
                       {"kind": "op", "name": "", "state": "FAILED", "error_type": "unknown"},
                       {"kind": "op", "name": "z", "state": "FAILED"}]))
    text = red.render()
    series = [(n, tuple(sorted(lab.items()))) for n, lab, _ in samples(text)]
    assert len(series) == len(set(series))
    assert value(text, "evagg_events_total", kind="op", name="other", state="FINISHED") == 3
    assert value(text, "evagg_events_total", kind="op", name="other", state="FAILED") == 3
    assert value(text, "evagg_event_errors_total", kind="op", name="other",
                 error_type="unknown") == 3


def test_concurrent_observers_lose_nothing() -> None:
    red = RedMetrics()
    part = batch([{"kind": "op", "name": f"n{i % 7}", "state": "FINISHED",
                   "duration_s": i / 100} for i in range(500)])

    def work() -> None:
        for _ in range(40):
            red.observe(part)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = red.render()
    assert sum(v for n, _, v in samples(text) if n == "evagg_events_total") == 4 * 40 * 500
    assert sum(v for n, _, v in samples(text)
               if n == "evagg_event_duration_seconds_count") == 4 * 40 * 500


def test_a_batch_that_cannot_be_measured_is_counted_and_never_raises() -> None:
    red = RedMetrics()
    red.observe(pa.record_batch({"kind": pa.array(["op"]), "name": pa.array(["x"])}))
    odd_types = {"kind": ["op"], "name": ["x"], "state": ["FINISHED"], "duration_s": ["1s"],
                 "error_type": pa.nulls(1, pa.string()), "event_id": ["e1"],
                 "attrs": pa.nulls(1, pa.map_(pa.string(), pa.string()))}
    red.observe(pa.record_batch(odd_types))
    red.observe(batch([{"kind": "op", "name": "ok", "state": "FINISHED"}]))  # goes on
    text = red.render()
    assert value(text, "evagg_red_errors_total", type="KeyError") == 1  # no `state` column
    assert value(text, "evagg_red_errors_total", type="TypeError") == 1  # text durations
    assert value(text, "evagg_events_total", kind="op", name="ok", state="FINISHED") == 1


def test_small_batches_wait_for_a_flush_and_render_flushes_them() -> None:
    red = RedMetrics(flush_rows=10)
    small = batch([{"kind": "op", "name": "x", "state": "FINISHED", "duration_s": 0.2}] * 4)
    assert red.add_batch(small) is False
    assert red.add_batch(small) is False
    assert red.add_batch(small) is True  # 12 rows pending: the ingest path flushes now
    red.flush()
    assert red.add_batch(small) is False
    text = red.render()  # takes the last 4 rows too
    assert value(text, "evagg_events_total", kind="op", name="x", state="FINISHED") == 16
    assert value(text, "evagg_event_duration_seconds_bucket", kind="op", name="x",
                 le="0.5") == 16


def test_config_keys_and_their_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[agent]\nred_metrics = false\nred_max_names = 7\n")
    config = load_config(good, env={})
    assert (config.red_metrics, config.red_max_names) == (False, 7)
    assert load_config(None, env={}).red_metrics is True
    bad = tmp_path / "bad.toml"
    bad.write_text('[agent]\nred_metrics = "yes"\nred_max_names = 0\n')
    with pytest.raises(ConfigError) as caught:
        load_config(bad, env={})
    problems = " ".join(caught.value.problems)
    assert "agent.red_metrics" in problems and "agent.red_max_names" in problems


# -- through a real agent -------------------------------------------------------------------

OPS = {"forward": [0.002, 0.02, 0.2], "backward": [0.004, 0.04, 0.4, 4.0]}


@pytest.fixture(scope="module")
def loaded_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One agent with known op events from the socket and task events over HTTP."""
    agent = AgentProcess(tmp_path_factory.mktemp("red")).start()
    try:
        emitter = emitters.Emitter(socket=str(agent.socket_path))
        for name, durations in OPS.items():
            for d in durations:
                emitter.emit(kind="op", name=name, state="FINISHED", duration_s=d)
        emitter.emit(kind="op", name="forward", state="FAILED", duration_s=1.5,
                     error_type="RuntimeError")
        assert emitter.flush(30)
        emitter.close()
        body = b"\n".join(orjson.dumps({"kind": "task", "name": "load", "state": s,
                                        "duration_s": 0.7}) for s in ("FINISHED", "FAILED"))
        request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        yield agent
    finally:
        agent.stop()


def test_the_whole_metrics_output_parses_and_agrees_with_the_events(
        loaded_agent: AgentProcess) -> None:
    text = loaded_agent.metrics()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    series = [(n, tuple(sorted(lab.items()))) for n, lab, _ in samples(text)]
    assert len(series) == len(set(series)), "a series appears twice"
    assert families["evagg_event_duration_seconds"].type == "histogram"
    assert families["evagg_events"].type == "counter"
    assert "evagg_received_events" in families and "evagg_spool_bytes" in families
    for name, durations in OPS.items():
        observed = [*durations, 1.5] if name == "forward" else durations
        assert value(text, "evagg_events_total", kind="op", name=name,
                     state="FINISHED") == len(durations)
        assert value(text, "evagg_event_duration_seconds_count", kind="op",
                     name=name) == len(observed)
        for le, bound in (("0.005", 0.005), ("0.05", 0.05), ("0.5", 0.5), ("+Inf", 1e9)):
            assert value(text, "evagg_event_duration_seconds_bucket", kind="op", name=name,
                         le=le) == sum(1 for d in observed if d <= bound)
    assert value(text, "evagg_event_errors_total", kind="op", name="forward",
                 error_type="RuntimeError") == 1
    assert value(text, "evagg_events_total", kind="task", name="load", state="FAILED") == 1
    assert value(text, "evagg_event_errors_total", kind="task", name="load",
                 error_type="unknown") == 1
    assert value(text, "evagg_event_duration_seconds_count", kind="task", name="load") == 2


def test_a_producer_with_100k_distinct_names_leaves_at_most_the_cap(
        loaded_agent: AgentProcess) -> None:
    before = loaded_agent.metric('evagg_received_events_total{route="socket"}')
    emitter = emitters.Emitter(socket=str(loaded_agent.socket_path))
    for i in range(100_000):
        emitter.emit(kind="flood", name=f"name-{i}", state="FINISHED", duration_s=0.01)
        if i % 10_000 == 9_999:
            assert emitter.flush(60)  # the emitter's queue is bounded: let it drain
    emitter.close()
    deadline = time.monotonic() + 60
    while loaded_agent.metric('evagg_received_events_total{route="socket"}') < before + 100_000:
        assert time.monotonic() < deadline, "the agent did not receive the flood"
        time.sleep(0.2)
    text = loaded_agent.metrics()
    flood = [(lab, v) for n, lab, v in samples(text)
             if n == "evagg_events_total" and lab["kind"] == "flood"]
    names = {lab["name"] for lab, _ in flood}
    assert len(names) <= 200 + 1 and "other" in names
    assert sum(v for _, v in flood) == 100_000
    hist_names = {lab["name"] for n, lab, _ in samples(text)
                  if n == "evagg_event_duration_seconds_count" and lab["kind"] == "flood"}
    assert hist_names == names


def test_red_metrics_can_be_turned_off(tmp_path: Path) -> None:
    with AgentProcess(tmp_path, agent_toml="red_metrics = false") as agent:
        emitter = emitters.Emitter(socket=str(agent.socket_path))
        emitter.emit(kind="op", name="x", state="FINISHED", duration_s=1.0)
        assert emitter.flush(30)
        emitter.close()
        text = agent.metrics()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "evagg_received_events" in names and "evagg_events" not in names


# -- the Grafana dashboard ------------------------------------------------------------------

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "delta", "deriv",
    "histogram_quantile", "topk", "bottomk", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "bool", "offset", "clamp_min", "clamp_max", "abs",
    "label_values", "vector", "scalar", "time", "Inf", "NaN",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (in matchers or by/without lists), strings or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    names: set[str] = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function call
        if match.group() not in PROMQL_WORDS:
            names.add(match.group())
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.match(r"label_values\((.*),\s*\w+\)$", query["query"])
            assert found, query
            exprs.append(found.group(1))
    return exprs


def exported_names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names.update(family.name + s for s in suffixes.get(family.type, ()))
        names.update(s.name for s in family.samples)
    return names


def test_the_promql_reader_finds_metric_names() -> None:
    expr = ('histogram_quantile(0.95, sum by (kind, name, le) (rate(x_bucket{kind=~"$kind",'
            'name="a b"}[$__rate_interval]))) / on (kind) y_total')
    assert promql_metric_names(expr) == {"x_bucket", "y_total"}


def test_the_grafana_dashboard_names_only_metrics_the_agent_exports(
        loaded_agent: AgentProcess) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["targets"] and p["gridPos"]["w"] <= 24 for p in panels)
    for panel in panels:
        assert panel["datasource"]["type"] == "prometheus"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    used: set[str] = set()
    for expr in dashboard_expressions(dashboard):
        used |= promql_metric_names(expr)
    exported = exported_names(loaded_agent.metrics())
    assert used, "no metric names found in the dashboard"
    assert used <= exported, f"not exported by the agent: {sorted(used - exported)}"
    wanted = {"evagg_received_events_total", "evagg_spool_bytes", "evagg_sink_lag_events",
              "evagg_dropped_events_total", "evagg_event_duration_seconds_bucket",
              "evagg_event_errors_total", "evagg_events_total"}
    assert wanted <= used
