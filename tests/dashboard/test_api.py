"""The dashboard's JSON API and the `evagg dashboard` command: answers, errors, caching."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from dashboard.lake.errors import StoreUnavailable
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions.runner import QueryRunner
from tests.dashboard.lakegen import Expected, local_put, task_events, write_rows, write_sample_store
from tests.dashboard.serve import serving
from tests.ports import free_port
from tests.sinks.moto_server import MotoS3, aws_env

REPO = Path(__file__).resolve().parents[2]
SUMMARY_COLUMNS = ["value", "tasks", "pending", "submitted", "running", "finished", "failed",
                   "p50_s", "p90_s", "p99_s", "max_s", "mean_s", "duration_bins"]
EMPTY_BUCKET, EMPTY_PREFIX = "evagg-api", "cluster-9/events"


def get(url: str) -> tuple[int, Any, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body), dict(exc.headers)


def test_endpoints_answer(lake: Path) -> None:
    with serving(Store(StoreOptions(str(lake)))) as url:
        status, overview, headers = get(f"{url}/api/overview")
        assert status == 200 and overview["tasks"] == Expected.tasks
        assert overview["events"] == Expected.distinct_events
        assert {k["kind"] for k in overview["kinds"]} == {"task", "op", "span", "agent", "loss"}
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        _, ops, _ = get(f"{url}/api/op_counts")
        assert ops == {"ops": 14, "failed": 1}  # run1's failed backward, of both runs' ops
        _, page, _ = get(f"{url}/api/tasks?error_type=ValueError&sort=duration&order=asc&limit=1")
        assert page["total"] == 2 and [r["task_id"] for r in page["rows"]] == ["boom1"]
        _, page2, _ = get(f"{url}/api/tasks?error_type=ValueError&sort=duration&order=asc"
                          "&limit=1&offset=1")
        assert [r["task_id"] for r in page2["rows"]] == ["boom2"] and page2["total"] == 2
        _, beyond, _ = get(f"{url}/api/tasks?limit=5&offset=500")
        assert beyond["rows"] == [] and beyond["total"] == Expected.tasks
        _, detail, _ = get(f"{url}/api/task?task_id=flaky")
        assert [a["final_state"] for a in detail["attempts"]] == ["FAILED", "FINISHED"]
        assert len(detail["events"]) == 10  # two attempts of five pieces each
        _, steps, _ = get(f"{url}/api/steps?run=run1")
        assert [s["step"] for s in steps["steps"]["rows"]] == [0, 1, 2]
        _, agents, _ = get(f"{url}/api/agents")
        assert len(agents["losses"]["rows"]) == 2
        _, found, _ = get(f"{url}/api/search?q=CUDA")
        assert [r["kind"] for r in found["rows"]] == ["op"]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/api/tasks?sort=password", 400, "cannot sort by 'password'"),
        ("/api/tasks?order=sideways", 400, "order must be asc or desc"),
        ("/api/tasks?state=1%3D1", 400, "malformed state"),
        ("/api/tasks?limit=ten", 400, "limit must be a whole number"),
        ("/api/tasks?limit=100000", 400, "limit must be between"),
        ("/api/tasks?colour=red", 400, "unknown parameter 'colour'"),
        ("/api/tasks?since=2025-13-45", 400, "cannot read time"),
        ("/api/aggregate?by=password", 400, "cannot group by 'password'"),
        ("/api/task", 400, "task_id is required"),
        ("/api/task?task_id=x&attempt=-1", 400, "attempt must be between"),
        ("/api/task?task_id=nope", 404, "no task 'nope'"),
        ("/api/trace?trace_id=ffff", 404, "no spans for trace"),
        ("/api/steps?run=nope", 404, "no steps for run"),
        ("/api/search?q=", 400, "search text is empty"),
        ("/api/search?q=" + "x" * 600, 400, "longer than 500"),
        ("/api/drop_tables", 404, "no such endpoint"),
        ("/api/tasks?state=FAILED&state=FINISHED", 400, "repeated parameter 'state'"),
        ("/api/tasks?limit=5&name=square&limit=6", 400, "repeated parameter 'limit'"),
        ("/api/ledger?run=a&run=b", 400, "repeated parameter 'run'"),
    ],
)
def test_bad_input_is_a_json_error(lake: Path, path: str, status: int, message: str) -> None:
    with serving(Store(StoreOptions(str(lake)))) as url:
        code, body, _ = get(url + path)
        assert code == status
        assert message in body["error"]
        assert "Traceback" not in body["error"]
        _, ok, _ = get(f"{url}/api/overview")  # and the server still answers
        assert ok["tasks"] == Expected.tasks


def test_aggregate_sends_each_column_once(lake: Path) -> None:
    with serving(Store(StoreOptions(str(lake)))) as url:
        for by in ("name", "error_type", "job", "node", "state"):
            status, body, _ = get(f"{url}/api/aggregate?by={by}")
            assert status == 200 and body["columns"] == SUMMARY_COLUMNS
            assert body["rows"] and all(list(row) == SUMMARY_COLUMNS for row in body["rows"])


def test_static_files_stay_inside_their_folder(lake: Path) -> None:
    with serving(Store(StoreOptions(str(lake)))) as url:
        for path in ("/static/../store.py", "/static/%2e%2e/store.py"):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(url + path, timeout=30)
            assert caught.value.code in (403, 404)


def test_empty_store_then_files_arrive(tmp_path: Path) -> None:
    with serving(Store(StoreOptions(str(tmp_path), refresh_s=0.0))) as url:
        status, info, _ = get(f"{url}/api/info")
        assert status == 200 and info["files"] == 0 and "no Parquet files" in info["message"]
        status, body, _ = get(f"{url}/api/overview")
        assert status == 404 and "no Parquet files under" in body["error"]
        write_rows(local_put(tmp_path), task_events("t1", "f", start=0, run_s=1.0,
                                                    end_state="FINISHED"), "part-1.parquet")
        status, overview, _ = get(f"{url}/api/overview")
        assert status == 200 and overview["tasks"] == 1


def test_results_are_cached_until_files_change(lake: Path) -> None:
    store = Store(StoreOptions(str(lake), refresh_s=0.0))
    calls: list[str] = []
    real = store.execute

    def counting(sql: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(sql)
        return real(sql, *args, **kwargs)

    store.execute = counting  # type: ignore[method-assign]
    with serving(store) as url:
        get(f"{url}/api/aggregate?by=name")
        first = len(calls)
        _, again, _ = get(f"{url}/api/aggregate?by=name")
        assert len(calls) == first  # served from the cache
        write_rows(local_put(lake), task_events("n1", "newname", start=70.0, run_s=1.0,
                                                end_state="FINISHED"), "part-00011.parquet")
        _, fresh, _ = get(f"{url}/api/aggregate?by=name")
        assert len(calls) > first
        assert "newname" in {r["value"] for r in fresh["rows"]}
        assert "newname" not in {r["value"] for r in again["rows"]}


def test_slow_query_is_interrupted(lake: Path) -> None:
    store = Store(StoreOptions(str(lake)))
    store.execute("SELECT count(*) FROM tasks")  # the first fold is not what this times
    runner = QueryRunner(store, timeout_s=0.3)

    async def scenario() -> int:
        with pytest.raises(StoreUnavailable, match=r"longer than 0\.3 s"):
            await runner.run(lambda: store.execute(
                "SELECT count(*) FROM range(1000000000) a, range(1000000000) b"))
        runner.timeout_s = 30  # the next query need only work, on a machine however busy
        result = await runner.run(lambda: store.execute("SELECT count(*) AS n FROM tasks"))
        return int(result.rows[0][0])

    # The cross join would run for years: returning at all shows it was interrupted,
    # and the next query on the same store works.
    assert asyncio.run(scenario()) == Expected.tasks
    runner.close()
    store.close()


@contextlib.contextmanager
def dashboard_command(*args: str) -> Iterator[str]:
    """`evagg dashboard ARGS --port P` as a user starts it; yields its URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "aggregator", "dashboard", *args,
                             "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(f"{url}/api/info")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the dashboard did not come up"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_dashboard_command(lake: Path, tmp_path: Path) -> None:
    with dashboard_command("--data", str(lake)) as url:
        status, info, _ = get(f"{url}/api/info")
        assert status == 200 and info["files"] == 8 and info["engine"] == "local"
        with urllib.request.urlopen(f"{url}/", timeout=30) as page:
            assert b"/static/app.js" in page.read()
    missing = subprocess.run([sys.executable, "-m", "aggregator", "dashboard", "--data",
                              str(tmp_path / "nope")], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "aggregator", "dashboard", "--data", str(lake),
                          "--listen", "nowhere"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--listen must be HOST:PORT" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "aggregator", "dashboard", "--data", str(lake),
                          "--port", "70000"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--port must be 0 to 65535" in bad.stderr


def test_a_dashboard_whose_port_is_taken_says_which_and_never_that_it_serves(
        lake: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "aggregator", "dashboard", "--data",
                               str(lake), "--port", str(port)], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "on http://" not in done.stdout and "Traceback" not in done.stderr


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 on loopback with one bucket that holds an object, but none under
    EMPTY_PREFIX."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)
    server = MotoS3().start()
    try:
        endpoint = server.endpoint_url
        client: Any = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=EMPTY_BUCKET)
        client.put_object(Bucket=EMPTY_BUCKET, Key="elsewhere/readme.txt", Body=b"x")
        yield endpoint
    finally:
        server.stop()


