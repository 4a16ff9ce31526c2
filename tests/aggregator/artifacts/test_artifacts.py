"""The files that explain a failure, kept with the events: a real agent ships the finished
files of its `[[files]]` directory into the lake, and `evagg query artifact` gives them
back byte for byte (docs/pytorch.md "Traces", docs/parquet-layout.md "_artifacts")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import REPO, AgentProcess
from tests.waiting import wait_for, wait_until

SETTLE = "1s"


def evagg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def watching(agent_factory: Callable[..., AgentProcess], folder: Path,
             kind: str = "torch_trace", extra: str = "") -> AgentProcess:
    return agent_factory(extra_toml=f'[[files]]\npath = "{folder}"\nkind = "{kind}"\n'
                                    f'settle = "{SETTLE}"\n{extra}')


def listed(agent: AgentProcess, *flags: str) -> list[dict[str, Any]]:
    done = evagg("query", "artifacts", "--data", str(agent.lake_dir), "--no-cache",
                 "--json", *flags)
    if done.returncode != 0:  # no Parquet file yet
        return []
    return list(json.loads(done.stdout))


def wait_listed(agent: AgentProcess, count: int, what: str) -> list[dict[str, Any]]:
    return wait_for(lambda: (rows if len(rows := listed(agent)) >= count else []), 90,
                    lambda: f"{what}: {listed(agent)}\n{agent.log()}", interval=0.5)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(agent: AgentProcess, name: str, out: Path, *flags: str) -> Path:
    done = evagg("query", "artifact", name, "--data", str(agent.lake_dir), "--no-cache",
                 "--out", str(out), *flags)
    assert done.returncode == 0, done.stderr
    return out


def test_a_cpu_profiler_trace_comes_back_byte_for_byte(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import emitters.torch

    traces = tmp_path / "traces"
    agent = watching(agent_factory, traces).start()
    handler = emitters.torch.trace_handler(traces, run_id="exp-42")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                on_trace_ready=handler):
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert handler.errors == 0 and len(handler.written) == 1
    written = handler.written[0]
    assert written.parent == traces / "exp-42"
    assert json.loads(written.read_bytes())["traceEvents"], "a Chrome trace"

    [row] = wait_listed(agent, 1, "the trace in the listing")
    assert row["name"] == f"exp-42/{written.name}" and row["run_id"] == "exp-42"
    assert (row["artifact_kind"], row["version"], row["node_id"]) == ("torch_trace", 1,
                                                                       "test-node")
    assert row["size_bytes"] == written.stat().st_size and row["sha256"] == sha256(written)
    assert row["lake_key"].startswith("_artifacts/node=test-node/")

    back = fetch(agent, written.name, tmp_path / "back.json")  # the last part is enough
    assert back.read_bytes() == written.read_bytes()
    assert listed(agent, "--run", "exp-42") == [row] and listed(agent, "--run", "other") == []
    assert not [p for p in agent.lake_dir.rglob("*.parquet") if "_artifacts" in p.parts]


def test_a_file_held_open_is_not_shipped_until_it_is_closed(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    dumps = tmp_path / "fr"
    dumps.mkdir()
    agent = watching(agent_factory, dumps, kind="nccl_flight_recorder").start()
    growing = dumps / "rank_0"
    with growing.open("wb") as out:  # as the flight recorder writes its dump
        out.write(b"first half ")
        out.flush()
        os.utime(growing, (1, 1))  # looks settled long ago: only the open file holds it back
        (dumps / "marker").write_bytes(b"m")
        wait_listed(agent, 1, "a finished file beside the open one")
        assert [r["name"] for r in listed(agent)] == ["marker"]
        out.write(b"second half")
    [_, row] = wait_listed(agent, 2, "the file once closed")
    assert row["name"] == "rank_0" and row["sha256"] == sha256(growing)
    assert fetch(agent, "rank_0", tmp_path / "got").read_bytes() == b"first half second half"


def test_a_rewritten_file_is_version_2_and_a_restart_ships_nothing_again(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    agent = watching(agent_factory, folder, extra='run_id = "r1"\njob_id = "j1"\n').start()
    report = folder / "report.txt"
    report.write_bytes(b"one")
    wait_listed(agent, 1, "version 1")
    report.write_bytes(b"two, longer")
    rows = wait_listed(agent, 2, "version 2")
    assert [(r["version"], r["run_id"], r["job_id"]) for r in rows] == [(1, "r1", "j1"),
                                                                         (2, "r1", "j1")]
    assert fetch(agent, "report.txt", tmp_path / "v1", "--version", "1").read_bytes() == b"one"
    assert fetch(agent, "report.txt", tmp_path / "v2").read_bytes() == b"two, longer"

    os.utime(report)  # touched, the same bytes: not a new version
    agent.restart()
    (folder / "after").write_bytes(b"after the restart")
    wait_listed(agent, 3, "the file written after the restart")
    assert agent.metric("evagg_artifacts_shipped_total") == 1  # only the new one
    agent.stop()
    assert [(r["name"], r["version"]) for r in listed(agent)] == [
        ("report.txt", 1), ("report.txt", 2), ("after", 1)]
    raw = agent.query("SELECT name, attrs['version'] FROM events WHERE kind = 'artifact' "
                      "ORDER BY time")  # every copy, so a second shipping would show
    assert raw == [("report.txt", "1"), ("report.txt", "2"), ("after", "1")]
    objects = sorted(p.relative_to(agent.lake_dir).as_posix()
                     for p in (agent.lake_dir / "_artifacts").rglob("*") if p.is_file())
    assert objects == ["_artifacts/node=test-node/after/v=0001/after",
                       "_artifacts/node=test-node/report.txt/v=0001/report.txt",
                       "_artifacts/node=test-node/report.txt/v=0002/report.txt"]


def test_a_symlink_out_of_the_directory_is_never_followed(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    folder, secret = tmp_path / "files", tmp_path / "secret"
    (folder / "sub").mkdir(parents=True)
    secret.mkdir()
    (secret / "key").write_bytes(b"not for the lake")
    (folder / "link").symlink_to(secret / "key")
    (folder / "sub" / "dir").symlink_to(secret)
    (folder / ".hidden.tmp").write_bytes(b"half")
    agent = watching(agent_factory, folder).start()
    (folder / "real").write_bytes(b"real")
    wait_listed(agent, 1, "the regular file")
    agent.stop()
    assert [r["name"] for r in listed(agent)] == ["real"]
    assert not any(b"not for the lake" in p.read_bytes()
                   for p in (agent.lake_dir / "_artifacts").rglob("*") if p.is_file())


def test_query_artifact_says_what_is_missing(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    agent = watching(agent_factory, folder).start()
    (folder / "a").write_bytes(b"a")
    wait_listed(agent, 1, "one file")
    missing = evagg("query", "artifact", "nope", "--data", str(agent.lake_dir), "--no-cache",
                    "--out", str(tmp_path / "x"))
    assert missing.returncode == 1
    assert "no artifact named 'nope'" in missing.stderr and "evagg query artifacts" in \
        missing.stderr
    old = evagg("query", "artifact", "a", "--version", "7", "--data", str(agent.lake_dir),
                "--no-cache", "--out", str(tmp_path / "x"))
    assert old.returncode == 1 and "no version 7 (stored: 1)" in old.stderr
    nowhere = tmp_path / "no-such-dir" / "a"
    unwritable = evagg("query", "artifact", "a", "--data", str(agent.lake_dir), "--no-cache",
                       "--out", str(nowhere))
    assert unwritable.returncode == 2
    assert f"cannot write {nowhere}: No such file or directory" in unwritable.stderr
    assert not (tmp_path / "x").exists()


def test_an_unreadable_state_ships_nothing_and_says_what_to_do(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a").write_bytes(b"a")
    agent = watching(agent_factory, folder)
    state = agent.state_dir / "artifacts" / "shipped.json"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"{not json")
    agent.start()
    wait_until(lambda: any(line.startswith("evagg_worker_errors_total{") and
                           'worker="artifacts"' in line for line in agent.metrics().splitlines()),
               60, lambda: f"the worker's error\n{agent.log()}")
    assert f"artifact state {state} is unreadable" in agent.log()
    assert "move it away to ship every watched file again as new" in agent.log()
    assert agent.running and agent.metric("evagg_artifacts_shipped_total") == 0
    state.unlink()  # as the message says
    wait_listed(agent, 1, "the file once the state is moved away")


def shipped_dump(agent_factory: Callable[..., AgentProcess],
                 tmp_path: Path) -> tuple[Path, AgentProcess]:
    """A flight recorder's dump under run-7, shipped by a running agent."""
    dumps = tmp_path / "fr"
    (dumps / "run-7").mkdir(parents=True)
    dump = dumps / "run-7" / "nccl_trace_rank_0"
    dump.write_bytes(b"flight recorder " * 64)
    agent = watching(agent_factory, dumps, kind="nccl_flight_recorder").start()
    wait_listed(agent, 1, "the dump in the listing")
    return dump, agent


