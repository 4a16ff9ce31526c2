"""`evagg export-traces` as a user runs it: the default data place, ages for --since, and
a trace id that is unknown or not an id said as such, with no file written."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A lake with one trace of two spans sent by the OTel SDK's OTLP exporter, and its id."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    agent = AgentProcess(tmp_path_factory.mktemp("export")).start()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "learner"}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{agent.http_url}/v1/traces")))
        tracer = provider.get_tracer("rl")
        with tracer.start_as_current_span("epoch") as span, tracer.start_as_current_span(
                "step", attributes={"batch": 8}):
            trace_id = f"{span.get_span_context().trace_id:032x}"
        provider.shutdown()
        agent.wait_rows("SELECT 1 FROM events WHERE kind = 'span'", 2)
    finally:
        agent.stop()
    yield agent.lake_dir, trace_id


def spans_of(path: Path) -> list[dict[str, Any]]:
    document = orjson.loads(path.read_bytes())
    return [span for rs in document["resourceSpans"] for ss in rs["scopeSpans"]
            for span in ss["spans"]]


def test_an_age_and_the_default_data_place_export_the_trace(
        lake: tuple[Path, str], tmp_path: Path) -> None:
    lake_dir, trace_id = lake
    out = tmp_path / "recent.json"
    done = evagg("export-traces", "--since", "30m", "--out", str(out),
                 env={"EVAGG_DATA": str(lake_dir)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 2 spans to {out}"
    spans = {span["name"]: span for span in spans_of(out)}
    assert sorted(spans) == ["epoch", "step"] and spans["step"]["traceId"] == trace_id
    for span in spans.values():  # both times whole microseconds, as docs/opentelemetry.md says
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
        assert start % 1000 == 0 and end % 1000 == 0 and end >= start
    attributes = {a["key"]: a["value"] for a in spans["step"]["attributes"]}
    assert attributes["batch"] == {"stringValue": "8"}  # stored as text: documented


def test_an_unknown_trace_id_is_exit_1_and_writes_nothing(
        lake: tuple[Path, str], tmp_path: Path) -> None:
    lake_dir, trace_id = lake
    unknown = ("0" if trace_id[0] != "0" else "1") + trace_id[1:]
    out = tmp_path / "trace.json"
    done = evagg("export-traces", "--data", str(lake_dir), "--trace-id", unknown,
                 "--out", str(out))
    assert done.returncode == 1
    assert f"no span of trace {unknown} under {lake_dir}, so nothing was written" in done.stderr
    assert not out.exists()
    found = evagg("export-traces", "--data", str(lake_dir), "--trace-id", trace_id.upper(),
                  "--out", str(out))
    assert found.returncode == 0 and "wrote 2 spans" in found.stdout, found.stderr


def test_a_shipped_parquet_file_in_the_lake_is_not_read_as_spans(
        lake: tuple[Path, str], tmp_path: Path) -> None:
    """A profile shipped from a [[files]] directory that is itself Parquet lies under
    `_artifacts/` (docs/parquet-layout.md): the export reads the event files alone. It
    stopped with "Hive partition mismatch ... key "v" not found" before."""
    import duckdb

    lake_dir, trace_id = lake
    copy = tmp_path / "lake"
    shutil.copytree(lake_dir, copy)
    shipped = copy / "_artifacts" / "node=gpu-1" / "profile.parquet" / "v=0001"
    shipped.mkdir(parents=True)
    duckdb.connect().execute(f"COPY (SELECT 'matmul' AS op, 12.5 AS self_cuda_us) "
                             f"TO '{shipped / 'profile.parquet'}' (FORMAT parquet)")
    out = tmp_path / "trace.json"
    done = evagg("export-traces", "--data", str(copy), "--trace-id", trace_id,
                 "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 2 spans to {out}"
    assert sorted(span["name"] for span in spans_of(out)) == ["epoch", "step"]


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--trace-id", "not-a-trace", "'not-a-trace' is not a trace id: one is 32 hex digits"),
    ("--trace-id", "0" * 32, "not all zero"),
    ("--since", "yesterday", "cannot read time 'yesterday'"),
])
def test_a_value_that_is_not_an_id_or_a_time_is_a_usage_error(
        tmp_path: Path, flag: str, value: str, words: str) -> None:
    out = tmp_path / "x.json"
    done = evagg("export-traces", "--data", str(tmp_path), flag, value, "--out", str(out))
    assert done.returncode == 2
    assert words in done.stderr and "usage: evagg export-traces" in done.stderr
    assert not out.exists()
