"""Shipped files (artifacts) read back: their index events and their bytes in the lake.

The index is the `artifact` events the agents wrote (aggregator/artifacts/); the bytes
are the objects under `_artifacts/` that those events name (sinks/artifacts/layout.py),
on a local directory or an s3:// prefix, as the store reads events.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Final

from dashboard.lake.errors import BadInput, NotFound, StoreUnavailable
from dashboard.lake.results import Result
from dashboard.lake.s3 import S3Settings
from dashboard.lake.store import Store, StoreOptions
from sinks.artifacts.layout import ARTIFACT_KIND, ARTIFACTS_ROOT
from sinks.locations import S3Location, is_s3_url

COLUMNS: Final = ("name", "version", "artifact_kind", "size_bytes", "sha256", "run_id",
                  "job_id", "node_id", "finished", "lake_key")
_LISTING: Final = f"""
SELECT name, TRY_CAST(attrs['version'] AS INTEGER) AS version,
       attrs['artifact_kind'] AS artifact_kind,
       TRY_CAST(attrs['size_bytes'] AS BIGINT) AS size_bytes, attrs['sha256'] AS sha256,
       run_id, job_id, node_id, time AS finished, attrs['lake_key'] AS lake_key
FROM events
WHERE kind = '{ARTIFACT_KIND}' AND ($run IS NULL OR run_id = $run)
  AND ($name IS NULL OR name = $name OR split_part(name, '/', -1) = $name)
ORDER BY finished, node_id, name, version
"""


def artifacts(store: Store, run: str | None = None, name: str | None = None) -> Result:
    """Every shipped version, oldest first (one row per index event)."""
    return store.execute(_LISTING, {"run": run, "name": name})


def choose(store: Store, name: str, version: int | None = None,
           node: str | None = None) -> dict[str, Any]:
    """One version of one artifact: the newest unless `version`; `name` is the name the
    listing shows or its last path part, which must then be unambiguous."""
    rows = [r for r in artifacts(store, name=name).records()
            if node is None or r["node_id"] == node]
    if not rows:
        raise NotFound(f"no artifact named {name!r}"
                       + (f" on node {node!r}" if node else "")
                       + "; `evagg query artifacts` lists the stored ones")
    owners = sorted({(r["node_id"], r["name"]) for r in rows})
    if len(owners) > 1:
        named = ", ".join(f"{n} on node {o}" for o, n in owners)
        raise BadInput(f"{name!r} names several artifacts ({named}): give the full name "
                       "and --node")
    if version is None:
        return max(rows, key=lambda r: r["version"] or 0)
    for row in rows:
        if row["version"] == version:
            return row
    have = ", ".join(str(r["version"]) for r in rows)
    raise NotFound(f"{name!r} has no version {version} (stored: {have})")


# Every Parquet sink gets the artifact event, only the first one the file: a lake read
# through another sink lists files it does not hold, and the answer must say where they are.
ONLY_FIRST_SINK = (": an agent ships its [[files]] only into its first Parquet sink's lake "
                   "(read that lake, if the agent has several; docs/configuration.md)")


@contextmanager
def opened(options: StoreOptions, key: str) -> Iterator[IO[bytes]]:
    """The object's bytes as a stream; only keys under `_artifacts/` are read."""
    parts = key.split("/")
    if parts[0] != ARTIFACTS_ROOT or any(p in ("", ".", "..") for p in parts):
        raise BadInput(f"{key!r} is not an artifact's key in the lake")
    if not is_s3_url(options.location):
        path = Path(options.location).expanduser().joinpath(*parts)
        try:
            stream = path.open("rb")
        except FileNotFoundError:
            raise NotFound(f"the artifact's file {path} is missing from the lake"
                           f"{ONLY_FIRST_SINK}") from None
        with stream:
            yield stream
        return
    yield from _s3_object(options, key)


def _s3_object(options: StoreOptions, key: str) -> Iterator[IO[bytes]]:
    import botocore.exceptions

    location = S3Location.parse(options.location)
    client = S3Settings.resolve(options.endpoint_url, options.region).client()
    try:
        answer = client.get_object(Bucket=location.bucket, Key=location.prefix + key)
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404"):
            raise NotFound(f"the artifact's object {key} is missing from "
                           f"{options.location}{ONLY_FIRST_SINK}") from None
        raise StoreUnavailable(f"reading {key} from {options.location} failed: {exc}") from None
    body = answer["Body"]
    try:
        yield body
    finally:
        body.close()


def save(options: StoreOptions, row: dict[str, Any], out: Path) -> None:
    """Write one version to `out`, checked against the sha256 its event recorded; a copy
    that does not match is removed and refused."""
    digest = hashlib.sha256()
    scratch = out.with_name(f".{out.name}.part")
    with opened(options, row["lake_key"]) as stream, scratch.open("wb") as target:
        while chunk := stream.read(1024 * 1024):
            digest.update(chunk)
            target.write(chunk)
    if digest.hexdigest() != row["sha256"]:
        scratch.unlink()
        raise StoreUnavailable(f"{row['lake_key']} does not hold the bytes its artifact "
                               "event recorded (sha256 differs): the object was changed")
    shutil.move(scratch, out)