def test_empty_s3_prefix_answers_with_a_message(s3_endpoint: str) -> None:
    location = f"s3://{EMPTY_BUCKET}/{EMPTY_PREFIX}"
    store = Store(StoreOptions(location, endpoint_url=s3_endpoint, refresh_s=0.0))
    with serving(store) as url:
        status, info, _ = get(f"{url}/api/info")
        assert status == 200 and info["files"] == 0
        assert f"no Parquet files under {location}" in info["message"]
        for path in ("/api/overview", "/api/tasks?state=FAILED", "/api/aggregate?by=name",
                     "/api/agents", "/api/search?q=boom"):
            status, body, _ = get(url + path)
            assert status == 404, (path, body)
            assert f"no Parquet files under {location}" in body["error"]
            assert "Traceback" not in body["error"]
        client: Any = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")

        def put(relative: str, data: bytes) -> None:
            client.put_object(Bucket=EMPTY_BUCKET, Key=f"{EMPTY_PREFIX}/{relative}", Body=data)

        write_rows(put, task_events("s3t1", "f", start=0, run_s=1.0, end_state="FINISHED"),
                   "part-1.parquet")
        status, overview, _ = get(f"{url}/api/overview")  # still serving, and sees the file
        assert status == 200 and overview["tasks"] == 1


