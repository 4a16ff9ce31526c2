"""A producer that loses three events against a real agent, for what `evagg status`
says of it: two events too large for its frames, and one it could not encode (attrs
that raise when read)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from emitters import Emitter
from tests.agentproc import AgentProcess
from tests.waiting import wait_until

COUNTED = "evagg_producer_dropped_events_total"


class UnreadableAttrs(Mapping[str, str]):
    """A caller's mapping that fails as it is read: the emitter cannot build the event."""

    def __getitem__(self, key: str) -> str:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("these attrs cannot be read")

    def __len__(self) -> int:
        return 1


def lose_three_events(agent: AgentProcess) -> None:
    emitter = Emitter(socket=agent.socket_path, max_frame_bytes=4096)
    try:
        for _ in range(2):
            emitter.emit(kind="task", name="x" * 10_000)  # larger than any frame: too_large
        assert not emitter.flush(30)
        emitter.emit(kind="task", name="unbuildable", attrs=UnreadableAttrs())
        assert not emitter.flush(30)
        assert emitter.stats().dropped == {"too_large": 2, "unencodable": 1}
    finally:
        emitter.close(5.0)
    wait_until(lambda: agent.metric(COUNTED) == 3, 30,
               lambda: f"the agent to count 3 producer losses:\n{agent.metrics()}")
