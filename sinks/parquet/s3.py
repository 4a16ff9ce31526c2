"""S3 (or an S3-compatible store) as an ObjectStore, through boto3.

Credentials and region come only from boto3's standard chain (environment, shared
files, instance or pod roles); nothing here reads, stores or logs them. botocore retries
once at most: the delivery loop retries with backoff and resends from the spool, so a
failure here should surface fast and classified (`StoreError`).

A publish is one PutObject below `multipart_threshold`, else a multipart upload that is
aborted on any failure. An abort that fails too (the endpoint is down) is remembered and
retried before the next upload; uploads left by a crashed agent are swept at the first
upload of a process (see `_sweep_orphans`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from sinks.base import SinkCounter
from sinks.locations import S3Location, redacted_endpoint
from sinks.parquet.layout import node_of, spool_prefix_of
from sinks.parquet.options import S3Options
from sinks.parquet.s3_errors import classify
from sinks.parquet.stores import ObjectStore, StoreError, is_staging_name, staging_name

log = logging.getLogger("evagg.sinks.parquet.s3")

MIB: Final = 1024 * 1024
PART_SIZE: Final = 8 * MIB  # S3's floor is 5 MiB for every part but the last
MAX_PARTS: Final = 10_000
STALE_UPLOAD_AGE_S: Final = 3600.0
PARQUET_CONTENT_TYPE: Final = "application/vnd.apache.parquet"
# `stats` key -> the counter exported as evagg_sink_<name>_total (docs/metrics.md)
_EXPORTED_STATS: Final = {
    "puts": "s3_puts", "multipart": "s3_multipart_uploads", "aborted": "s3_aborted_uploads",
    "abort_failed": "s3_abort_failures", "swept": "s3_swept_uploads", "retries": "s3_retries",
}
# what each of them measures (Sink.metric_help)
METRIC_HELP: Final[Mapping[str, str]] = {
    "s3_puts": "Files uploaded to S3 in one PutObject",
    "s3_multipart_uploads": "Files uploaded to S3 in parts",
    "s3_aborted_uploads": "Multipart uploads aborted after a failure",
    "s3_abort_failures": "Aborts of multipart uploads that failed (tried again before the next "
                         "upload)",
    "s3_swept_uploads": "Multipart uploads a crashed agent left, aborted at the first upload",
    "s3_retries": "botocore's own retries of S3 calls that got an answer",
}


CHECK_TIMEOUT_S: Final = 5.0  # check_access's one read, after a connect of at most 5 s


def make_client(*, endpoint_url: str | None, region: str | None, path_style: bool,
                read_timeout: float = 30, attempts: int = 2) -> Any:
    """A boto3 S3 client; credentials and (unless given) region from boto3's own chain."""
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=region,
        connect_timeout=5,
        read_timeout=read_timeout,
        retries={"mode": "standard", "total_max_attempts": attempts},
        s3={"addressing_style": "path"} if path_style else None,
        user_agent_extra="evagg",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


