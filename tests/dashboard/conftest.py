"""Fixtures for the query layer: a sample store on disk and a Store over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.dashboard.lakegen import Expected, local_put, write_sample_store


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`evagg query` and `evagg dashboard` keep their task cache here, not in ~/.cache."""
    folder = tmp_path / "evagg-cache"
    monkeypatch.setenv("EVAGG_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    root.mkdir()
    write_sample_store(local_put(root))
    return root


@pytest.fixture
def expected(lake: Path) -> type[Expected]:
    return Expected


@pytest.fixture
def store(lake: Path) -> Iterator[Store]:
    opened = Store(StoreOptions(str(lake), refresh_s=0.0))
    yield opened
    opened.close()
