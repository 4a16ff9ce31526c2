"""`evagg query traces` and `evagg query trace ID`: the traces in the lake (OpenTelemetry
spans, and the ops that ran inside them), newest first, and one trace as a tree, each
span under its parent, as the dashboard's trace page draws it."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from dashboard.lake.errors import BadInput
from dashboard.lake.results import Result
from dashboard.lake.store import Store
from dashboard.questions import queries

Adder = Callable[[str, str, Callable[[Store, argparse.Namespace], Result]],
                 argparse.ArgumentParser]
TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")  # as `evagg export-traces --trace-id` takes one
INDENT = "  "  # a span's name is indented this much per parent above it
TREE_COLUMNS = ("offset_ms", "duration_s", "name", "state", "service", "error_type",
                "error_message", "span_id", "parent_span_id", "node_id")


def add_traces_parser(add: Adder) -> None:
    listing = add("traces", "traces, newest first: root span, spans, failures, duration",
                  _list)
    listing.add_argument("--limit", type=int, default=100,
                         help="at most this many traces (default 100; at most 100000)")
    one = add("trace", "one trace's spans as a tree: each under its parent, in start order",
              _tree)
    one.add_argument("trace_id", help="the trace id `evagg query traces` shows")


def _list(store: Store, args: argparse.Namespace) -> Result:
    if not 1 <= args.limit <= 100_000:
        raise BadInput("--limit must be 1..100000")
    return queries.traces(store, args.limit)


def _tree(store: Store, args: argparse.Namespace) -> Result:
    trace_id = args.trace_id.strip()
    if not TRACE_ID.match(trace_id) or not trace_id.strip("0"):  # bad input, not "no spans"
        raise BadInput(f"{args.trace_id[:80]!r} is not a trace id: one is 32 hex digits, "
                       "not all zero, as in the trace_id column or a traceparent's second part")
    spans = queries.trace(store, trace_id).records()
    rows = [[_indented(span, depth) if c == "name" else span.get(c) for c in TREE_COLUMNS]
            for span, depth in depth_first(spans)]
    return Result(list(TREE_COLUMNS), rows)


def depth_first(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each span after its parent, children in start order (as `spans` comes); a span whose
    parent is not in the trace (not exported, or still running) starts a tree of its own."""
    ids = {span["span_id"] for span in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span["parent_span_id"]
        children.setdefault(parent if parent in ids else None, []).append(span)
    ordered: list[tuple[dict[str, Any], int]] = []
    stack = [(span, 0) for span in reversed(children.get(None, []))]
    while stack:
        span, depth = stack.pop()
        ordered.append((span, depth))
        stack += [(child, depth + 1) for child in reversed(children.get(span["span_id"], []))]
    return ordered


def _indented(span: dict[str, Any], depth: int) -> str:
    return INDENT * depth + str(span["name"] or "")
