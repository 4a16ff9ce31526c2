"""Fixtures for the query layer: a sample store on disk and a Store over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard.store import Store, StoreOptions
from tests.dashboard.lakegen import Expected, local_put, write_sample_store


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
