"""The same event through every door is stored the same: a null metric is named in
`nonfinite` and a null attribute left out, whether it came as NDJSON over HTTP, as a line
of `evagg emit --file`, or from the emitter library's COLUMNS frames."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import orjson

import emitters
from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg

FIELDS = {"kind": "task", "name": "nulls", "metrics": {"loss": None, "ok": 1},
          "attrs": {"c": None, "d": "x"}}


def test_nulls_are_stored_alike_through_every_door(agent: AgentProcess, tmp_path: Path) -> None:
    body = orjson.dumps({**FIELDS, "run_id": "door-http"}) + b"\n"
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=20) as answer:
        assert orjson.loads(answer.read())["accepted"] == 1
    lines = tmp_path / "events.ndjson"
    lines.write_bytes(orjson.dumps({**FIELDS, "run_id": "door-file"}) + b"\n")
    sent = evagg("emit", "--socket", str(agent.socket_path), "--file", str(lines))
    assert sent.returncode == 0, sent.stderr
    emitter = emitters.Emitter(socket=str(agent.socket_path))
    emitter.emit(**{**FIELDS, "run_id": "door-library"})
    assert emitter.flush(30)
    emitter.close()
    assert agent.stop() == 0
    rows = agent.query("SELECT run_id, metrics, nonfinite, attrs FROM events "
                       "WHERE name = 'nulls' ORDER BY run_id")
    assert [row[0] for row in rows] == ["door-file", "door-http", "door-library"]
    for run_id, metrics, nonfinite, attrs in rows:
        assert dict(metrics) == {"ok": 1.0} and list(nonfinite) == ["loss"], run_id
        assert dict(attrs) == {"d": "x"}, run_id


def test_a_nan_duration_from_the_library_is_refused_as_every_door_refuses_it(
        agent: AgentProcess) -> None:
    emitter = emitters.Emitter(socket=str(agent.socket_path))
    emitter.emit(kind="task", name="nan-duration", duration_s=float("nan"))
    emitter.emit(kind="task", name="beside-it", duration_s=0.5)
    emitter.flush(30)
    refused = dict(emitter.stats().refused)
    emitter.close()
    cli = evagg("emit", "--socket", str(agent.socket_path), "--name", "nan-cli", "--field",
                "duration_s=nan")
    assert cli.returncode == 2
    reason = "field 'duration_s' must be a number, got str"
    assert refused == {reason: 1} and reason in cli.stderr
    assert agent.stop() == 0
    assert agent.query("SELECT name FROM events WHERE name LIKE 'nan%' OR name = 'beside-it'"
                       ) == [("beside-it",)]
