"""The sink option defaults docs/configuration.md shows are the options classes' own:
every key of a sink type is in its table, and each documented default, written in a
config as a user would write it, reads back as the options of a table without it."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from sinks.http.options import HttpOptions
from sinks.parquet.options import ParquetOptions
from tests.agentproc import REPO

DOC = REPO / "docs" / "configuration.md"
# sink type -> (the keys it takes, the reading of a table's options)
READERS: dict[str, tuple[frozenset[str], Callable[[dict[str, Any]], object]]] = {
    "http": (HttpOptions.KEYS, HttpOptions.from_table),
    # on S3, where every parquet key applies
    "parquet": (ParquetOptions.KEYS, lambda t: ParquetOptions.from_table(t, "s3://b/p/")),
}


def documented_defaults(sink_type: str) -> dict[str, str]:
    """key -> the default cell of the table under `### type = "<sink_type>"`."""
    lines = DOC.read_text().splitlines()
    start = lines.index(f'### type = "{sink_type}"')
    cells: dict[str, str] = {}
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(row) >= 2 and row[0] != "key" and set(row[0]) != {"-"}:
            cells[row[0]] = row[1]
    return cells


def toml_value(cell: str) -> tuple[bool, Any]:
    """(True, value) for a cell such as `"4MiB"`; (False, None) for prose such as "none"."""
    if not (cell.startswith("`") and cell.endswith("`")):
        return False, None
    return True, tomllib.loads(f"value = {cell[1:-1]}")["value"]


@pytest.mark.parametrize("sink_type", sorted(READERS))
def test_every_option_is_documented(sink_type: str) -> None:
    keys, _ = READERS[sink_type]
    assert set(documented_defaults(sink_type)) - {"url"} == keys


@pytest.mark.parametrize("sink_type", sorted(READERS))
def test_each_documented_default_is_the_default(sink_type: str) -> None:
    _, read = READERS[sink_type]
    defaults = read({})
    checked = []
    for key, cell in documented_defaults(sink_type).items():
        is_value, value = toml_value(cell)
        if is_value:
            assert read({key: value}) == defaults, f"docs say {key} = {cell[1:-1]}"
            checked.append(key)
    assert len(checked) >= 4  # the table was read, not skipped


def test_the_row_group_default_is_the_documented_ten_thousand() -> None:
    assert ParquetOptions().row_group_rows == 10_000
    assert documented_defaults("parquet")["row_group_rows"] == "`10000`"


def test_a_local_lake_rolls_in_seconds_and_s3_once_a_minute() -> None:
    """docs/configuration.md: a local file closes 5 s after it opened, so an event is in
    `evagg query` within seconds; on S3, where every PUT costs, once a minute."""
    assert ParquetOptions.from_table({}, "/var/lib/evagg/parquet").roll_interval_s == 5.0
    assert ParquetOptions.from_table({}, "s3://lake/evagg/").roll_interval_s == 60.0
    assert ParquetOptions.from_table({"roll_interval": "2m"}, "/data").roll_interval_s == 120.0
    assert "on a local directory it is `\"5s\"`" in DOC.read_text()
