"""What every S3 upload asks for besides its bytes: server-side encryption (the sink's
`sse` and `sse_kms_key_id`) and the storage class (`storage_class`); `evagg compact`
takes the same as flags.

A bucket with default encryption needs no `sse`; a bucket policy may refuse uploads that
do not ask for it (`s3:x-amz-server-side-encryption`), and "aws:kms" without a key id
means the AWS-managed `aws/s3` key, which other accounts cannot use. Only classes whose
objects can be read at once are taken: the lake is there to be queried, and a Glacier
object must be restored first (archive old partitions with a lifecycle rule instead).
"""

from __future__ import annotations

from typing import Final

SSE_MODES: Final = ("AES256", "aws:kms", "aws:kms:dsse")
READABLE_CLASSES: Final = ("STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
                           "GLACIER_IR")
ARCHIVE_CLASSES: Final = ("GLACIER", "DEEP_ARCHIVE")


def upload_args(sse: str | None = None, kms_key_id: str | None = None,
                storage_class: str | None = None) -> dict[str, str]:
    """PutObject's and CreateMultipartUpload's extra arguments. Raises ValueError whose
    message starts with the option's name."""
    return {**encryption_args(sse, kms_key_id), **storage_class_args(storage_class)}


def encryption_args(sse: str | None, kms_key_id: str | None) -> dict[str, str]:
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


def storage_class_args(storage_class: str | None) -> dict[str, str]:
    if storage_class is None:
        return {}
    if storage_class in ARCHIVE_CLASSES:
        raise ValueError(f"storage_class: {storage_class} objects must be restored before "
                         "DuckDB can read them; archive old partitions with a lifecycle rule")
    if storage_class not in READABLE_CLASSES:
        raise ValueError(f"storage_class: {storage_class!r} is not one of "
                         f"{', '.join(READABLE_CLASSES)}")
    return {"StorageClass": storage_class}