def test_the_listing_shows_each_sha256_whole_to_check_a_copy_against(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    """`evagg query artifacts` and `evagg query artifact` as tables, as a user reads them
    beside `sha256sum`: the digest is 64 characters, and the table's 60-character cut
    left `a9b9...681d…`, which matches nothing."""
    dump, agent = shipped_dump(agent_factory, tmp_path)
    table = evagg("query", "artifacts", "--data", str(agent.lake_dir), "--no-cache",
                  "--run", "run-7")
    assert table.returncode == 0, table.stderr
    assert f"  {sha256(dump)}  " in table.stdout, table.stdout
    fetched = evagg("query", "artifact", dump.name, "--data", str(agent.lake_dir),
                    "--no-cache", "--out", str(tmp_path / "copy"))
    assert fetched.returncode == 0, fetched.stderr
    assert f"  {sha256(tmp_path / 'copy')}  " in fetched.stdout, fetched.stdout


def test_a_lake_of_a_second_sink_says_where_its_listed_files_are(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    """Every Parquet sink gets the artifact events; only the first, the files. Asked of
    the second lake, which lists the file, `evagg query artifact` says where it is."""
    folder, second = tmp_path / "files", tmp_path / "second-lake"
    folder.mkdir()
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{lake}"\n'
             'roll_interval = "1s"\n\n'
             f'[[sinks]]\nname = "second"\ntype = "parquet"\nurl = "{second}"\n'
             'roll_interval = "1s"\n')
    agent = agent_factory(sinks_toml=sinks, extra_toml=f'[[files]]\npath = "{folder}"\n'
                                                        f'kind = "dump"\nsettle = "{SETTLE}"\n')
    agent.start()
    (folder / "a").write_bytes(b"a")
    wait_listed(agent, 1, "the file in the first lake")

    def listed_in_second() -> bool:
        done = evagg("query", "artifacts", "--data", str(second), "--no-cache", "--json")
        return done.returncode == 0 and len(json.loads(done.stdout)) == 1

    wait_until(listed_in_second, 90, "the file's event in the second lake")
    done = evagg("query", "artifact", "a", "--data", str(second), "--no-cache",
                 "--out", str(tmp_path / "a"))
    assert done.returncode == 1
    assert "is missing from the lake" in done.stderr
    assert "only into its first Parquet sink's lake" in done.stderr, done.stderr
    assert fetch(agent, "a", tmp_path / "b").read_bytes() == b"a"


def test_the_listing_shows_each_lake_key_whole_to_copy_the_file_by(
        agent_factory: Callable[..., AgentProcess], tmp_path: Path) -> None:
    """docs/parquet-layout.md copies a shipped file by its key: `cp "lake/<lake_key>"`.
    Read off the table, the key must name the object, not end in `…`."""
    dump, agent = shipped_dump(agent_factory, tmp_path)
    table = evagg("query", "artifacts", "--data", str(agent.lake_dir), "--no-cache")
    assert table.returncode == 0, table.stderr
    (row,) = [line for line in table.stdout.splitlines() if sha256(dump) in line]
    lake_key = row.split()[-1]
    assert (agent.lake_dir / lake_key).read_bytes() == dump.read_bytes(), lake_key
