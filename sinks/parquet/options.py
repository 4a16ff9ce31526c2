"""The Parquet sink's options and its S3 store's: their defaults, and how a [[sinks]]
table's keys are read into them.

`ParquetOptions` and `S3Options` are the one owner of every default (docs/configuration.md
shows the same); `ParquetOptions.from_table` is the one reading of a table, used by
`evagg run` and `evagg check-config`. The S3 keys are refused, with their name, on a
sink that writes to a local directory: they would do nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from sinks.locations import is_s3_url
from sinks.options import SinkOptionError, at_least, option, optional_text
from sinks.parquet.s3_uploads import upload_args
from sinks.units import parse_bool, parse_positive_duration, parse_positive_size

MIB: Final = 1024 * 1024
# A file closes this long after it opened: on a local directory soon enough that an event
# is in a file, and so in `evagg query`, seconds after it was sent; on S3, where every
# PUT costs, once a minute (docs/sinks-s3.md, "Freshness and cost").
LOCAL_ROLL_INTERVAL_S: Final = 5.0
S3_ROLL_INTERVAL_S: Final = 60.0

# config key -> (field, parser of the TOML value)
_KEYS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "roll_max_bytes": ("roll_max_bytes", parse_positive_size),
    "roll_interval": ("roll_interval_s", parse_positive_duration),
    "row_group_rows": ("row_group_rows", at_least(1)),
    "compact": ("compact", parse_bool),
    "compact_after": ("compact_after_s", parse_positive_duration),
}
_S3_KEYS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "endpoint_url": ("endpoint_url", optional_text),
    "region": ("region", optional_text),
    "path_style": ("path_style", parse_bool),
    "multipart_threshold": ("multipart_threshold", parse_positive_size),
}
UPLOAD_KEYS: Final = ("sse", "sse_kms_key_id", "storage_class")  # -> S3Options.upload_args


@dataclass(frozen=True)
class S3Options:
    """How the sink reaches its bucket. Credentials are never options: they come from
    boto3's own chain (sinks/parquet/s3.py)."""

    endpoint_url: str | None = None  # an S3-compatible store; None: AWS
    region: str | None = None  # None: boto3's chain
    path_style: bool = False
    multipart_threshold: int = 64 * MIB
    # every upload's extra arguments, from sse, sse_kms_key_id, storage_class
    upload_args: Mapping[str, str] = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset({*_S3_KEYS, *UPLOAD_KEYS})

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> S3Options:
        defaults = cls()
        values = {name: option(table, key, getattr(defaults, name), parse)
                  for key, (name, parse) in _S3_KEYS.items()}
        return cls(**values, upload_args=_upload_args(table))


@dataclass(frozen=True)
class ParquetOptions:
    """When the sink's files roll, how their row groups are cut, and whether the hours
    it has moved past are merged; the field defaults are the documented defaults (on S3,
    `from_table` defaults the roll to S3_ROLL_INTERVAL_S)."""

    roll_max_bytes: int = 64 * MIB
    roll_interval_s: float = LOCAL_ROLL_INTERVAL_S
    row_group_rows: int = 10_000
    compact: bool = True  # merge each closed hour's files into one (hour_compaction.py)
    compact_after_s: float = 600.0  # how long after its end an hour is merged
    s3: S3Options = field(default_factory=S3Options)  # the defaults on a local directory

    KEYS: ClassVar[frozenset[str]] = frozenset({*_KEYS, *S3Options.KEYS})

    @classmethod
    def from_table(cls, table: Mapping[str, Any], url: str) -> ParquetOptions:
        """The options of a [[sinks]] table's type-specific keys for a sink writing to
        `url`; raises SinkOptionError naming the key."""
        for key in table:
            if key not in cls.KEYS:
                raise SinkOptionError(key, "is not an option of a parquet sink")
            if key in S3Options.KEYS and not is_s3_url(url):
                raise SinkOptionError(key, "applies to s3:// urls only")
        defaults = cls(roll_interval_s=S3_ROLL_INTERVAL_S) if is_s3_url(url) else cls()
        values = {name: option(table, key, getattr(defaults, name), parse)
                  for key, (name, parse) in _KEYS.items()}
        return cls(**values, s3=S3Options.from_table(table))


def _upload_args(table: Mapping[str, Any]) -> dict[str, str]:
    texts = [option(table, key, None, optional_text) for key in UPLOAD_KEYS]
    try:
        return upload_args(*texts)
    except ValueError as exc:  # the message starts with the option's key
        key, _, reason = str(exc).partition(": ")
        raise SinkOptionError(key, reason) from None
