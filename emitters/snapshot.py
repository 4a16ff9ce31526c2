"""The values of a caller's event as they are when emit() (or op.metric()) is called.

The sender thread reads events later, so a dict reused from step to step, a list the
caller appends to, or a tensor updated in place would otherwise be recorded with a later
value, silently. Plain values (numbers, text, None) are immutable and pass untouched, so
the common call costs one type check per field. Containers are copied (a few levels
deep; a deeper or recursive one stays as it is, and the sender writes its text), numpy
values are read or copied, and a torch tensor is read when it lives on the CPU and
cloned on its device otherwise (an asynchronous copy: reading it here would make the
caller wait for the GPU). Runs in the caller: nothing here raises.
"""

from __future__ import annotations

from typing import Any, Final

PLAIN: Final = frozenset({int, float, str, bool, type(None)})
_DEPTH: Final = 4  # nested containers copied at most this deep


def snapshot_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (a fresh kwargs dict) with every mutable value frozen in place."""
    for key, value in fields.items():
        if type(value) not in PLAIN:
            fields[key] = snapshot(value)
    return fields


def snapshot(value: Any, depth: int = _DEPTH) -> Any:
    try:
        return _snapshot(value, depth)
    except Exception:  # an object whose copy fails is recorded as it is later
        return value


def _snapshot(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in PLAIN or depth <= 0:
        return value
    if kind is dict:
        return {k: v if type(v) in PLAIN else _snapshot(v, depth - 1) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(v if type(v) in PLAIN else _snapshot(v, depth - 1) for v in value)
    if kind is set or kind is frozenset:
        return frozenset(value)
    if kind is bytearray:
        return bytes(value)
    return _array(value)


def _array(value: Any) -> Any:
    """numpy values and torch tensors, recognised by their module: neither is imported."""
    module = type(value).__module__
    if module == "numpy":
        return value.copy() if getattr(value, "ndim", 0) else value  # scalars are immutable
    if module == "torch" and hasattr(value, "detach"):
        if value.device.type == "cpu" and value.numel() == 1:
            return value.item()
        return value.detach().clone()
    return value
