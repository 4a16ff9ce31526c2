"""What to tell an operator whose disk refuses the spool's writes, by the errno's name:
one owner for /readyz, the agent's log and `evagg status` (which imports nothing heavy)."""

from __future__ import annotations

from typing import Final

_FULL: Final = frozenset({"ENOSPC", "EDQUOT"})


def what_to_do(reason: str) -> str:
    """`reason`: the errno's name (ENOSPC, EDQUOT, EROFS, EIO, ...)."""
    if reason in _FULL:
        return "free space on the spool's disk (the state directory)"
    return ("look at the spool's disk (the state directory): it refuses writes, and the "
            "kernel's log says why")
