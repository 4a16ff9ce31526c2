"""Commands that talk to a running agent's HTTP port: `evagg tail`, `evagg status`
(`evagg emit`, which uses its socket, is in emit.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from aggregator.cli.arguments import Parsers
from aggregator.cli.status import format_status, parse_metrics
from emitters.fields import KINDS


class NoAgentUrl(Exception):
    """The agent's HTTP address cannot be known: a config error, or its port is off."""


def agent_url(explicit: str | None, config: Path | None = None) -> str:
    """--url, else the agent's http_listen from the sources `evagg run` reads: --config
    or $EVAGG_CONFIG, then $EVAGG_HTTP_LISTEN, else the default."""
    listen = explicit
    if not listen:
        from aggregator.config import ConfigError, configured_http_listen

        try:
            listen = configured_http_listen(config)
        except ConfigError as exc:
            # A running agent keeps the file it read at start or at its last applied
            # reload (a refused one leaves it running), so it can still be asked.
            raise NoAgentUrl(f"config error: {exc}; to ask a running agent anyway, pass "
                             "--url with its http_listen (e.g. --url 127.0.0.1:4040)") from None
        if not listen:
            raise NoAgentUrl("the agent's HTTP port is disabled (http_listen = \"\"); "
                             "pass --url")
    return listen if listen.startswith("http") else f"http://{listen}"


def _add_address_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="agent HTTP address (default: the agent's http_listen)")
    parser.add_argument("--config", type=Path,
                        help="the agent's TOML file, for its http_listen "
                             "(default: $EVAGG_CONFIG or none; $EVAGG_HTTP_LISTEN wins)")


def cannot_reach(command: str, url: str,
                 exc: urllib.error.URLError | ConnectionError | TimeoutError) -> str:
    """Why `command` got no answer from the agent at `url`, and what to do, in words."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        why = "nothing answers there (connection refused)"
    elif isinstance(reason, TimeoutError):
        why = ("it did not answer in time (an agent that takes connections and does not "
               "answer is stopped or wedged: look at its process and its log)")
    else:
        why = getattr(reason, "strerror", None) or str(reason)
    return (f"evagg {command}: cannot reach the agent at {url}: {why}; start one with "
            "`evagg run`, or point --url (or --config) at the agent's http_listen")


# -- tail ------------------------------------------------------------------------------------

def add_tail_parser(commands: Parsers) -> None:
    tail = commands.add_parser("tail", help="follow events as they are spooled")
    _add_address_flags(tail)
    tail.add_argument("--kind", action="append", default=[],
                      help="only events of this kind, e.g. task (repeat for more)")
    tail.add_argument("--name", action="append", default=[],
                      help="only events of this name (repeat for more)")
    tail.add_argument("--json", action="store_true", help="print each event as one JSON line")
    tail.add_argument("--limit", type=int, default=0,
                      help="stop after this many events (default: follow until Ctrl-C)")
    tail.add_argument("--token-file", type=Path,
                      help="a file holding the agent's token, when it has http_token_file "
                           "(default: the http_token_file of --config or $EVAGG_CONFIG)")
    tail.set_defaults(command=run_tail)


def _evaggs_kinds() -> list[str]:
    """The kinds evagg's producers and intakes write (docs/event-schema.md)."""
    from aggregator.ray.entities import RAY_KINDS

    return sorted(set(KINDS) | set(RAY_KINDS))


def _say_unknown_kinds(kinds: list[str]) -> None:
    """A kind no evagg producer sends is likely a typo (`ops` for `op`): followed all the
    same, since producers may send kinds of their own, but said, not waited on mutely."""
    known = _evaggs_kinds()
    unknown = [kind for kind in kinds if kind not in known]
    if unknown:
        print(f"evagg tail: no evagg producer sends kind {', '.join(map(repr, unknown))} "
              f"(evagg's own: {', '.join(known)}); following it anyway, for a producer's "
              "own kinds", file=sys.stderr, flush=True)


