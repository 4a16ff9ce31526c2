"""The alert rules in docs/metrics.md, run by `promtool test rules` (Debian's `prometheus`
package) over series a real agent's /metrics names: every rule fires on the trouble it
names, and none fires on a healthy agent.

The rules file is the doc's own YAML block, so the doc and this test cannot drift; a rule
added to the doc without a case here fails `test_every_documented_rule_has_a_case`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import emitters
from tests.agentproc import REPO, AgentProcess
from tests.waiting import wait_until

INSTANCE = {"instance": "node-1:4040", "job": "evagg"}
Labels = dict[str, str]


def documented_rules() -> str:
    section = (REPO / "docs" / "metrics.md").read_text().split("\n## Alerts\n", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    assert found, "docs/metrics.md: the Alerts section has no yaml block"
    return found.group(1)


def documented_alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(documented_rules())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def alert_names() -> list[str]:
    groups = yaml.safe_load(documented_rules())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def annotations(alert: str, labels: Labels) -> dict[str, str]:
    """The rule's annotations as Prometheus fills them in for an alert with `labels`."""
    rule = documented_alerts()[alert]
    return {key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""),
                        text) for key, text in rule.get("annotations", {}).items()}


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: apt-get install prometheus (the README's test command)"
    return found


# -- the series a real agent exports ------------------------------------------------------

def _post(agent: AgentProcess, path: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(f"{agent.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _bad_otlp_span() -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    scope.spans.add(name="zero-trace", trace_id=bytes(16), span_id=b"\x01" * 8,
                    start_time_unix_nano=time.time_ns(), end_time_unix_nano=time.time_ns())
    return bytes(request.SerializeToString())


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Labels]]]:
    """Metric name -> the label sets of its samples, from an agent that met what the rules
    watch: failed and slow ops of two names (one over red_max_names = 1), bad events on
    two routes, a bad body."""
    agent = AgentProcess(tmp_path_factory.mktemp("alerts"), agent_toml="red_max_names = 1")
    agent.start()
    try:
        emitter = emitters.Emitter(socket=str(agent.socket_path),
                                   attrs={"service.name": "learner"})
        for state, seconds in (("FINISHED", 0.2), ("FAILED", 45.0), ("FINISHED", 50.0)):
            emitter.emit(kind="op", name="rollout", state=state, duration_s=seconds)
        emitter.emit(kind="op", name="second-name", state="FINISHED", duration_s=1.0)
        assert emitter.flush(30)
        emitter.close()
        assert _post(agent, "/v1/events", b"not json\n", "application/x-ndjson") == 400
        assert _post(agent, "/v1/events", b"", "application/x-ndjson") == 400
        assert _post(agent, "/v1/traces", _bad_otlp_span(), "application/x-protobuf") == 200
        wait_until(lambda: agent.metric("evagg_events_total") >= 4, 30, "the ops' RED counts")
        text = agent.metrics()
    finally:
        agent.stop()
    out: dict[str, list[Labels]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    yield out


def one(scraped: dict[str, list[Labels]], metric: str, /, **wanted: str) -> Labels:
    """The labels of the agent's sample of `metric` that carries `wanted`."""
    found = [labels for labels in scraped.get(metric, []) if wanted.items() <= labels.items()]
    assert found, f"the agent exported no {metric} with {wanted}: {sorted(scraped)}"
    return found[0]


# -- promtool -----------------------------------------------------------------------------

@dataclass
class Case:
    alert: str
    series: list[tuple[str, Labels, str]]  # metric, labels (less instance/job), values
    eval_time: str
    fires_with: list[Labels]  # each firing alert's labels; [] for none


def _selector(name: str, labels: Labels) -> str:
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def run_promtool(tmp_path: Path, cases: list[Case]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(documented_rules())
    tests = [{
        "interval": "1m",
        "input_series": [{"series": _selector(name, {**INSTANCE, **labels}), "values": values}
                         for name, labels, values in case.series],
        "alert_rule_test": [{"eval_time": case.eval_time, "alertname": case.alert,
                             "exp_alerts": [{"exp_labels": labels,
                                             "exp_annotations": annotations(case.alert, labels)}
                                            for labels in case.fires_with]}],
    } for case in cases]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"],
                                                        "tests": tests}))
    return subprocess.run([promtool(), "test", "rules", "tests.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def _plain(labels: Labels) -> Labels:
    return {**labels, **INSTANCE}


def firing_cases(scraped: dict[str, list[Labels]]) -> dict[str, Callable[[], Case]]:
    """For each documented alert: the agent's series in the trouble it names."""
    lake = one(scraped, "evagg_sink_lag_events", sink="lake")
    failed = one(scraped, "evagg_events_total", kind="op", name="rollout", state="FAILED")
    runs = one(scraped, "evagg_event_duration_seconds_count", kind="op", name="rollout")
    op = {"kind": "op", "name": "rollout", "service": "learner"}
    buckets = [labels for labels in scraped["evagg_event_duration_seconds_bucket"]
               if labels.items() >= op.items()]
    capped = one(scraped, "evagg_red_capped_events_total", label="name")
    rejected = [labels for labels in scraped["evagg_rejected_events_total"]]
    assert {r["route"] for r in rejected} >= {"http", "otlp"}, rejected
    bad_input = one(scraped, "evagg_bad_input_total", reason="empty_body")
    # The loss counters have a sample of each reason from the start, at 0 (so that a
    # one-off loss is an increase the rules see); the rest only once trouble happens:
    # labels as documented.
    dropped = one(scraped, "evagg_dropped_events_total", reason="drop_oldest")
    producers = one(scraped, "evagg_producer_dropped_events_total", reason="buffer_full")
    worker = {"worker": "http", "type": "RuntimeError"}
    ray_log = {"reason": "ray_log_missing"}
    publish = {"sink": "lake", "type": "parquet", "reason": "s3_access_denied"}
    disk_full = {"reason": "ENOSPC"}  # present only while appends fail: labels as documented
    # an HTTP sink's counts (the agent scraped here has none): labels as documented
    dead_letters = {"sink": "collector", "type": "http"}
    http = dead_letters  # an HTTP sink's counts and values all carry these
    unmerged = one(scraped, "evagg_sink_partitions_not_merged", sink="lake")

    def slow_buckets() -> list[tuple[str, Labels, str]]:
        # Every op in (30, 60] s: the p95 lands between those bounds, over 30.
        return [("evagg_event_duration_seconds_bucket", b,
                 "0x30" if b["le"] not in ("+Inf",) and float(b["le"]) < 60 else "0+10x30")
                for b in buckets]

    return {
        "EvaggDown": lambda: Case("EvaggDown", [("up", {}, "0x10")], "5m",
                                  [dict(INSTANCE)]),
        "EvaggSinkLagGrowing": lambda: Case(
            "EvaggSinkLagGrowing", [("evagg_sink_lag_events", lake, "0+1000x40")], "35m",
            [_plain(lake)]),
        "EvaggSinkNotDelivering": lambda: Case(
            "EvaggSinkNotDelivering",  # a quiet node: 3 events waiting, none delivered
            [("evagg_sink_last_delivery_timestamp_seconds", lake, "60x40"),
             ("evagg_sink_lag_events", lake, "3x40")], "30m", [_plain(lake)]),
        "EvaggSpoolNearlyFull": lambda: Case(
            "EvaggSpoolNearlyFull", [("evagg_spool_bytes", one(scraped, "evagg_spool_bytes"),
                                      "900x10"),
                                     ("evagg_spool_max_bytes",
                                      one(scraped, "evagg_spool_max_bytes"), "1000x10")],
            "10m", [dict(INSTANCE)]),
        "EvaggSpoolCannotWrite": lambda: Case(
            "EvaggSpoolCannotWrite",
            [("evagg_spool_write_failing_since_timestamp_seconds", disk_full,
              "_x2 1796656638x10")], "8m", [_plain(disk_full)]),
        "EvaggReloadRefused": lambda: Case(
            "EvaggReloadRefused",  # present only after a refused reload
            [("evagg_config_reload_refused_timestamp_seconds", {}, "_x2 1796656638x10")],
            "9m", [dict(INSTANCE)]),
        "EvaggSinkRequestsMostlyFail": lambda: Case(
            "EvaggSinkRequestsMostlyFail",  # 2 of 3 requests fail, the third delivers 500
            [("evagg_sink_requests_5xx_total", http, "0+20x40"),
             ("evagg_sink_requests_failed_total", http, "0+20x40"),
             ("evagg_sink_requests_2xx_total", http, "0+20x40"),
             ("evagg_sink_requests_4xx_total", http, "0x40"),
             ("evagg_delivered_events_total", {"sink": "collector"}, "0+500x40")], "30m",
            [{"instance": INSTANCE["instance"], "sink": "collector"}]),
        "EvaggSinkRequestsMostlyFail, down": lambda: Case(
            "EvaggSinkRequestsMostlyFail",  # every request fails: EvaggSinkNotDelivering's
            [("evagg_sink_requests_failed_total", http, "0+20x40"),
             ("evagg_sink_requests_5xx_total", http, "0x40"),
             ("evagg_sink_requests_2xx_total", http, "5x40"),
             ("evagg_sink_requests_4xx_total", http, "0x40"),
             ("evagg_delivered_events_total", {"sink": "collector"}, "500x40")], "30m", []),
        "EvaggSinkRequestsMostlyFail, a few failures": lambda: Case(
            "EvaggSinkRequestsMostlyFail",  # one request in ten fails: retried, no page
            [("evagg_sink_requests_5xx_total", http, "0+2x40"),
             ("evagg_sink_requests_failed_total", http, "0x40"),
             ("evagg_sink_requests_2xx_total", http, "0+18x40"),
             ("evagg_sink_requests_4xx_total", http, "0x40"),
             ("evagg_delivered_events_total", {"sink": "collector"}, "0+500x40")], "30m",
            []),
        "EvaggSinkPermanentError": lambda: Case(
            "EvaggSinkPermanentError",
            [("evagg_sink_permanent_error", one(scraped, "evagg_sink_permanent_error",
                                                sink="lake"), "0 1x10")], "10m",
            [_plain({"sink": "lake"})]),
        "EvaggParquetPublishFailing": lambda: Case(
            "EvaggParquetPublishFailing",
            [("evagg_sink_publish_failures_total", publish, "0+1x30")], "20m",
            [_plain(publish)]),
        "EvaggHourMergeFailing": lambda: Case(
            "EvaggHourMergeFailing",  # one hour not merged for over two hours
            [("evagg_sink_partitions_not_merged", unmerged, "0 1x200")], "150m",
            [_plain(unmerged)]),
        "EvaggDroppingEvents": lambda: Case(
            "EvaggDroppingEvents", [("evagg_dropped_events_total", dropped, "0+10x10")], "5m",
            [_plain(dropped)]),
        "EvaggDroppingEvents, one burst between two scrapes": lambda: Case(
            "EvaggDroppingEvents", [("evagg_dropped_events_total", dropped, "0x20 17825x40")],
            "23m", [_plain(dropped)]),
        "EvaggDroppingEvents, a reason's first loss": lambda: Case(
            "EvaggDroppingEvents", [("evagg_dropped_events_total", ray_log, "_x20 1x40")],
            "23m", [_plain(ray_log)]),
        "EvaggProducersDropping": lambda: Case(
            "EvaggProducersDropping",
            [("evagg_producer_dropped_events_total", producers, "0+10x10")], "5m",
            [_plain(producers)]),
        "EvaggProducersDropping, one burst between two scrapes": lambda: Case(
            "EvaggProducersDropping",
            [("evagg_producer_dropped_events_total", producers, "0x20 36375x40")], "23m",
            [_plain(producers)]),
        "EvaggBadInput": lambda: Case(
            "EvaggBadInput",  # only bad bodies grow; the rejected events stay as they were
            [("evagg_bad_input_total", bad_input, "0+120x30"),
             *[("evagg_rejected_events_total", r, "1x30") for r in rejected]], "20m",
            [{"instance": INSTANCE["instance"]}]),
        "EvaggBadInput, two routes": lambda: Case(
            "EvaggBadInput",  # rejected events on both routes grow, no bad bodies
            [("evagg_rejected_events_total", r, "0+60x30") for r in rejected], "20m",
            [{"instance": INSTANCE["instance"]}]),
        "EvaggDeadLetters": lambda: Case(
            "EvaggDeadLetters",  # an endpoint refuses every batch with a 400
            [("evagg_sink_dead_letters_waiting_events", dead_letters, "0 0+500x10")], "6m",
            [_plain(dead_letters)]),
        "EvaggDeadLetters, replayed": lambda: Case(
            "EvaggDeadLetters",  # `evagg dlq replay` sent them: the gauge is back at 0
            [("evagg_sink_dead_letters_waiting_events", dead_letters, "0 500x5 0x10")], "12m",
            []),
        "EvaggBadInput, quiet on a full disk": lambda: Case(
            "EvaggBadInput",  # frames refused as the spool's disk is full: no producer's fault
            [("evagg_bad_input_total", {"route": "socket", "reason": "spool_write_failed"},
              "0+600x30")], "20m", []),
        "EvaggWorkerErrors": lambda: Case(
            "EvaggWorkerErrors", [("evagg_worker_errors_total", worker, "0 0 1x10")], "5m",
            [_plain(worker)]),
        "EvaggWorkerErrors, a worker's first error": lambda: Case(
            "EvaggWorkerErrors", [("evagg_worker_errors_total", worker, "_x5 3x10")], "7m",
            [_plain(worker)]),
        "EvaggTaskFailureRatio": lambda: Case(
            "EvaggTaskFailureRatio",
            [("evagg_events_total", failed, "0+30x30"),
             ("evagg_event_duration_seconds_count", runs, "0+60x30")], "20m", [op]),
        "EvaggSlowOps": lambda: Case("EvaggSlowOps", slow_buckets(), "20m", [op]),
        "EvaggLabelCapHit": lambda: Case(
            "EvaggLabelCapHit", [("evagg_red_capped_events_total", capped, "0+5x40")], "40m",
            [_plain(capped)]),
    }


def test_every_documented_rule_has_a_case(scraped: dict[str, list[Labels]]) -> None:
    documented = alert_names()
    assert len(documented) == len(set(documented)) >= 12
    cases = {name.split(",")[0] for name in firing_cases(scraped)}
    assert cases == set(documented)


def test_each_rule_fires_on_the_trouble_it_names(
        scraped: dict[str, list[Labels]], tmp_path: Path) -> None:
    cases = [make() for make in firing_cases(scraped).values()]
    done = run_promtool(tmp_path, cases)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_no_rule_fires_on_a_healthy_agent(
        scraped: dict[str, list[Labels]], tmp_path: Path) -> None:
    # Every series the agent exported, steady at its value; the agent is up.
    steady: list[tuple[str, Labels, str]] = [("up", {}, "1x40")]
    for name, label_sets in scraped.items():
        steady += [(name, labels, "7x40") for labels in label_sets
                   if not name.startswith(("evagg_sink_permanent_error", "evagg_spool_",
                                           "evagg_sink_last_delivery_"))]
    # a healthy sink delivers as time goes: its last delivery keeps up with the clock
    steady += [("evagg_sink_last_delivery_timestamp_seconds", labels, "0+60x40")
               for labels in scraped["evagg_sink_last_delivery_timestamp_seconds"]]
    steady += [("evagg_sink_permanent_error", one(scraped, "evagg_sink_permanent_error"),
                "0x40"), ("evagg_spool_bytes", {}, "10x40"),
               ("evagg_spool_max_bytes", {}, "1000x40"),
               # an HTTP sink that never dead-lettered anything (the agent here has none)
               ("evagg_sink_dead_letters_waiting_events", {"sink": "collector", "type": "http"},
                "0x40"),
               # and whose requests are answered, a timeout now and then
               ("evagg_sink_requests_2xx_total", {"sink": "collector", "type": "http"},
                "0+60x40"),
               ("evagg_sink_requests_failed_total", {"sink": "collector", "type": "http"},
                "0+1x40"),
               ("evagg_sink_requests_5xx_total", {"sink": "collector", "type": "http"},
                "0x40"),
               ("evagg_sink_requests_4xx_total", {"sink": "collector", "type": "http"},
                "0x40"),
               ("evagg_delivered_events_total", {"sink": "collector"}, "0+3000x40")]
    cases = [Case(alert, steady, "40m", []) for alert in alert_names()]
    done = run_promtool(tmp_path, cases)
    assert done.returncode == 0, done.stdout + done.stderr


def test_gauges_a_dashboard_reads_have_a_sample_on_a_fresh_agent(
        agent: AgentProcess) -> None:
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(agent.metrics()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    assert samples["evagg_draining"] == [({}, 0.0)]
    assert samples["evagg_sink_permanent_error"] == [({"sink": "lake"}, 0.0)]
    # each loss reason from the start, at 0: a first loss is an increase the rules see
    assert ({"reason": "drop_oldest"}, 0.0) in samples["evagg_dropped_events_total"]
    assert ({"reason": "buffer_full"}, 0.0) in samples["evagg_producer_dropped_events_total"]


def test_the_producers_dropping_summary_fits_every_reason() -> None:
    # reason is buffer_full, nacked (bad events), too_large, unencodable or exit_deadline:
    # an on-call reading "buffers full" for a nack looks at the agent, not the producer
    for reason in ("nacked", "too_large", "unencodable", "exit_deadline"):
        summary = annotations("EvaggProducersDropping", {"reason": reason})["summary"]
        assert reason in summary and "buffers full" not in summary, summary
