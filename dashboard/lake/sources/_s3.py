"""Where an S3 store is: one s3:// prefix, its credentials and its listing.

Before each listing the prefix follows rotating credentials (the readers then hand them
on), and it turns S3 errors into the dashboard's own errors. The building blocks
(settings, httpfs, pyarrow filesystem) are dashboard/lake/s3.py.
"""

from __future__ import annotations

import logging
from typing import Any

from dashboard.lake.errors import BadInput, NotFound, StoreUnavailable
from dashboard.lake.listing import Listing, list_s3
from dashboard.lake.s3 import S3Settings, pyarrow_filesystem
from sinks.locations import S3Location, bucket_and_key

log = logging.getLogger("evagg.dashboard.lake")


class S3Prefix:
    """Credentials and client for one s3:// prefix."""

    def __init__(self, location: str, endpoint_url: str | None, region: str | None) -> None:
        try:
            self.location = S3Location.parse(location)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        try:
            import boto3

            self._session = boto3.Session()
        except ImportError:
            raise StoreUnavailable("reading s3:// needs boto3: pip install 'evagg[s3]'") from None
        self._endpoint_url = endpoint_url
        self._region = region
        self.settings = S3Settings.resolve(endpoint_url, region, self._session)
        self.client: Any = self.settings.client()

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def cache_key(self) -> str:
        return f"{self.location.url} {self.settings.endpoint_url or ''}".strip()

    @property
    def base(self) -> str:
        return bucket_and_key(self.location.url)

    def follow(self) -> bool:
        """Temporary credentials rotate: pick up boto3's current ones. True when they
        changed (the reader must be handed them)."""
        fresh = S3Settings.resolve(self._endpoint_url, self._region, self._session)
        if fresh == self.settings:
            return False
        self.settings = fresh
        self.client = fresh.client()
        return True

    def list(self) -> Listing:
        try:
            return list_s3(self.client, self.location.bucket, self.location.prefix)
        except Exception as exc:
            raise _s3_error(exc, self.location) from None

    def filesystem(self) -> Any:
        return pyarrow_filesystem(self.settings)

    def arrow_path(self, path: str) -> str:
        return bucket_and_key(path)


# what a reader can do about each listing failure boto3 raises without an S3 answer
_READER_ADVICE = {
    "NoCredentialsError": "give this command S3 credentials as boto3 finds them "
                          "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an "
                          "instance or pod role)",
    "PartialCredentialsError": "complete the credentials (an access key needs its secret)",
    "EndpointConnectionError": "check --endpoint-url (or AWS_ENDPOINT_URL_S3, or the "
                               "config's endpoint_url) and that the store is up",
    "ConnectTimeoutError": "check --endpoint-url and the network to the store",
}


def _s3_error(exc: Exception, where: S3Location) -> Exception:
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    if code in ("NoSuchBucket", "404"):
        return NotFound(f"bucket {where.bucket} does not exist")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return StoreUnavailable(f"access to {where.url} denied ({code}); reading needs "
                                "s3:ListBucket and s3:GetObject on the prefix, with "
                                "credentials the store accepts")
    said = f"cannot list {where.url}: {type(exc).__name__}: {exc}"
    advice = _READER_ADVICE.get(type(exc).__name__)
    return StoreUnavailable(f"{said}; {advice}" if advice else said)