def test_the_dashboard_warns_only_when_other_machines_can_reach_it() -> None:
    from dashboard.web.server import reachable_from_elsewhere

    assert not any(map(reachable_from_elsewhere, ("127.0.0.1", "127.0.0.2", "::1", "localhost")))
    assert all(map(reachable_from_elsewhere, ("0.0.0.0", "::", "10.1.2.3", "node7.internal")))


@pytest.mark.parametrize("engine", ["httpfs", "pyarrow"])
def test_the_dashboard_command_on_s3_answers_as_over_the_same_files_on_disk(
        s3_endpoint: str, lake: Path, engine: str) -> None:
    """`evagg dashboard --data s3://...` as a user types it, with either way of reading S3:
    the same files in moto's bucket answer what they answer on a local disk."""
    client: Any = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    prefix = f"cluster-{engine}/events"
    write_sample_store(lambda relative, data: client.put_object(
        Bucket=EMPTY_BUCKET, Key=f"{prefix}/{relative}", Body=data))
    paths = ("/api/overview", "/api/tasks?state=FAILED", "/api/aggregate?by=name")
    with serving(Store(StoreOptions(str(lake)))) as local:
        on_disk = [get(local + path)[1] for path in paths]
    with dashboard_command("--data", f"s3://{EMPTY_BUCKET}/{prefix}", "--endpoint-url",
                           s3_endpoint, "--region", "us-east-1", "--engine", engine) as url:
        status, info, _ = get(f"{url}/api/info")
        assert status == 200 and info["files"] == 8 and info["engine"] == engine, info
        assert [get(url + path)[1] for path in paths] == on_disk


def test_every_api_route_is_in_the_docs_table() -> None:
    """docs/dashboard.md's JSON API table names every /api/ route the server has (the
    ledger's was missing; the page called it, the docs did not say)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    routes = set()
    for source in (repo / "dashboard" / "web").glob("*.py"):
        routes |= set(re.findall(r'web\.get\("(/api/[a-z_/]+)"', source.read_text()))
    documented = set(re.findall(r"^\| `(/api/[a-z_/]+)`", (repo / "docs" / "dashboard.md")
                                .read_text(), flags=re.MULTILINE))
    assert routes and routes <= documented, sorted(routes - documented)
