"""`evagg query artifacts` and `evagg query artifact NAME --out FILE`: the files the agents
shipped from their `[[files]]` directories (profiler traces, NCCL flight-recorder dumps),
listed from their index events and fetched byte for byte from the lake."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from dashboard.lake.errors import BadInput
from dashboard.lake.results import Result
from dashboard.lake.store import Store
from dashboard.questions import artifacts

Adder = Callable[[str, str, Callable[[Store, argparse.Namespace], Result]],
                 argparse.ArgumentParser]


def add_artifacts_parser(add: Adder) -> None:
    listing = add("artifacts", "files shipped from [[files]] directories: traces, dumps",
                  _list)
    listing.add_argument("--run", "--run-id", dest="run", help="only this run's")
    one = add("artifact", "write one shipped file (its newest version) to --out", _fetch)
    one.add_argument("name", help="the name `evagg query artifacts` shows, or its last part")
    one.add_argument("--version", type=int, help="this version instead of the newest")
    one.add_argument("--node", help="the node that shipped it, when names repeat")
    one.add_argument("--out", required=True, help="the file to write")


def _list(store: Store, args: argparse.Namespace) -> Result:
    return artifacts.artifacts(store, run=args.run)


def _fetch(store: Store, args: argparse.Namespace) -> Result:
    if args.version is not None and args.version < 1:
        raise BadInput("--version: versions count from 1")
    row = artifacts.choose(store, args.name, args.version, args.node)
    out = Path(args.out)
    try:
        artifacts.save(store.options, row, out)
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    shown = ("name", "version", "size_bytes", "sha256", "node_id")
    return Result([*shown, "out"], [[*(row[c] for c in shown), str(out)]])
