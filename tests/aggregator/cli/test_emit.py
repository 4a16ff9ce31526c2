"""`evagg emit` against a real agent: one rule for bad input, and what happened, in words.

Every door refuses the same events with the same words (docs/event-schema.md, "Bad
input"): `--field`, a `--file` line, `POST /v1/events` and the emitter library.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg

REFUSED_DURATION = "field 'duration_s' must be a number, got str"


def test_a_file_sends_its_good_lines_and_names_each_bad_one(agent: AgentProcess,
                                                            tmp_path: Path) -> None:
    events = tmp_path / "events.ndjson"
    events.write_text('{"kind": "task", "name": "good-1", "duration_s": 0.5}\n'
                      '{"kind": "task", "name": "bad", "duration_s": "abc"}\n'
                      '\n'
                      '{"name": "no kind"}\n'
                      '{"kind": "op", "name": "bad-step", "step": "x"}\n'
                      'not json\n'
                      '{"kind": "task", "name": "good-2"}\n')
    result = evagg("emit", "--socket", str(agent.socket_path), "--file", str(events))
    assert result.returncode == 2, result.stderr
    assert f"line 2: {REFUSED_DURATION}" in result.stderr
    assert "line 4: field 'kind' is required" in result.stderr
    assert "line 5: field 'step' must be an integer, got str" in result.stderr
    assert "line 6: invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() == "sent 2 events, 4 refused (named above)"
    agent.stop()
    rows = agent.query("SELECT name, duration_s FROM events WHERE kind IN ('task', 'op') "
                       "ORDER BY name")
    assert rows == [("good-1", 0.5), ("good-2", None)]


def test_a_refused_field_reads_the_same_at_every_door(agent: AgentProcess,
                                                      tmp_path: Path) -> None:
    flag = evagg("emit", "--socket", str(agent.socket_path), "--name", "x",
                 "--field", "duration_s=abc")
    assert flag.returncode == 2
    assert flag.stderr.strip() == f"evagg emit: --field duration_s=abc: {REFUSED_DURATION}"
    line = tmp_path / "one.ndjson"
    line.write_text('{"kind": "task", "duration_s": "abc"}\n')
    from_file = evagg("emit", "--socket", str(agent.socket_path), "--file", str(line))
    assert from_file.returncode == 2
    assert f"line 1: {REFUSED_DURATION}" in from_file.stderr
    assert "nothing sent: every event was refused" in from_file.stderr
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=line.read_bytes(),
                                     method="POST")
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("the agent stored an event with duration_s text")
    except urllib.error.HTTPError as answer:
        assert answer.code == 400
        assert orjson.loads(answer.read())["errors"] == [f"event 0: {REFUSED_DURATION}"]


def test_an_event_too_large_is_named_with_its_limit_while_the_agent_runs(
        agent: AgentProcess, tmp_path: Path) -> None:
    big = tmp_path / "big.ndjson"
    big.write_text('{"kind": "task", "name": "%s"}\n{"kind": "task", "name": "small"}\n'
                   % ("x" * 5000))
    result = evagg("emit", "--socket", str(agent.socket_path), "--file", str(big),
                   "--max-frame-bytes", "4096")
    assert result.returncode == 2, result.stderr
    assert "1 event too large to send: each must fit in one frame of 4,096 bytes" in result.stderr
    assert "--max-frame-bytes" in result.stderr and "max_frame" in result.stderr
    assert "is it running" not in result.stderr and "did not acknowledge" not in result.stderr
    assert result.stdout.strip() == "sent 1 events"
    bigger = evagg("emit", "--socket", str(agent.socket_path), "--file", str(big))
    assert bigger.returncode == 0 and bigger.stdout.strip() == "sent 2 events"


def test_emit_help_lists_its_exit_codes() -> None:
    result = evagg("emit", "--help")
    assert result.returncode == 0
    assert "exit codes:" in result.stdout
    for code in ("0  every event was stored", "1  no agent", "2  bad input"):
        assert code in result.stdout


def test_a_frame_the_agent_refuses_is_reported_with_the_agents_reason(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    agent = agent_factory(agent_toml='max_frame = "64KiB"').start()
    big = tmp_path / "big.ndjson"
    big.write_text('{"kind": "task", "name": "%s"}\n' % ("x" * 100_000))
    result = evagg("emit", "--socket", str(agent.socket_path), "--file", str(big))
    assert result.returncode == 2, result.stderr
    refused = [line for line in result.stderr.splitlines() if "the agent refused 1 event:" in line]
    assert refused and "65536" in refused[0], result.stderr  # the agent's limit, in its words
    assert "is it running" not in result.stderr


def test_an_empty_file_says_it_holds_no_events(tmp_path: Path) -> None:
    empty = tmp_path / "empty.ndjson"
    empty.write_text("\n  \n")
    done = evagg("emit", "--socket", str(tmp_path / "none.sock"), "--file", str(empty))
    assert done.returncode == 2
    assert f"nothing sent: {empty} holds no events" in done.stderr
    piped = evagg("emit", "--socket", str(tmp_path / "none.sock"), "--file", "-", stdin="")
    assert piped.returncode == 2 and "standard input holds no events" in piped.stderr


SECONDS = 1_765_000_000  # 2025-12-06 as seconds: a producer's likeliest slip
REFUSED_SECONDS = (f"field 'time' must be nanoseconds since 1970 (or an RFC 3339 string), "
                   f"got {SECONDS}, which looks like seconds: as nanoseconds, {SECONDS * 10**9}")


def test_a_time_in_seconds_is_refused_at_every_door_with_the_unit_it_looks_like(
        agent: AgentProcess, tmp_path: Path) -> None:
    from emitters import Emitter

    flag = evagg("emit", "--socket", str(agent.socket_path), "--name", "x",
                 "--field", f"time={SECONDS}")
    assert flag.returncode == 2
    assert flag.stderr.strip() == f"evagg emit: --field time={SECONDS}: {REFUSED_SECONDS}"
    lines = tmp_path / "two.ndjson"
    lines.write_text(f'{{"kind": "task", "name": "slip", "time": {SECONDS}}}\n'
                     f'{{"kind": "task", "name": "good", "time": {SECONDS * 10**9}}}\n')
    from_file = evagg("emit", "--socket", str(agent.socket_path), "--file", str(lines))
    assert from_file.returncode == 2 and f"line 1: {REFUSED_SECONDS}" in from_file.stderr
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=lines.read_bytes(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert orjson.loads(answer.read())["errors"] == [f"event 0: {REFUSED_SECONDS}"]
    library = Emitter(socket=agent.socket_path)
    try:
        library.emit(kind="task", name="slip", time=SECONDS)
        library.emit(kind="task", name="good", time=SECONDS * 10**9)
        assert not library.flush(30)  # False: an event was refused
        stats = library.stats()
        # refused alone in its frame or beside the good one: the agent's words either way
        assert stats.acked == 1 and stats.refused == {REFUSED_SECONDS: 1}
    finally:
        library.close(5.0)
    agent.stop()
    assert agent.query("SELECT name, count(*), min(epoch(time)) FROM events "
                       "WHERE kind = 'task' GROUP BY name") == [("good", 3, SECONDS)]


def test_a_negative_duration_is_refused_at_every_door(agent: AgentProcess) -> None:
    """A negative duration_s is a producer's bug; stored, it pulled every quantile down."""
    from emitters import Emitter

    refused = "field 'duration_s' must not be negative, got -5"
    flag = evagg("emit", "--socket", str(agent.socket_path), "--name", "x",
                 "--field", "duration_s=-5")
    assert flag.returncode == 2 and refused in flag.stderr, flag.stderr
    body = b'{"kind": "task", "name": "back", "duration_s": -5}\n{"kind": "task", "name": "ok"}\n'
    request = urllib.request.Request(f"{agent.http_url}/v1/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert orjson.loads(answer.read())["errors"] == [f"event 0: {refused}"]
    library = Emitter(socket=agent.socket_path)
    try:
        library.emit(kind="task", name="back", duration_s=-5.0)
        library.emit(kind="task", name="ok", duration_s=5.0)
        assert not library.flush(30)
        assert library.stats().refused == {f"{refused}.0": 1}
    finally:
        library.close(5.0)
    agent.stop()
    assert agent.query("SELECT name, count(*) FROM events WHERE kind = 'task' "
                       "GROUP BY name") == [("ok", 2)]