def run_tail(args: argparse.Namespace) -> int:
    query = urllib.parse.urlencode([*(("kind", k) for k in args.kind),
                                    *(("name", n) for n in args.name)])
    try:
        url = f"{agent_url(args.url, args.config)}/v1/tail" + (f"?{query}" if query else "")
    except NoAgentUrl as exc:
        print(f"evagg tail: {exc}", file=sys.stderr)
        return 2
    try:
        token_file = args.token_file or _configured_token_file(args.config)
        headers = _bearer(token_file)
    except OSError as exc:
        print(f"evagg tail: cannot read the token file {token_file}: {exc.strerror}",
              file=sys.stderr)
        return 2
    shown = 0
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            # stderr: a pipe of --json lines stays clean, the user still sees it works
            print(f"waiting for events on {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
            _say_unknown_kinds(args.kind)
            for line in response:
                print(line.decode().rstrip() if args.json else _short(orjson.loads(line)),
                      flush=True)
                shown += 1
                if args.limit and shown >= args.limit:
                    return 0
    except urllib.error.HTTPError as exc:
        hint = (": the agent wants its token, pass --token-file" if exc.code == 401 else "")
        print(f"evagg tail: the agent at {url} answered {exc.code}{hint}", file=sys.stderr)
        return 2 if exc.code == 401 else 1
    except (urllib.error.URLError, ConnectionError) as exc:
        print(cannot_reach("tail", url, exc), file=sys.stderr)
        return 1
    return 0


def _configured_token_file(config: Path | None) -> Path | None:
    """The agent's http_token_file, when its config can be read (else none: the agent
    says 401, and the hint names --token-file)."""
    from aggregator.config import ConfigError, configured_token_file

    try:
        return configured_token_file(config)
    except ConfigError:
        return None


def _bearer(token_file: Path | None) -> dict[str, str]:
    if token_file is None:
        return {}
    return {"Authorization": f"Bearer {token_file.read_text().strip()}"}


def _short(event: dict[str, Any]) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(event.get("time", 0) / 1e9))
    parts = [when, event.get("kind", "?"), event.get("name", ""), event.get("state", "")]
    if "duration_s" in event:
        parts.append(f"{event['duration_s']:.3f}s")
    error = _error_text(event.get("error_type"), event.get("error_message"))
    if error:
        parts.append(error)
    # a training loop's op says which run and step it was: the first thing asked of it
    for field, label in (("run_id", "run"), ("step", "step")):
        if event.get(field) not in (None, ""):
            parts.append(f"{label}={event[field]}")
    parts.append(f"pid={event.get('pid', '-')}")
    return "  ".join(str(p) for p in parts if p != "")


def _error_text(error_type: Any, message: Any) -> str:
    """The type once, as the dashboard prints it: OpenTelemetry's and Ray's messages often
    start with it already (`ValueError: bad batch`), which read `ValueError: ValueError:
    bad batch`; a message sent without a type is shown too."""
    text = str(message or "")
    if not error_type or text == error_type or text.startswith(f"{error_type}:"):
        return text or str(error_type or "")
    return f"{error_type}: {text}" if text else str(error_type)


# -- status ----------------------------------------------------------------------------------

def add_status_parser(commands: Parsers) -> None:
    status = commands.add_parser("status", help="rates, per-sink lag, spool bytes and losses")
    _add_address_flags(status)
    status.add_argument("--interval", type=float, default=1.0,
                        help="seconds between the two samples the rates come from (default 1)")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.set_defaults(command=run_status)


def run_status(args: argparse.Namespace) -> int:
    try:
        url = f"{agent_url(args.url, args.config)}/metrics"
    except NoAgentUrl as exc:
        print(f"evagg status: {exc}", file=sys.stderr)
        return 2
    try:
        first = _scrape(url)
        time.sleep(args.interval)
        second = _scrape(url)
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        # TimeoutError: connected, but no answer (an agent stopped or wedged)
        print(cannot_reach("status", url, exc), file=sys.stderr)
        return 1
    report = format_status(first, second, args.interval)
    print(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() if args.json
          else report.as_text(_config_flag(args.config)))
    return 0


def _config_flag(config: Path | None) -> str:
    """` --config FILE` for the commands status prints (`evagg query`, `evagg dlq`), so
    they read this agent's lake and dead letters (without it, they find $EVAGG_CONFIG)."""
    return f" --config {shlex.quote(str(config))}" if config else ""


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_metrics(response.read().decode())
