"""The overview's timeline of compacted files whose task fragments are read in place
(dashboard/lake/fold_place.py): a first open does not count it (no `evagg query` reads it),
the dashboard's overview reads it from the files until the copy counts it into the cache,
and the overview's JSON is the same before the copy, after it, and as over every raw event.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dashboard.lake import fold_place
from dashboard.lake.store import Store, StoreOptions
from dashboard.questions.overview import overview
from sinks.parquet.layout import compacted_name, encode_covers, parse_covers
from tests.dashboard.fold_checks import assert_same
from tests.dashboard.serve import serving
from tests.split_task_lake import write_merged_lake


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return write_merged_lake(tmp_path / "lake")


def cached(lake: Path, cache: Path, **options: Any) -> Store:
    return Store(StoreOptions(str(lake), refresh_s=0.0, cache_dir=str(cache), **options))


def scratch(lake: Path) -> Store:
    return Store(StoreOptions(str(lake), refresh_s=0.0, fold=False))


def counted(store: Store) -> dict[str, int]:
    """The timeline rows kept in the cache, the fragments read in place, and the rows
    `event_timeline` shows."""
    found = store.execute(
        "SELECT (SELECT count(*) FROM fold.timeline), (SELECT count(*) FROM fold.placed), "
        "(SELECT count(*) FROM event_timeline)", views=False).rows[0]
    return dict(zip(("kept", "placed", "shown"), found, strict=True))


def overview_json(store: Store) -> Any:
    """GET /api/overview of a dashboard serving `store`, as the browser reads it; the
    dashboard closes the store when it stops."""
    with serving(store) as url, urllib.request.urlopen(f"{url}/api/overview",
                                                       timeout=60) as response:
        return json.loads(response.read())


def test_a_first_open_leaves_the_timeline_to_the_copy(lake: Path, tmp_path: Path) -> None:
    reference = scratch(lake)
    expected = overview_json(scratch(lake))
    assert expected["timeline"] and expected["events"] > 0
    store = cached(lake, tmp_path / "cache")
    store.refresh(views=False)
    shown = counted(store)["shown"]
    assert counted(store) == {"kept": 0, "placed": 4, "shown": shown} and shown > 0
    assert overview(store) == overview(reference)  # read from the compacted files
    assert counted(store)["kept"] == 0  # reading it counted nothing into the cache
    # the dashboard's request; its close copies the fragments' rows and the timeline
    assert overview_json(store) == expected
    again = cached(lake, tmp_path / "cache")
    assert counted(again) == {"kept": shown, "placed": 0, "shown": shown}
    assert again.fold is not None and again.fold.rebuilds == 0
    assert overview_json(again) == expected
    reference.close()


def test_a_dashboard_shows_the_timeline_before_and_after_its_copy(lake: Path,
                                                                  tmp_path: Path) -> None:
    reference = scratch(lake)
    expected = overview(reference)
    store = cached(lake, tmp_path / "cache", persist_in_background=True)
    assert overview(store) == expected  # its first request: the copy may be running
    assert store._persister is not None
    store._persister.join(timeout=60)
    assert counted(store)["placed"] == 0 and counted(store)["kept"] > 0
    assert overview(store) == expected
    assert overview_json(store) == overview_json(reference)
    again = cached(lake, tmp_path / "cache")
    assert overview(again) == expected
    again.close()


def test_the_timeline_is_whole_between_the_copy_and_the_views_made_again(
        lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard's copy runs in a thread: a request between its commit and the views
    made again over no fragments reads neither a file's events twice nor none of them."""
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    assert store.fold is not None
    monkeypatch.setattr(fold_place, "bind", lambda cur, source: store.fold.placed if
                        store.fold else 0)
    assert store.persist_fold() == 4
    assert counted(store)["placed"] == 0 and counted(store)["kept"] > 0
    assert overview(store) == overview(reference)
    for s in (store, reference):
        s.close()


def test_a_compacted_file_read_in_place_merged_again_rebuilds_the_fold(
        lake: Path, tmp_path: Path) -> None:
    """A compacted file whose fragment is read in place, replaced by one that covers it
    (its rows are all folded, so the new file is not read): its timeline, not counted yet,
    is read again by a rebuild."""
    store, reference = cached(lake, tmp_path / "cache"), scratch(lake)
    assert_same(store, reference)
    first = sorted(lake.glob("date=*/hour=*/node=*/compacted-*.parquet"))[0]
    table = pq.read_table(first)
    covers = parse_covers((table.schema.metadata or {}).get(b"evagg.compacted"))
    replacement = first.with_name(compacted_name([first.name, "again"]))
    meta = encode_covers([first.name], covers | {(first.name, first.stat().st_size)})
    pq.write_table(table.replace_schema_metadata(meta), replacement)
    first.unlink()
    assert_same(store, reference)
    assert store.fold is not None and store.fold.rebuilds == 1
    for s in (store, reference):
        s.close()