class S3Store(ObjectStore):
    def __init__(self, url: str, options: S3Options = S3Options(),  # noqa: B008 -- frozen
                 *, staging_dir: Path, part_size: int = PART_SIZE) -> None:
        location = S3Location.parse(url)
        self.bucket, self.prefix = location.bucket, location.prefix
        # on every upload: encryption and storage class (sinks/parquet/s3_uploads.py)
        self.upload_args = dict(options.upload_args)
        self.staging_dir = Path(staging_dir)
        self.endpoint_url = options.endpoint_url
        self.region = options.region
        self.path_style = options.path_style
        self.multipart_threshold = max(1, options.multipart_threshold)
        self.part_size = max(5 * MIB, part_size)
        self.stats: Counter[str] = Counter()  # the keys of _EXPORTED_STATS
        self._client: Any = None
        self._lock = threading.Lock()
        self._pending_aborts: list[tuple[str, str]] = []  # (full key, upload id)
        self._swept = False
        self._sweep_failures: set[str] = set()  # kinds of failed sweeps already logged

    @property
    def client(self) -> Any:
        """Made on first use, so that `evagg check-config` builds a store offline."""
        with self._lock:
            if self._client is None:
                self._client = make_client(endpoint_url=self.endpoint_url, region=self.region,
                                           path_style=self.path_style)
                self._client.meta.events.register("after-call.s3", self._count_retries)
            return self._client

    def _count_retries(self, parsed: Mapping[str, Any] | None = None, **_: Any) -> None:
        """botocore's own retries of each answered call (at most one, see make_client)."""
        metadata = (parsed or {}).get("ResponseMetadata", {})
        self.stats["retries"] += int(metadata.get("RetryAttempts") or 0)

    def counters(self) -> list[SinkCounter]:
        return [SinkCounter(name, self.stats[key]) for key, name in _EXPORTED_STATS.items()]

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return f"{where} via {redacted_endpoint(self.endpoint_url)}" if self.endpoint_url else where

    def check_access(self) -> None:
        """One ListObjectsV2 under the prefix, as `evagg check-config` asks: a bucket that
        does not exist, missing or wrong credentials and a denied policy raise StoreError
        now instead of at the first upload (the hour merge lists what it merges, too)."""
        # One short try: check-config runs before every start (systemd's ExecStartPre), and
        # an S3 that hangs must not hold a restart for the sink's own minute of timeouts.
        client = make_client(endpoint_url=self.endpoint_url, region=self.region,
                             path_style=self.path_style, read_timeout=CHECK_TIMEOUT_S,
                             attempts=1)
        with self.classified("ListObjectsV2", self.prefix):
            client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

    def full_key(self, key: str) -> str:
        return self.prefix + key.lstrip("/")

    def staging_path(self, key: str) -> Path:
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.staging_dir / staging_name(f"{digest}-{key.rsplit('/', 1)[-1]}")

    def cleanup_staging(self) -> int:
        if not self.staging_dir.is_dir():
            return 0
        removed = 0
        for path in self.staging_dir.iterdir():
            if is_staging_name(path.name):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    async def publish(self, staged: Path, key: str) -> None:
        await asyncio.to_thread(self.upload_file, staged, key)
        staged.unlink(missing_ok=True)

    def upload_file(self, staged: Path, key: str) -> None:
        """Blocking: make `staged` the object at `key`. Raises StoreError."""
        full = self.full_key(key)
        try:
            size = staged.stat().st_size
        except OSError as exc:
            raise StoreError(f"staged file for {key}: {exc.strerror}", "staging_io") from exc
        self._abort_pending()
        if not self._swept:
            self._sweep_orphans(key)
        with self.classified("PutObject", full):
            if size < self.multipart_threshold:
                with staged.open("rb") as body:
                    self.client.put_object(Bucket=self.bucket, Key=full, Body=body,
                                           ContentLength=size, ContentType=PARQUET_CONTENT_TYPE,
                                           **self.upload_args)
                self.stats["puts"] += 1
            else:
                self._multipart(staged, full, size)

    def _multipart(self, staged: Path, full: str, size: int) -> None:
        part_size = max(self.part_size, -(-size // MAX_PARTS))
        created = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=full, ContentType=PARQUET_CONTENT_TYPE, **self.upload_args)
        upload_id = created["UploadId"]
        try:
            parts = []
            with staged.open("rb") as body:
                number = 1
                while chunk := body.read(part_size):
                    answer = self.client.upload_part(Bucket=self.bucket, Key=full,
                                                     UploadId=upload_id, PartNumber=number,
                                                     Body=chunk)
                    parts.append(_completed_part(number, answer))
                    number += 1
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=full,
                                                  UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
            self.stats["multipart"] += 1
        except BaseException:
            self._abort(full, upload_id)
            raise

    def _abort(self, full: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            self.stats["aborted"] += 1
        except Exception as exc:
            if classify(exc, "AbortMultipartUpload", self.bucket, full).kind == "s3_no_such_upload":
                return
            self.stats["abort_failed"] += 1
            with self._lock:
                self._pending_aborts.append((full, upload_id))

    def _abort_pending(self) -> None:
        with self._lock:
            pending, self._pending_aborts = self._pending_aborts, []
        for full, upload_id in pending:
            self._abort(full, upload_id)

    def _sweep_orphans(self, first_key: str) -> None:
        """Abort uploads a crashed predecessor left for this node.

        Keys are `.../node=<node>/part-<spool>-<offset>.parquet`. Only this process writes
        its spool's keys and it has not uploaded yet, so any upload of `part-<spool>-`
        under our node is an orphan whatever its age; other uploads under our node are
        orphans once older than an hour.
        """
        directory, _, name = first_key.rpartition("/")
        node, spool = node_of(directory), spool_prefix_of(name)

        def orphaned(key: str, age_s: float) -> bool:
            if node is None or f"/{node}/" not in f"/{key}":
                return False
            mine = spool is not None and key.rpartition("/")[2].startswith(spool)
            return mine or age_s >= STALE_UPLOAD_AGE_S

        try:
            self.stats["swept"] += self.abort_stale_multipart_uploads(is_stale=orphaned)
            self._swept = True
        except StoreError as exc:
            self._swept = exc.permanent  # no ListMultipartUploads permission: don't insist
            if exc.kind not in self._sweep_failures:  # once a kind: the upload says the rest
                self._sweep_failures.add(exc.kind)
                log.warning("S3 orphan sweep skipped (%s): %s; it is tried again with the "
                            "next upload", exc.kind, exc)

    def abort_stale_multipart_uploads(
            self, prefix: str = "",
            is_stale: Callable[[str, float], bool] | None = None) -> int:
        """Abort in-progress uploads under `prefix` (relative) that `is_stale(full key,
        age in seconds)` picks; by default those older than an hour. Returns how many."""
        stale = is_stale or (lambda _key, age: age >= STALE_UPLOAD_AGE_S)
        now = dt.datetime.now(dt.UTC)
        aborted = 0
        for upload in self._uploads(self.full_key(prefix) if prefix else self.prefix):
            age = (now - upload["Initiated"]).total_seconds()
            if stale(upload["Key"], age):
                with self.classified("AbortMultipartUpload", upload["Key"]):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                aborted += 1
        return aborted

    def _uploads(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        with self.classified("ListMultipartUploads", full_prefix):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=full_prefix)
            for page in pages:
                yield from page.get("Uploads", [])

    @contextlib.contextmanager
    def classified(self, operation: str, full_key: str) -> Iterator[None]:
        """Turns any boto3/botocore error inside the block into a StoreError."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise classify(exc, operation, self.bucket, full_key) from exc


def _completed_part(number: int, answer: dict[str, Any]) -> dict[str, Any]:
    """The part as CompleteMultipartUpload wants it, with any checksum botocore sent."""
    part: dict[str, Any] = {"ETag": answer["ETag"], "PartNumber": number}
    for name, value in answer.items():
        if name.startswith("Checksum") and name != "ChecksumType" and isinstance(value, str):
            part[name] = value
    return part
