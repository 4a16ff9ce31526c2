"""`evagg emit`: events from flags or an NDJSON file, sent over the socket like a producer.

Every event is judged by the agent's own rule (`aggregator.decode.normalize`) before it
is sent, so a bad value is refused here with the words the agent would use, and the
good lines of a file still go. After the flush, what the emitter counted says what
happened: too large for a frame, refused by the agent, or no answer at all.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from aggregator.cli.arguments import Parsers
from emitters.fields import EVENT_FIELDS, KINDS, OP_STATES, TASK_STATES
from emitters.stats import EmitterStats

DEFAULT_MAX_FRAME = 2**20  # the emitter's own default (docs/emitters.md)
EXIT_CODES = """\
exit codes:
  0  every event was stored by the agent
  1  no agent, or it did not acknowledge within --timeout
  2  bad input: a wrong flag, an event refused by the event rule (docs/event-schema.md,
     "Bad input") here or by the agent, or one too large for a frame; the good lines of
     a --file are sent all the same, and each refused one is named with its line number
"""


class BadInput(ValueError):
    """A flag or a whole file that cannot be read as events at all."""


@dataclass
class Events:
    """What the input held: the events to send, and each refused one with its reason."""

    good: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "line 2: field 'kind' is required"


def add_emit_parser(commands: Parsers) -> None:
    emit = commands.add_parser(
        "emit", help="send events from the shell or a file (NDJSON) over the socket",
        description="Send events to the agent over its socket, as a producer would. Each "
                    "event is checked by the agent's rule first: a value that does not fit "
                    "its field is refused, never stored as NULL.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    emit.add_argument("--socket", help="agent socket (default: $EVAGG_SOCKET, else the "
                                       "agent.socket of --config, else the default)")
    emit.add_argument("--config", type=Path,
                      help="the agent's TOML file, for its socket (default: $EVAGG_CONFIG "
                           "or none), as `evagg status` reads it for its address")
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
    emit.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME, metavar="BYTES",
                      help="largest frame to send (default 1 MiB); an event must fit in one. "
                           "Keep it at or below the agent's [agent] max_frame (4 MiB)")
    emit.set_defaults(command=run_emit)


def run_emit(args: argparse.Namespace) -> int:
    import emitters

    # The emitter's own warnings say what this command says better, once, below.
    logging.getLogger("evagg.emitter").setLevel(logging.ERROR)
    try:
        emitters.configure(socket=_socket(args), max_frame_bytes=args.max_frame_bytes)
        events = _events_from_args(args)
    except (BadInput, ValueError) as exc:  # ValueError: the emitter refused --max-frame-bytes
        print(f"evagg emit: {exc}", file=sys.stderr)
        return 2
    for refusal in events.refused:
        print(f"evagg emit: {refusal}", file=sys.stderr)
    if not events.good:
        where = "standard input" if args.file == "-" else args.file
        print("evagg emit: nothing sent: " + ("every event was refused" if events.refused
              else f"{where} holds no events (it is empty, or blank lines only)"),
              file=sys.stderr)
        return 2
    code = _send(events.good, len(events.refused), args)
    return 2 if events.refused and code == 0 else code


def _send(events: list[dict[str, Any]], refused: int, args: argparse.Namespace) -> int:
    """Emit the events (`refused` others were not sent), wait for their acks and say
    what happened; the exit code."""
    import emitters

    socket_path = emitters.get_emitter().socket_path
    missing = no_agent_there(socket_path)
    if missing:
        print(f"evagg emit: {missing}", file=sys.stderr)
        return 1
    for note in sorted({n for n in map(_unknown_state, events) if n is not None}):
        print(f"evagg emit: note: {note}", file=sys.stderr)
    for event in events:
        emitters.emit(**event)
    acked = emitters.flush(args.timeout)
    stats = emitters.stats()
    problems, code = _what_happened(stats, args, socket_path, acked)
    for problem in problems:
        print(f"evagg emit: {problem}", file=sys.stderr)
    if stats.acked or code != 1:
        also = f", {refused} refused (named above)" if refused else ""
        print(f"sent {stats.acked} events{also}")  # as scripts read it, plural or not
    return code


def _socket(args: argparse.Namespace) -> str | None:
    """--socket, else $EVAGG_SOCKET or the agent.socket of --config or $EVAGG_CONFIG (read
    as `evagg run` reads them), else None: the producers' default."""
    if args.socket or not (args.config or os.environ.get("EVAGG_CONFIG")):
        return args.socket or None
    from aggregator.config import ConfigError, configured_socket

    try:
        return configured_socket(args.config)
    except ConfigError as exc:
        raise BadInput(f"config error: {exc}") from None


