"""`evagg query` through the real CLI (`python -m aggregator query ...`) and in process."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import evagg, in_process
from tests.dashboard.lakegen import Expected, at, event, local_put, write_rows

REPO = Path(__file__).resolve().parents[2]


def test_summary_table_json_and_csv(lake: Path, expected: type[Expected]) -> None:
    table = evagg("query", "--data", str(lake), "summary")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["dimension", "value", "tasks"]
    assert set(lines[1]) == {"-", " "}
    assert any(line.split()[:3] == ["name", "square", "10"] for line in lines)
    assert lines[-1] == f"({len(lines) - 3} rows)"
    as_json = json.loads(evagg("query", "summary", "--data", str(lake), "--json").stdout)
    total = next(r for r in as_json if r["dimension"] == "all")
    assert total["tasks"] == expected.tasks and total["failed"] == 4
    as_csv = list(csv.DictReader(io.StringIO(evagg("query", "--csv", "--data", str(lake),
                                                   "summary").stdout)))
    square = next(r for r in as_csv if r["value"] == "square")
    assert float(square["p90_s"]) == pytest.approx(9.1)


def test_tasks_filters(lake: Path) -> None:
    out = evagg("query", "--data", str(lake), "tasks", "--state", "failed",
                "--error-type", "ValueError", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sorted(r["task_id"] for r in rows) == ["boom1", "boom2"]
    by_job = json.loads(evagg("query", "--data", str(lake), "tasks", "--job", "job2",
                              "--name", "boom", "--node", "nodeA", "--json").stdout)
    assert len(by_job) == 3
    window = json.loads(evagg("query", "--data", str(lake), "tasks", "--since",
                              "2025-03-01T10:00:30Z", "--until", "2025-03-01T10:00:41",
                              "--sort", "time", "--asc", "--json").stdout)
    assert [r["task_id"] for r in window] == ["slow1", "sq03", "sq04", "wait1"]


@pytest.mark.parametrize("cache", [True, False], ids=["task-cache", "no-cache"])
def test_tasks_of_one_ray_cluster_by_session(tmp_path: Path, cache: bool) -> None:
    """Every Ray cluster numbers its jobs from 01000000: a lake of two clusters tells
    their tasks apart by the session `evagg query jobs` names, and the summary's job rows
    by job and session."""
    first, second = "session_2026-12-06_10-00-00_000001_1", "session_2026-12-06_11-00-00_000002_2"
    rows = [event(kind="task", source="ray", task_id=f"t{n}", attempt=0, job_id="01000000",
                  name="tiny", state="FINISHED", time=at(n), attrs={"ray_session": session})
            for n, session in enumerate([first, first, second])]
    write_rows(local_put(tmp_path), rows, "part-1.parquet")
    where = ["--data", str(tmp_path)] + ([] if cache else ["--no-cache"])
    both = json.loads(evagg("query", *where, "tasks", "--job", "01000000", "--json").stdout)
    assert len(both) == 3
    one = evagg("query", *where, "tasks", "--job", "01000000", "--session", second, "--json")
    assert one.returncode == 0, one.stderr
    assert [(r["task_id"], r["ray_session"]) for r in json.loads(one.stdout)] == [("t2", second)]
    # the summary counts each cluster's job apart, under the name its --job takes
    summary = json.loads(evagg("query", *where, "summary", "--json").stdout)
    jobs = {r["value"]: r["tasks"] for r in summary if r["dimension"] == "job"}
    assert jobs == {f"01000000@{first}": 2, f"01000000@{second}": 1}
    # a session's start keeps the clusters that started then
    hour = json.loads(evagg("query", *where, "tasks", "--session", "session_2026-12-06_11",
                            "--json").stdout)
    assert [r["task_id"] for r in hour] == ["t2"]
    keyed = evagg("query", *where, "tasks", "--job", f"01000000@{first}", "--json")
    assert keyed.returncode == 0, keyed.stderr
    assert sorted(r["task_id"] for r in json.loads(keyed.stdout)) == ["t0", "t1"]


def test_steps_search_and_sql(lake: Path, expected: type[Expected]) -> None:
    steps = json.loads(evagg("query", "--data", str(lake), "steps", "--run", "run1",
                             "--json").stdout)
    assert {s["step"]: s["ops"] for s in steps} == expected.steps
    table = evagg("query", "--data", str(lake), "steps", "--run", "run1").stdout
    assert "loss=0.7..0.9 ~0.8" in table
    # `--run-id`, as the emitter names the field, is the same flag
    assert evagg("query", "--data", str(lake), "steps", "--run-id", "run1").stdout == table
    found = json.loads(evagg("query", "--data", str(lake), "search", "ENOSPC", "--json").stdout)
    assert [(r["kind"], r["id"], r["attempt"]) for r in found] == [("task", "flaky", 0)]
    spans = json.loads(evagg("query", "--data", str(lake), "search", "missing variable",
                             "--json").stdout)
    assert [(r["kind"], r["name"]) for r in spans] == [("span", "template")]
    counted = evagg("query", "--data", str(lake), "sql",
                    "SELECT count(*) AS n FROM events", "--csv")
    assert counted.stdout.splitlines() == ["n", str(expected.distinct_events)]


def test_small_numbers_keep_their_digits_in_the_table(lake: Path) -> None:
    # an op of 198 us and a learning rate of 1e-5 used to read 0.000
    out = evagg("query", "--data", str(lake), "sql",
                "SELECT 0.000198149::DOUBLE AS backward_s, 1e-5::DOUBLE AS lr, "
                "2.5::DOUBLE AS loss, 0.0::DOUBLE AS zero")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2].split() == ["0.000198", "1e-05", "2.500", "0.000"]


def test_metrics_read_as_numbers_not_seconds(lake: Path) -> None:
    # a step's tokens read 4096.000 and its learning rate 0.100, as if they were seconds
    out = evagg("query", "--data", str(lake), "sql",
                "SELECT MAP {'tokens': 4096.0, 'lr': 0.1, 'loss': 1.47391, 'w': 6.1e-07, "
                "'r': 3931860.64, 'z': 0.0} AS metrics")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2].strip() == (
        "tokens=4096, lr=0.1, loss=1.474, w=6.1e-07, r=3931860.6, z=0")


def test_data_from_the_environment(lake: Path) -> None:
    import os

    env = {**os.environ, "EVAGG_DATA": str(lake)}
    out = evagg("query", "runs", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert sorted(r["run_id"] for r in json.loads(out.stdout)) == ["run1", "run2"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tasks", "--since", "yesterday"], 2, "cannot read time 'yesterday'"),
        (["tasks", "--state", "FAIL;ED"], 2, "malformed state"),
        (["tasks", "--since", "1h", "--until", "2h"], 2, "since is later than until"),
        (["sql", "SELEC 1"], 2, "syntax error"),
        (["sql", "SELECT * FROM no_such_view"], 2, "no_such_view"),
        (["sql", "SELECT nosuchcol FROM tasks"], 2, "nosuchcol"),
        (["sql", ""], 2, "sql: the statement is empty"),
        (["sql", "  \n\t "], 2, "sql: the statement is empty"),
        (["sql", "-- only a comment\n;"], 2, "sql: the statement is empty"),
        (["steps", "--run", "no-such-run"], 1, "no steps for run 'no-such-run'"),
        (["search", "  "], 2, "search text is empty"),
    ],
)
def test_bad_input_gives_a_clear_message(lake: Path, args: list[str], code: int,
                                         message: str) -> None:
    out = evagg("query", "--data", str(lake), *args)
    assert out.returncode == code
    assert message in out.stderr
    assert out.stderr.startswith("evagg query: ")
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_missing_and_empty_data(tmp_path: Path) -> None:
    missing = evagg("query", "--data", str(tmp_path / "nope"), "summary")
    assert missing.returncode == 1
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    empty = evagg("query", "--data", str(tmp_path), "summary")
    assert empty.returncode == 1
    assert "no Parquet files under" in empty.stderr and "Traceback" not in empty.stderr
    unknown = evagg("query", "--data", str(tmp_path), "frobnicate")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr


def test_in_process_run_query(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, "--data", str(lake), "tasks", "--limit", "2", "--sort",
                              "duration")
    assert code == 0
    assert out.splitlines()[-1] == "(2 rows of 17)"
    assert out.splitlines()[2].split()[0] == "sq10"  # the longest task first
    code, out, _ = in_process(capsys, "--data", str(lake), "agents", "--json")
    assert code == 0 and {a["node_id"] for a in json.loads(out)} == {"nodeA", "nodeB"}
    code, _, err = in_process(capsys, "--data", str(lake), "tasks", "--limit", "0")
    assert code == 2 and "--limit" in err
    code, _, err = in_process(capsys, "--data", str(lake))
    assert code == 2 and "choose a query" in err


def test_the_command_keeps_pandas_and_pyarrow_out(lake: Path, tmp_path: Path) -> None:
    """DuckDB imports pandas, where installed, the first time it binds a parameter (the
    fold binds some): a quarter of a second the command does not need. pyarrow and numpy
    are the writer's (sinks/parquet/sink.py): importing them took `evagg query summary`
    from 0.6 to 1.0 CPU s."""
    pytest.importorskip("pandas")  # the premise: installed here (the test extra has it)
    code = ("import sys\nfrom aggregator.cli import main\n"
            f"rc = main(['query', '--data', {str(lake)!r}, '--cache', {str(tmp_path)!r}, "
            "'summary', '--json'])\n"
            "print(rc, sorted({'pandas', 'pyarrow', 'numpy'} & set(sys.modules)), "
            "file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "0 []", done.stderr
    assert json.loads(done.stdout)  # the summary rows


def test_a_traced_op_is_found_once_as_an_op(tmp_path: Path) -> None:
    """An op with a trace id is both an op and a span of its trace: search listed it twice,
    as `op` and as `span`. It is listed once, as the op; a plain span is still a span, and
    searching the trace id still finds the op."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    common = {"kind": "op", "source": "torch", "name": "allreduce-stall", "run_id": "run9",
              "span_id": "00f067aa0ba902b7", "trace_id": trace, "node_id": "nodeA"}
    rows = [event(**common, state="STARTED", time=at(1.0)),
            event(**common, state="FINISHED", time=at(2.0), duration_s=1.0),
            event(kind="span", source="otel", name="allreduce-stall wait", trace_id=trace,
                  span_id="b7ad6b7169203331", state="FINISHED", time=at(1.5),
                  duration_s=0.2)]
    write_rows(local_put(tmp_path), rows, "part-0.parquet")
    for text in ("allreduce-stall", trace):
        found = json.loads(evagg("query", "--data", str(tmp_path), "search", text,
                                 "--json").stdout)
        assert sorted((r["kind"], r["id"]) for r in found) == [
            ("op", "00f067aa0ba902b7"), ("span", "b7ad6b7169203331")], (text, found)
