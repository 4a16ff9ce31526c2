"""Ray's State API from a store on S3 (moto's server on loopback): the same answers as
from the same files on a local disk, through Ray's own client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.raygen import SESSION, write_ray_lake
from tests.dashboard.serve import serving
from tests.sinks.moto_server import MotoS3, aws_env

BUCKET = "ray-lake"
PREFIX = "cluster-7"
TASKS = 300


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN",
                 "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def lakes(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    local = write_ray_lake(tmp_path / "lake", TASKS, span_s=60, per_file=100)
    server = MotoS3().start()
    endpoint = server.endpoint_url
    client: Any = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for path in local.rglob("*.parquet"):
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path.relative_to(local)}",
                          Body=path.read_bytes())
    s3 = Store(StoreOptions(f"s3://{BUCKET}/{PREFIX}", endpoint_url=endpoint, engine="pyarrow"))
    disk = Store(StoreOptions(str(local)))
    try:
        yield s3, disk
    finally:
        s3.close()
        disk.close()
        server.stop()


def answers(store: Store) -> dict[str, Any]:
    from ray.util.state import list_nodes, list_tasks, summarize_tasks

    with serving(store) as url:
        return {
            "failed": sorted((t.task_id, t.name, t.error_type) for t in list_tasks(
                address=url, filters=[("state", "=", "FAILED")], limit=1000)),
            "page": [t.asdict() for t in list_tasks(address=url, limit=50, detail=True)],
            "summary": summarize_tasks(address=url),
            "nodes": sorted(n.node_ip for n in list_nodes(address=url)),
            "scoped": len(list_tasks(address=f"{url}/ray/{SESSION}", limit=1000)),
        }


def test_s3_store_answers_ray_as_the_local_one_does(lakes: tuple[Store, Store]) -> None:
    s3, disk = lakes
    from_s3, from_disk = answers(s3), answers(disk)
    assert from_s3 == from_disk
    assert from_s3["scoped"] == TASKS and len(from_s3["page"]) == 50
    assert from_s3["failed"] and len(from_s3["nodes"]) == 8
    counted = from_s3["summary"]["cluster"]
    assert counted["total_tasks"] == TASKS
