"""`evagg dlq list|replay --sink NAME`: an HTTP sink's dead letters, listed or sent again
with the sink's own options (headers, TLS, proxy, gzip), as the agent would send them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.cli.arguments import Parsers

if TYPE_CHECKING:
    from aggregator.config import AgentConfig
    from aggregator.config.sinks import SinkConfig
    from sinks.http.deadletter import DeadLetter
    from sinks.http.replay import ReplayReport


def add_dlq_parser(commands: Parsers) -> None:
    dlq = commands.add_parser("dlq", help="list or replay an HTTP sink's dead letters")
    dlq.add_argument("action", choices=["list", "replay"])
    dlq.add_argument("--sink", required=True, help="the HTTP sink's name in the config")
    dlq.add_argument("--config", type=Path, help="TOML file (default: $EVAGG_CONFIG or none)")
    dlq.add_argument("--url", help="replay to this URL instead of the sink's configured one")
    dlq.set_defaults(command=_dlq)


def _no_such_sink(name: str, config: AgentConfig, action: str) -> str:
    """Why `--sink NAME` names nothing, and what to pass instead."""
    http = [s.name for s in config.sinks if s.type == "http"]
    if config.source_path is None:
        return (f"no http sink named {name!r}: no config was given (--config or "
                "$EVAGG_CONFIG), and the embedded default has no http sink; pass the config "
                f"the agent runs with: evagg dlq {action} --sink {name} --config FILE")
    named = f"its http sinks: {', '.join(http)}" if http else "it has no http sink"
    return f"no http sink named {name!r} in {config.source_path} ({named})"


def _dlq(args: argparse.Namespace) -> int:
    import asyncio

    from aggregator.config import ConfigError, load_config
    from aggregator.config.sinks import sink_name_problem
    from aggregator.delivery.build import sink_problem
    from sinks.http.deadletter import dead_letter_dir, list_dead_letters
    from sinks.http.endpoint import url_for_display
    from sinks.http.replay import replay_dead_letters

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"evagg dlq: config error: {exc}", file=sys.stderr)
        return 2
    named = sink_name_problem(args.sink)
    if named:
        print(f"evagg dlq: --sink {named}", file=sys.stderr)
        return 2
    sink = next((s for s in config.sinks if s.name == args.sink and s.type == "http"), None)
    directory = dead_letter_dir(config.state_dir, args.sink)
    # `evagg status` and the agent's log name `evagg dlq list --sink NAME` without the
    # agent's config: with no config the letters are still found in the default state_dir
    # (the agent's too, unless its config moves it), and anything else says what to pass.
    listed_without_sink = (sink is None and config.source_path is None
                           and args.action == "list" and directory.is_dir())
    if sink is None and not listed_without_sink:
        print(f"evagg dlq: {_no_such_sink(args.sink, config, args.action)}", file=sys.stderr)
        return 2
    if args.action == "list":  # needs none of the sending options (keys, proxy, headers)
        letters = list_dead_letters(directory)
        for letter in letters:
            print(dead_letter_line(letter))
        events = sum(letter.events for letter in letters)
        print(f"{len(letters)} dead-lettered batches ({events} events) in {directory}")
        if letters:
            config_flag = " --config <the agent's config>" if sink is None else ""
            print(f"`evagg dlq replay --sink {args.sink}{config_flag}` sends them again "
                  "(--url to send them elsewhere)")
        return 0
    assert sink is not None
    url = args.url or sink.url
    try:
        sending = _replay_options(sink, url)
    except ValueError as exc:  # refused as `evagg check-config` and `evagg run` refuse it
        index = config.sinks.index(sink)
        print(f"evagg dlq: config error: {sink_problem(index, sink, exc)}", file=sys.stderr)
        return 2
    report = asyncio.run(replay_dead_letters(directory, url, **sending))
    if report.events_sent or not report.failed:  # pieces of a split letter count too
        print(f"sent {_batches_sent(report)} ({report.events_sent} events) to "
              f"{url_for_display(url)}; their files are deleted")
    if report.split:
        print(f"{report.split} requests refused as too large (HTTP 413) were sent again in "
              "halves")
    if report.failed:
        config_flag = f" --config {args.config}" if args.config else ""
        _say_replay_failures(report, directory, f"--sink {args.sink}{config_flag}")
    return 0 if not report.failed else 1


def _batches_sent(report: ReplayReport) -> str:
    """`3 batches`, or with letters the endpoint took only pieces of, `3 batches and part
    of 1 more` (the pieces left are letters of their own, listed on stderr)."""
    whole = f"{report.sent} batches"
    if not report.partly:
        return whole
    left = "(the pieces left stay as letters of their own)"
    if not report.sent:
        part = "batch" if report.partly == 1 else "batches"
        return f"part of {report.partly} {part} {left}"
    return f"{whole} and part of {report.partly} more {left}"


def _say_replay_failures(report: ReplayReport, directory: Path, sink_flags: str) -> None:
    """On stderr: which letters stay, why each (the endpoint's answer, or what failed
    here), and what to do next."""
    print(f"evagg dlq replay: {report.failed} batches failed and stay in {directory}:",
          file=sys.stderr)
    for error in report.errors:
        print(f"  {error}", file=sys.stderr)
    print(f"fix what the endpoint refuses (each letter's first answer: `evagg dlq list "
          f"{sink_flags}`), or send them elsewhere with --url; then replay again",
          file=sys.stderr)


def dead_letter_line(letter: DeadLetter) -> str:
    """One dead letter as an operator reads it: when, the answer, how many, the key."""
    response = " ".join(letter.response.split())
    response = response if len(response) <= 60 else response[:59] + "…"
    return (f"{letter.time}  HTTP {letter.status}  {letter.events} events  key {letter.key}  "
            f"{letter.url}  {response!r}")


def _replay_options(sink: SinkConfig, url: str) -> dict[str, Any]:
    """What a replay sends with: the sink's own options, read as the agent reads them."""
    from sinks.http.options import HttpOptions, check_url
    from sinks.http.proxy import proxy_route
    from sinks.http.tls import client_ssl

    options = HttpOptions.from_table(sink.options)
    check_url(url, options)
    return {"headers": dict(options.headers), "gzip": options.gzip,
            "timeout_s": options.timeout_s, "ssl": client_ssl(options.tls),
            "proxy": proxy_route(url, options.proxy)}
