"""The store's source objects: one per way of reading, each answering what the store asks."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from dashboard.lake.errors import BadInput, NotFound
from dashboard.lake.listing import FileEntry
from dashboard.lake.sources import open_source
from sinks.locations import bucket_and_key


def test_a_local_directory_is_read_by_duckdb_or_by_pyarrow(tmp_path: Path) -> None:
    con = duckdb.connect()
    entry = FileEntry(str(tmp_path / "a.parquet"), "a.parquet", 1, "1")
    for engine, expected in (("auto", "local"), ("httpfs", "local"), ("pyarrow", "pyarrow")):
        source = open_source(str(tmp_path), None, None, engine, con)
        assert source.engine == expected and source.note == ""
        assert source.cache_key == str(tmp_path.resolve())
        assert source.base == str(tmp_path)
        assert source.path(entry) == entry.path
        assert source.list().files == ()
        assert source.follow_credentials(con) is False


def test_a_local_source_says_what_is_wrong_with_its_directory(tmp_path: Path) -> None:
    con = duckdb.connect()
    with pytest.raises(NotFound):
        open_source(str(tmp_path / "missing"), None, None, "auto", con)
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput):
        open_source(str(tmp_path / "file"), None, None, "auto", con)


def test_the_s3_prefix_is_cut_in_one_place() -> None:
    assert bucket_and_key("s3://bucket/some/key.parquet") == "bucket/some/key.parquet"
    with pytest.raises(ValueError, match="not an S3 URL"):
        bucket_and_key("/local/key.parquet")