def _what_happened(stats: EmitterStats, args: argparse.Namespace, socket_path: str,
                   acked: bool) -> tuple[list[str], int]:
    """What went wrong after sending, in words, and the exit code it means."""
    problems: list[str] = []
    too_large = stats.dropped.get("too_large", 0)
    if too_large:
        problems.append(
            f"{_events(too_large)} too large to send: each must fit in one frame of "
            f"{args.max_frame_bytes:,} bytes; raise --max-frame-bytes (at most the agent's "
            "[agent] max_frame, 4 MiB by default) or make the event smaller")
    for reason, count in sorted(stats.refused.items()):
        hint = (" (the agent's [agent] max_frame: keep --max-frame-bytes below it)"
                if "exceeds the limit" in reason else "")
        problems.append(f"the agent refused {_events(count)}: {reason}{hint}")
    if problems:
        return problems, 2
    if acked:
        return [], 0
    if stats.pending and stats.connected:
        return [f"the agent on {socket_path} took the events but did not acknowledge "
                f"{_events(stats.pending)} within {args.timeout:g}s; it may be busy or its "
                "spool full (`evagg status`), or give it longer with --timeout"], 1
    if Path(socket_path).exists():  # a socket nobody accepts on: stopping, or gone
        return [f"nothing accepted a connection on {socket_path} within {args.timeout:g}s "
                f"({_events(stats.pending)} not sent): the agent there is stopping "
                "(draining what it holds) or died and left its socket; `evagg status` "
                "tells which, `evagg run` starts one"], 1
    return [f"no agent socket at {socket_path} within {args.timeout:g}s "
            f"({_events(stats.pending)} not sent): is one running? "
            "(`evagg status`; start one with `evagg run`)"], 1


def _events(count: int) -> str:
    return f"{count} event" if count == 1 else f"{count} events"


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


def no_agent_there(path: str) -> str | None:
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


def _events_from_args(args: argparse.Namespace) -> Events:
    if args.file == "-":
        return _events_from_lines(sys.stdin.buffer)
    if args.file:
        try:
            with Path(args.file).open("rb") as handle:
                return _events_from_lines(handle)
        except OSError as exc:
            raise BadInput(f"cannot read --file {args.file}: {exc.strerror}") from None
    event = _event_from_flags(args)
    reason = refusal(event)
    if reason is not None:
        raise BadInput(f"{_flag_named(args, reason)}: {reason}")
    return Events(good=[event])


def _events_from_lines(handle: IO[bytes]) -> Events:
    events = Events()
    for number, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            events.refused.append(f"line {number}: invalid JSON: {exc}")
            continue
        reason = refusal(parsed)
        if reason is None:
            events.good.append(parsed)
        else:
            events.refused.append(f"line {number}: {reason}")
    return events


def refusal(event: Any) -> str | None:
    """Why the agent would refuse `event`, in its words; None when it would store it.
    The agent's own rule, so that every door refuses the same events the same way."""
    from aggregator.decode.normalize import EventError, Stamp, normalize_event

    try:
        normalize_event(event, Stamp(received_ns=0))
    except EventError as exc:
        return str(exc)
    return None


def _flag_named(args: argparse.Namespace, reason: str) -> str:
    """The flag a refusal is about: `--field duration_s=abc`, or the flags as typed."""
    for item in args.field:
        key = item.partition("=")[0]
        if f"'{key}'" in reason:
            return f"--field {item}"
    return "the event from --kind, --name, --state and --field"


def _event_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    event: dict[str, Any] = {"kind": args.kind}
    if args.name:
        event["name"] = args.name
    if args.state:
        event["state"] = args.state
    for item in args.field:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--field {item!r} is not KEY=VALUE")
        event[key] = field_value(key, value)
    return event


def field_value(key: str, text: str) -> Any:
    """VALUE of `--field KEY=VALUE`: a text field takes the text as typed (quotes
    optional), any other key takes JSON when it parses, else the text; whether it fits
    its field is the event rule's to say (`refusal`)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = text
    if EVENT_FIELDS.get(key) == "string":
        return value if isinstance(value, str) else text
    return value
