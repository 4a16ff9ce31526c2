"""What an S3 error means for delivery: boto3's and botocore's errors (and local I/O)
mapped to a `StoreError` whose `kind` is a bounded label and whose `permanent` says
whether retrying soon can help (docs/sinks-s3.md, "Errors and what /metrics shows")."""

from __future__ import annotations

from typing import Any, Final

from sinks.parquet.stores import StoreError

_THROTTLED: Final = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestThrottled",
    "TooManyRequests", "TooManyRequestsException", "ServiceUnavailable",
})
_PERMANENT: Final = {
    "NoSuchBucket": "s3_no_such_bucket",
    "InvalidBucketName": "s3_no_such_bucket",
    "AccessDenied": "s3_access_denied",
    "AllAccessDisabled": "s3_access_denied",
    "AccountProblem": "s3_access_denied",
    "InvalidAccessKeyId": "s3_bad_credentials",
    "SignatureDoesNotMatch": "s3_bad_credentials",
    "InvalidToken": "s3_bad_credentials",
    "ExpiredToken": "s3_bad_credentials",
}
# 4xx answers that a later attempt can get past.
_TRANSIENT_4XX: Final = {
    "RequestTimeout": "s3_timeout",
    "RequestTimeTooSkewed": "s3_clock_skew",
    "NoSuchUpload": "s3_no_such_upload",
    "OperationAborted": "s3_conflict",
    "BadDigest": "s3_bad_digest",
    "IncompleteBody": "s3_bad_digest",
}


def classify(exc: Exception, operation: str, bucket: str, key: str) -> StoreError:
    """Map a boto3/botocore (or local I/O) error to a StoreError."""
    from botocore import exceptions as boto

    where = f"{operation} s3://{bucket}/{key}"
    if isinstance(exc, boto.ClientError):
        return _classify_answer(exc.response, where)
    if isinstance(exc, boto.ConnectTimeoutError | boto.ReadTimeoutError):
        return StoreError(f"{where}: timed out", "s3_timeout")
    if isinstance(exc, boto.ConnectionError | boto.HTTPClientError):
        return StoreError(f"{where}: {str(exc)[:200]}", "s3_connect")
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError
                  | boto.CredentialRetrievalError):
        return StoreError(f"{where}: {exc}", "s3_no_credentials", permanent=True)
    if isinstance(exc, OSError):
        return StoreError(f"{where}: {exc.strerror or exc}", "staging_io")
    return StoreError(f"{where}: {type(exc).__name__}: {str(exc)[:200]}", "s3_error")


def _classify_answer(response: dict[str, Any], where: str) -> StoreError:
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    message = f"{where}: {code or status} {str(error.get('Message', ''))[:160]}".rstrip()
    if code in _THROTTLED or status in (429, 503):
        return StoreError(message, "s3_throttled")
    if code in _PERMANENT:
        return StoreError(message, _PERMANENT[code], permanent=True)
    if code in _TRANSIENT_4XX:
        return StoreError(message, _TRANSIENT_4XX[code])
    if status >= 500:
        return StoreError(message, "s3_5xx")
    if status == 403:
        return StoreError(message, "s3_access_denied", permanent=True)
    if status == 404:
        return StoreError(message, "s3_not_found", permanent=True)
    return StoreError(message, "s3_4xx", permanent=True)
