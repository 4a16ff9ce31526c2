"""`[[files]]`: directories whose finished files the agent ships into the lake once each
(docs/configuration.md, "Files"; the worker is aggregator/artifacts/)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aggregator.config.values import check_keys
from sinks.units import parse_positive_duration

FILES_KEYS: Final = {"path", "kind", "run_id", "job_id", "settle"}
DEFAULT_SETTLE: Final = "5s"  # unchanged this long (and open for writing nowhere): finished
KNOWN_KINDS: Final = ("torch_trace", "nccl_flight_recorder")  # any other text is allowed too


@dataclass(frozen=True, slots=True)
class WatchedFiles:
    """One `[[files]]` table: a directory and what its files are."""

    path: Path
    kind: str  # what the files are: torch_trace, nccl_flight_recorder or the user's words
    run_id: str | None = None  # None: the first directory level below `path`, if any
    job_id: str | None = None
    settle_s: float = 5.0


def parse_files(raw: Any, problems: list[str]) -> tuple[WatchedFiles, ...]:
    """Every `[[files]]` table; each problem names `files[i].key` and what to write."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append("files: must be an array of tables ([[files]] with path and kind)")
        return ()
    watched = []
    for index, table in enumerate(raw):
        label = f"files[{index}]"
        if not isinstance(table, dict):
            problems.append(f"{label}: must be a table with path and kind")
            continue
        check_keys(table, FILES_KEYS, f"{label}.", problems)
        parsed = _one(table, label, problems)
        if parsed is not None:
            watched.append(parsed)
    _no_overlap(watched, problems)
    return tuple(watched)


def _one(table: dict[str, Any], label: str, problems: list[str]) -> WatchedFiles | None:
    path, kind = table.get("path"), table.get("kind")
    bad = len(problems)
    if not isinstance(path, str) or not path or not Path(path).expanduser().is_absolute():
        problems.append(f"{label}.path: give the absolute path of the directory to watch, "
                        "e.g. path = \"/var/tmp/traces\"")
    if not isinstance(kind, str) or not kind.strip():
        problems.append(f"{label}.kind: say what the files are: {', '.join(KNOWN_KINDS)} or "
                        "words of your own")
    ids = {}
    for key in ("run_id", "job_id"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            problems.append(f"{label}.{key}: must be a non-empty string, or left out")
        ids[key] = value if isinstance(value, str) and value else None
    try:
        settle_s = parse_positive_duration(table.get("settle", DEFAULT_SETTLE))
    except (ValueError, TypeError) as exc:
        problems.append(f"{label}.settle: {exc}")
        settle_s = parse_positive_duration(DEFAULT_SETTLE)
    if len(problems) > bad:
        return None
    assert isinstance(path, str) and isinstance(kind, str)
    return WatchedFiles(Path(path).expanduser(), kind.strip(), ids["run_id"], ids["job_id"],
                        settle_s)


def _no_overlap(watched: list[WatchedFiles], problems: list[str]) -> None:
    """A file is shipped by one table only: no directory may lie inside another's."""
    for index, one in enumerate(watched):
        for other in watched[index + 1:]:
            if one.path == other.path or one.path in other.path.parents \
                    or other.path in one.path.parents:
                problems.append(f"files: {one.path} and {other.path} overlap; a file would "
                                "be shipped twice: watch each directory in one table only")


def files_warnings(watched: tuple[WatchedFiles, ...], sink_types: list[str]) -> list[str]:
    """What `check-config` says of `[[files]]` tables that will ship nothing (yet)."""
    if watched and "parquet" not in sink_types:
        return ["files: no Parquet sink to keep the watched files in, so none is shipped; "
                "add a [[sinks]] table of type \"parquet\" (a directory or s3://)"]
    return [f"files[{index}].path: {one.path} does not exist yet; its files are shipped "
            "once it does" for index, one in enumerate(watched) if not one.path.is_dir()]
