"""Where data lives and who may be reached: the one reading of an `s3://` URL and of a
loopback host, for the sinks, the agent's config, `evagg compact` and the dashboard."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

S3_SCHEME: Final = "s3://"


def is_s3_url(location: str) -> bool:
    """Whether a data location names S3 (anything else is a local directory)."""
    return location.startswith(S3_SCHEME)


def no_such_lake(location: str) -> str:
    """What every reading command says of a local lake that is not there."""
    return (f"data directory {location} does not exist: give the agent's config with "
            "--config FILE (its Parquet sink's url is read), or the lake with --data DIR or "
            "s3://bucket/prefix (or $EVAGG_DATA)")


def redacted_endpoint(endpoint_url: str) -> str:
    """The endpoint without any user:password part, for logs and printed text."""
    parts = urlsplit(endpoint_url)
    host = parts.hostname or ""
    return parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()


def bucket_and_key(url: str) -> str:
    """`s3://bucket/some/key` -> `bucket/some/key`: the path pyarrow's S3FileSystem opens.

    Raises ValueError for anything that is not an `s3://` URL."""
    if not is_s3_url(url):
        raise ValueError(f"not an S3 URL: {url!r} (expected s3://bucket/key)")
    return url[len(S3_SCHEME):]


@dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @staticmethod
    def parse(url: str) -> S3Location:
        """`s3://bucket/some/prefix` -> S3Location("bucket", "some/prefix/").

        Raises ValueError, saying what was expected, for anything that is not one."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an S3 URL: {url!r} (expected s3://bucket/prefix/)")
        prefix = parts.path.strip("/")
        return S3Location(parts.netloc, f"{prefix}/" if prefix else "")

    @property
    def url(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"


def is_loopback_host(host: str) -> bool:
    """Whether a host is this machine for certain: `localhost` (and `*.localhost`, which
    RFC 6761 reserves for it) or a loopback address. Any other name may resolve anywhere."""
    name = host.lower().strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_header_trusted(header: str | None, listen_host: str) -> bool:
    """Whether a request with this Host header may be answered by a server listening on
    `listen_host`. A server on loopback answers only names of this machine (loopback
    names and addresses, the listen host, the machine's own host name): a web page whose
    own name an attacker re-pointed at 127.0.0.1 (DNS rebinding) sends that name, and is
    refused. A server listening where other hosts reach it was opened on purpose: any
    name. A request without a Host header (HTTP/1.0) is no browser's."""
    if header is None or not is_loopback_host(listen_host):
        return True
    try:
        name = urlsplit(f"//{header}").hostname or ""
    except ValueError:  # a malformed port or bracket
        return False
    own = {listen_host.lower().strip("[]"), socket.gethostname().lower()}
    return is_loopback_host(name) or name in own
