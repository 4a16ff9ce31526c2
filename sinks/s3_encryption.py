"""Server-side encryption that every S3 upload asks for: the sink's `sse` and
`sse_kms_key_id` options, and `evagg compact --sse`.

A bucket with default encryption needs neither; a bucket policy may refuse uploads that
do not ask (`s3:x-amz-server-side-encryption`), and "aws:kms" without a key id means the
AWS-managed `aws/s3` key, which other accounts cannot use.
"""

from __future__ import annotations

from typing import Final

SSE_MODES: Final = ("AES256", "aws:kms", "aws:kms:dsse")


def encryption_args(sse: str | None, kms_key_id: str | None) -> dict[str, str]:
    """PutObject's and CreateMultipartUpload's encryption arguments. Raises ValueError
    whose message starts with the option's name."""
    if sse is not None and sse not in SSE_MODES:
        raise ValueError(f"sse: {sse!r} is not one of {', '.join(SSE_MODES)}")
    if kms_key_id is not None and not kms_key_id.strip():
        raise ValueError("sse_kms_key_id: is empty (leave it out for the aws/s3 key)")
    if kms_key_id is not None and not (sse or "").startswith("aws:kms"):
        raise ValueError('sse_kms_key_id: needs sse = "aws:kms" (or "aws:kms:dsse")')
    args = {"ServerSideEncryption": sse} if sse else {}
    if kms_key_id:
        args["SSEKMSKeyId"] = kms_key_id
    return args
