"""A real moto S3 server on 127.0.0.1 for tests: start, stop (an outage), restart.

moto keeps its buckets and objects in module-level backends of this process, so a
ThreadedMotoServer stopped and started again on the same port serves the same state, as
S3 would after a network outage. `stop()` also closes the listening socket and every open
keep-alive connection, so clients see refused connections, not a hang.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import logging
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import duckdb
from botocore.config import Config
from moto import settings
from moto.server import ThreadedMotoServer

from tests.ports import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
ALLOW_S3 = json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})


def aws_env() -> dict[str, str]:
    """What boto3's standard chain (and a subprocess agent) needs to reach moto."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


def httpfs_extension() -> str:
    """The httpfs build the `duckdb-extension-httpfs` package ships for this duckdb."""
    import duckdb_extension_httpfs  # type: ignore[import-untyped]

    root = importlib.resources.files(duckdb_extension_httpfs) / "extensions"
    return str(root / f"v{duckdb.__version__}" / "httpfs.duckdb_extension")


class MotoS3:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.part_delay_s = 0.0  # UploadPart requests wait this long (an upload in flight)
        # cleared: every PUT of an object waits (a store or proxy that takes the request and
        # never answers), until set again or a minute has passed
        self.object_puts_answered = threading.Event()
        self.object_puts_answered.set()
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        logging.getLogger("werkzeug").setLevel(logging.ERROR)

    def start(self) -> MotoS3:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._instrument(server)
        self._server = server
        return self

    def _instrument(self, server: ThreadedMotoServer) -> None:
        """Track connections (to cut them) and delay part uploads on request."""
        wsgi: Any = server._server  # the werkzeug server; moto exposes no hook for this
        handle, app = wsgi.process_request, wsgi.app

        def tracked(request: socket.socket, client_address: Any) -> None:
            with self._lock:
                self._connections.add(request)
            handle(request, client_address)

        def slowed(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("REQUEST_METHOD") == "PUT" and "partNumber=" in environ.get(
                    "QUERY_STRING", ""):
                time.sleep(self.part_delay_s)
            if environ.get("REQUEST_METHOD") == "PUT" and "/" in environ.get(
                    "PATH_INFO", "").strip("/"):  # an object's key, not a bucket's creation
                self.object_puts_answered.wait(60)
            return app(environ, start_response)

        wsgi.process_request = tracked
        wsgi.app = slowed

    def hang_object_puts(self, hang: bool = True) -> None:
        """PUTs of objects are taken and not answered (until called with False)."""
        if hang:
            self.object_puts_answered.clear()
        else:
            self.object_puts_answered.set()

    def stop(self) -> None:
        """An outage: the port refuses connections and open ones are cut."""
        if self._server is None:
            return
        self._server.stop()
        wsgi: Any = self._server._server
        wsgi.server_close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    def reset(self) -> None:
        """Forget every bucket (moto's own reset route)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def client(self, service: str = "s3", **credentials: str) -> Any:
        """A client of its own (made once per service and credentials: making one costs
        a few hundred milliseconds)."""
        cache_key = (service, tuple(sorted(credentials.items())))
        if cache_key not in self._clients:
            self._clients[cache_key] = self._make_client(service, **credentials)
        return self._clients[cache_key]

    def _make_client(self, service: str, **credentials: str) -> Any:
        config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1})
        return boto3.session.Session().client(
            service, endpoint_url=self.endpoint_url, region_name=REGION, config=config,
            aws_access_key_id=credentials.get("access_key", ACCESS_KEY),
            aws_secret_access_key=credentials.get("secret_key", SECRET_KEY))

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"evagg-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def open_uploads(self, bucket: str) -> list[dict[str, Any]]:
        uploads: list[dict[str, Any]] = self.client().list_multipart_uploads(
            Bucket=bucket).get("Uploads", [])
        return uploads

    def duckdb(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection that reads s3:// from this server."""
        con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                     "autoload_known_extensions": False})
        con.execute(f"LOAD '{httpfs_extension()}'")
        con.execute(f"SET s3_endpoint = '127.0.0.1:{self.port}'; SET s3_url_style = 'path'; "
                    f"SET s3_use_ssl = false; SET s3_region = '{REGION}'; "
                    f"SET s3_access_key_id = '{ACCESS_KEY}'; "
                    f"SET s3_secret_access_key = '{SECRET_KEY}'")
        return con

    @contextlib.contextmanager
    def enforcing_auth(self) -> Iterator[dict[str, dict[str, str]]]:
        """moto checks signatures and IAM policies inside the block.

        Yields credentials by name: "allowed" (s3:* allowed), "denied" (no policy).
        """
        iam = self.client("iam")
        made: dict[str, dict[str, str]] = {}
        for name in ("allowed", "denied"):
            user = f"evagg-{name}-{uuid.uuid4().hex[:8]}"
            iam.create_user(UserName=user)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            if name == "allowed":
                iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=ALLOW_S3)
            made[name] = {"access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}
        previous = settings.INITIAL_NO_AUTH_ACTION_COUNT
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        try:
            yield made
        finally:
            settings.INITIAL_NO_AUTH_ACTION_COUNT = previous
