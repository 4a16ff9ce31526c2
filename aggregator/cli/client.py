"""Commands that talk to a running agent: `evagg emit`, `evagg tail`, `evagg status`."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TypeAlias

import orjson

from aggregator.cli.status import format_status, parse_metrics
from emitters.fields import EVENT_FIELDS, KINDS, OP_STATES, TASK_STATES

Parsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
_NUMBER_COLUMNS = frozenset({"int32", "int64", "float64", "timestamp_ns"})


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
            raise NoAgentUrl(f"config error: {exc}") from None
        if not listen:
            raise NoAgentUrl("the agent's HTTP port is disabled (http_listen = \"\"); "
                             "pass --url")
    return listen if listen.startswith("http") else f"http://{listen}"


def _add_address_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="agent HTTP address (default: the agent's http_listen)")
    parser.add_argument("--config", type=Path,
                        help="the agent's TOML file, for its http_listen "
                             "(default: $EVAGG_CONFIG or none; $EVAGG_HTTP_LISTEN wins)")


def cannot_reach(command: str, url: str, exc: urllib.error.URLError | ConnectionError) -> str:
    """Why `command` got no answer from the agent at `url`, and what to do, in words."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        why = "nothing answers there (connection refused)"
    elif isinstance(reason, TimeoutError):
        why = "it did not answer in time"
    else:
        why = getattr(reason, "strerror", None) or str(reason)
    return (f"evagg {command}: cannot reach the agent at {url}: {why}; start one with "
            "`evagg run`, or point --url (or --config) at the agent's http_listen")


# -- emit ------------------------------------------------------------------------------------

def add_emit_parser(commands: Parsers) -> None:
    emit = commands.add_parser(
        "emit", help="send events from the shell or a file (NDJSON) over the socket")
    emit.add_argument("--socket", help="agent socket (default: $EVAGG_SOCKET or the default)")
    emit.add_argument("--file", help="NDJSON file of events, '-' for standard input")
    emit.add_argument("--kind", default="task",
                      help=f"what the event is: {', '.join(KINDS)} (default: task)")
    emit.add_argument("--name", help="what it is called: the task's function, the op's name")
    emit.add_argument("--state",
                      help=f"a task's state ({', '.join(TASK_STATES)}) or an op's "
                           f"({', '.join(OP_STATES)})")
    emit.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                      help="another field, e.g. task_id=t1 or duration_s=0.8 (repeat it); "
                           "VALUE is read as JSON when it parses; a number field such as "
                           "duration_s must get a number")
    emit.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the ack")
    emit.set_defaults(command=run_emit)


def run_emit(args: argparse.Namespace) -> int:
    import emitters

    if args.socket:
        emitters.configure(socket=args.socket)
    try:
        events = list(_events_from_args(args))
    except ValueError as exc:
        print(f"evagg emit: {exc}", file=sys.stderr)
        return 2
    missing = _no_agent_there(emitters.get_emitter().socket_path)
    if missing:
        print(f"evagg emit: {missing}", file=sys.stderr)
        return 1
    for note in sorted({n for n in map(_unknown_state, events) if n is not None}):
        print(f"evagg emit: note: {note}", file=sys.stderr)
    for event in events:
        emitters.emit(**event)
    if not emitters.flush(args.timeout):
        print(f"evagg emit: the agent did not acknowledge {len(events)} events within "
              f"{args.timeout:g}s (is it running on {emitters.get_emitter().socket_path}?)",
              file=sys.stderr)
        return 1
    print(f"sent {len(events)} events")
    return 0


def _unknown_state(event: dict[str, Any]) -> str | None:
    """A state evagg's views do not rank, said before it is sent (it is sent all the same:
    other producers may have states of their own)."""
    known = {"task": TASK_STATES, "op": OP_STATES}.get(str(event.get("kind")))
    state = event.get("state")
    if known is None or state is None or state in known:
        return None
    shown = ", and the tasks view shows such a task as UNKNOWN" if known is TASK_STATES else ""
    return (f"{state} is not a {event['kind']} state evagg knows ({', '.join(known)}); "
            f"it is stored as sent{shown}")


