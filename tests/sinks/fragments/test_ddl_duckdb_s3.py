"""A data engineer with no network reads an S3 lake in a plain DuckDB: `evagg query ddl
--dialect duckdb` prints the views and, in its header, where to find how to load httpfs
offline; docs/queries.md's snippet loads the build pip installed, and the printed
statements then answer from the lake a real agent wrote to (moto's) S3."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import REPO, AgentProcess
from tests.sinks.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoS3, aws_env
from tests.waiting import wait_until

EVAGG = str(Path(sys.executable).with_name("evagg"))


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


def offline_httpfs_snippet() -> str:
    """The Python block of docs/queries.md that loads httpfs without network."""
    text = (REPO / "docs" / "queries.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (snippet,) = [b for b in blocks if "duckdb_extension_httpfs" in b]
    return snippet


def test_the_printed_duckdb_ddl_reads_an_s3_lake_offline(
        agent_factory: Callable[..., AgentProcess], moto: MotoS3) -> None:
    bucket = moto.create_bucket()
    sinks = ('[[sinks]]\nname = "lake"\ntype = "parquet"\n'
             f'url = "s3://{bucket}/lake/"\nendpoint_url = "{moto.endpoint_url}"\n'
             'path_style = true\nroll_interval = "1s"\n')
    agent = agent_factory(sinks_toml=sinks, env=aws_env()).start()
    env = {**os.environ, **aws_env(), "EVAGG_SOCKET": str(agent.socket_path)}
    sent = subprocess.run([EVAGG, "emit", "--kind", "task", "--name", "etl_load", "--state",
                           "FAILED", "--field", "task_id=etl-2", "--field", "duration_s=3.1",
                           "--field", "error_type=IOError"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: any(k.endswith(".parquet") for k in moto.keys(bucket, "lake/date=")),
               60, "the event's file on S3")
    printed = subprocess.run([EVAGG, "query", "ddl", "--dialect", "duckdb",
                              f"s3://{bucket}/lake/", "--endpoint-url", moto.endpoint_url],
                             env=env, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "offline:\n--   docs/queries.md, DuckDB without evagg" in printed.stdout

    # The documented snippet as written: no evagg code in it, nothing downloaded.
    found: dict[str, Any] = {}
    exec(offline_httpfs_snippet(), found)
    con = found["con"]
    con.execute("SET autoinstall_known_extensions = false")
    con.execute(f"CREATE SECRET (TYPE s3, KEY_ID '{ACCESS_KEY}', SECRET '{SECRET_KEY}', "
                f"REGION '{REGION}', ENDPOINT '127.0.0.1:{moto.port}', URL_STYLE 'path', "
                "USE_SSL false)")
    con.execute(printed.stdout)
    rows = con.execute("SELECT task_id, name, final_state, error_type, duration_s "
                       "FROM tasks").fetchall()
    assert rows == [("etl-2", "etl_load", "FAILED", "IOError", 3.1)]
