"""What an emitter and its sender thread share, and nothing more: the one crossing point.

The emitter makes one `Handoff` (a new one in a forked child) and gives it to each sender
it starts. Callers' threads append to `queue` and count what did not fit in
`caller_drops`; the sender thread pops from the queue's left and reads `settings` on each
cycle. Neither side reaches into the other's attributes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from emitters.paths import default_socket_path


@dataclass(frozen=True, slots=True)
class Settings:
    """The sender's limits and where it connects; configure() replaces them whole."""

    socket_path: str | None = None  # None: $EVAGG_SOCKET or paths.default_socket_path()
    flush_interval: float = 0.05
    max_buffer_bytes: int = 64 * 1024 * 1024
    max_frame_bytes: int = 1024 * 1024
    ack_timeout: float = 10.0
    frames: str = "columns"  # or "ndjson"; an agent that refuses COLUMNS gets NDJSON anyway

    def resolved_socket(self) -> str:
        return self.socket_path or str(default_socket_path())


@dataclass(slots=True, eq=False)
class Handoff:
    """The callers' queue, what they dropped, and the settings the sender works with.

    `queue` holds event tuples and the markers among them (events.ContextChange,
    ledger.FlushWaiter), in the callers' order. `identity` is the context the sender
    starts from; later changes reach it in order, as ContextChange items in the queue.
    `settings` is replaced whole, never changed in place, so the sender reads either the
    old or the new one. `caller_drops` takes no lock: two threads dropping at the same
    instant can lose one count, cheaper than a lock on a path that is already overloaded.
    """

    settings: Settings = field(default_factory=Settings)
    identity: dict[str, Any] = field(default_factory=dict)
    queue: deque[Any] = field(default_factory=deque)
    caller_drops: int = 0  # events callers dropped because the queue was full or closed

    def queued_events(self) -> int:
        """Events in the queue (markers not counted); safe from any thread."""
        return sum(1 for item in list(self.queue) if type(item) is tuple)


def start_agent(settings: Settings) -> None:
    """Agent on demand (emitters/autostart.py): start one if none answers. Never raises."""
    from emitters import autostart

    autostart.ensure_agent(settings.socket_path)