def _no_agent_there(path: str) -> str | None:
    """Why no agent can be listening on `path`, known without waiting for an ack: its
    socket file is missing or is not a socket. None when one may be (or an agent on
    demand starts there: $EVAGG_START_AGENT=1)."""
    if os.environ.get("EVAGG_START_AGENT") == "1":
        return None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return (f"no agent is running on {path} (the socket file does not exist): start "
                "one with `evagg run`, or point --socket (or $EVAGG_SOCKET) at the agent's "
                "socket")
    except OSError as exc:
        return f"cannot use the socket {path}: {exc.strerror}"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket: point --socket (or $EVAGG_SOCKET) at the agent's"
    return None


def _events_from_args(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    if args.file == "-":
        yield from _events_from_lines(sys.stdin.buffer)
    elif args.file:
        with Path(args.file).open("rb") as handle:
            yield from _events_from_lines(handle)
    else:
        yield _event_from_flags(args)


def _events_from_lines(handle: IO[bytes]) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"line {number}: invalid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"line {number}: an event must be a JSON object")
        yield parsed


def _event_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    event: dict[str, Any] = {"kind": args.kind}
    if args.name:
        event["name"] = args.name
    if args.state:
        event["state"] = args.state
    for item in args.field:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--field {item!r} is not KEY=VALUE")
        event[key] = field_value(key, value)
    return event


def field_value(key: str, text: str) -> Any:
    """VALUE of `--field KEY=VALUE`, checked against the event schema's column: a number
    column refuses what is not a number (the agent would store NULL without a word), a
    text column takes the text as typed (quotes optional), any other key takes JSON when
    it parses, else the text."""
    column = EVENT_FIELDS.get(key)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = text
    if column == "string":
        return value if isinstance(value, str) else text
    if column in _NUMBER_COLUMNS:
        number_kinds = (int,) if column != "float64" else (int, float)
        if isinstance(value, bool) or not isinstance(value, number_kinds):
            what = "a whole number" if column != "float64" else "a number"
            raise ValueError(f"--field {key}={text}: {key} takes {what}, and {text!r} is "
                             "not one")
    return value


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
                      help="a file holding the agent's token, when it has http_token_file")
    tail.set_defaults(command=run_tail)


def run_tail(args: argparse.Namespace) -> int:
    query = urllib.parse.urlencode([*(("kind", k) for k in args.kind),
                                    *(("name", n) for n in args.name)])
    try:
        url = f"{agent_url(args.url, args.config)}/v1/tail" + (f"?{query}" if query else "")
    except NoAgentUrl as exc:
        print(f"evagg tail: {exc}", file=sys.stderr)
        return 2
    try:
        headers = _bearer(args.token_file)
    except OSError as exc:
        print(f"evagg tail: cannot read the token file: {exc.strerror}", file=sys.stderr)
        return 2
    shown = 0
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            # stderr: a pipe of --json lines stays clean, the user still sees it works
            print(f"waiting for events on {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
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


def _bearer(token_file: Path | None) -> dict[str, str]:
    if token_file is None:
        return {}
    return {"Authorization": f"Bearer {token_file.read_text().strip()}"}


def _short(event: dict[str, Any]) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(event.get("time", 0) / 1e9))
    parts = [when, event.get("kind", "?"), event.get("name", ""), event.get("state", "")]
    if "duration_s" in event:
        parts.append(f"{event['duration_s']:.3f}s")
    if "error_type" in event:
        parts.append(f"{event['error_type']}: {event.get('error_message', '')}")
    parts.append(f"pid={event.get('pid', '-')}")
    return "  ".join(str(p) for p in parts if p != "")


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
    except (urllib.error.URLError, ConnectionError) as exc:
        print(cannot_reach("status", url, exc), file=sys.stderr)
        return 1
    report = format_status(first, second, args.interval)
    print(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() if args.json
          else report.as_text())
    return 0


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_metrics(response.read().decode())
