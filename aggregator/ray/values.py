"""Values in Ray's RayEvent JSON (protobuf's canonical JSON mapping) -> evagg values.

Keys are camelCase, or snake_case when Ray runs with PRESERVE_PROTO_FIELD_NAME; ids are
standard base64 (shown as hex, the way Ray prints them); int64 arrive as strings;
timestamps are RFC 3339 with up to nine fractional digits; fields at their default
value are printed too, so "unset" means falsy.
"""

from __future__ import annotations

import binascii
import re
from typing import Any, cast

import orjson

from aggregator.decode.normalize import EventError, parse_rfc3339_ns
from emitters.fields import redact_environment

# The caches below hold values that arrive from outside, so besides a count each bounds
# what one entry may hold: longer values are mapped every time, never kept.
MAX_CACHED_KEY = 64  # characters of an id or name; items of a key tuple
MAX_CACHED_ENV = 4096  # characters of a serialized runtime env
HEX_CACHE_SIZE = 1 << 16  # entries; module constants, so tests can shrink them
NAMES_CACHE_SIZE = 4096
ENV_CACHE_SIZE = 256
_MISSING: Any = object()  # a cache miss (None is a value some caches hold)


def keep(cache: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Store in a cache that is emptied whole when full. Another decode thread may clear
    it at any time: read it with one `.get`, never `in` then `[]`."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value


class RayValueError(ValueError):
    """One Ray event with a field that cannot be converted; the event is rejected."""


class Keys(dict[str, str]):
    """snake_case field name -> the key on the wire (camelCase unless preserved)."""

    def __init__(self, camel: bool) -> None:
        super().__init__()
        self.camel = camel

    def __missing__(self, snake: str) -> str:
        head, *rest = snake.split("_")
        key = head + "".join(p[:1].upper() + p[1:] for p in rest) if self.camel else snake
        if len(snake) <= MAX_CACHED_KEY and len(self) < 1024:  # event types come from outside
            self[snake] = key
        return key


K_CAMEL = Keys(camel=True)
K_SNAKE = Keys(camel=False)


def keys_of(item: dict[str, Any]) -> Keys:
    return K_SNAKE if ("event_type" in item or "event_id" in item) else K_CAMEL


_SNAKE_OF: dict[str, str] = {}


def snake(key: str) -> str:
    name = _SNAKE_OF.get(key)
    if name is None:
        name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()
        if len(key) <= MAX_CACHED_KEY:  # field names come from outside
            keep(_SNAKE_OF, key, name, NAMES_CACHE_SIZE)
    return name


class Taken:
    """Payload fields a mapper turns into columns itself, as wire keys in both casings."""

    __slots__ = ("_with", "camel", "snake")

    def __init__(self, *names: str) -> None:
        self.snake = frozenset(names)
        self.camel = frozenset(K_CAMEL[n] for n in names)
        self._with: dict[tuple[bool, str], frozenset[str]] = {}

    def wire(self, k: Keys, also: str = "") -> frozenset[str]:
        """The taken wire keys in k's casing, and `also`."""
        if not also:
            return self.camel if k.camel else self.snake
        found = self._with.get((k.camel, also))
        if found is None:
            found = self.wire(k) | {also}
            if len(also) <= MAX_CACHED_KEY:
                keep(self._with, (k.camel, also), found, 64)
        return found


def extra_attrs(obj: dict[str, Any], k: Keys, taken: Taken, also: str = "") -> dict[str, str]:
    """attrs["ray_<snake>"] for each field not taken (nor `also`) that holds a non-default
    value, so fields Ray adds in later versions are kept without code here."""
    if obj.keys() <= taken.wire(k, also):
        return {}
    out = {}
    for key, name in extra_names(obj, k, taken, also):
        value = obj[key]
        if value and value != "0":  # int64 zero prints as "0"
            out[name] = value if type(value) is str else text(value)
    return out


# (taken, casing, also, the object's keys in order) -> (wire key, attr name) of the extras,
# sorted by wire key: every event of one type and Ray version has the same keys.
_EXTRA_NAMES: dict[tuple[Any, ...], tuple[tuple[str, str], ...]] = {}


def extra_names(obj: dict[str, Any], k: Keys, taken: Taken,
                also: str) -> tuple[tuple[str, str], ...]:
    if len(obj) > MAX_CACHED_KEY:  # an odd object: not worth a cache entry of its size
        return _names_of(obj, k, taken, also)
    shape = (taken, k.camel, also, tuple(obj))
    names = _EXTRA_NAMES.get(shape)
    if names is None:
        names = _names_of(obj, k, taken, also)
        # odd producers (fuzzers) make new shapes: bounded in count and in size
        if len(also) <= MAX_CACHED_KEY and all(len(n) <= MAX_CACHED_KEY for n in obj):
            keep(_EXTRA_NAMES, shape, names, NAMES_CACHE_SIZE)
    return names


def _names_of(obj: dict[str, Any], k: Keys, taken: Taken,
              also: str) -> tuple[tuple[str, str], ...]:
    return tuple((key, _attr_name(key)) for key in sorted(obj.keys() - taken.wire(k, also)))


def _attr_name(key: str) -> str:
    name = snake(key)
    return name if name.startswith("ray_") else "ray_" + name


def text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


HEX_CACHE: dict[str, str] = {}  # job, node, worker and task ids repeat across a batch


def b64_hex(value: Any, field: str, cache: bool = True) -> str | None:
    """A base64 id as hex; None when empty. Set cache=False for ids that never repeat."""
    if not value:
        return None
    if not isinstance(value, str):
        raise RayValueError(f"{field} must be a base64 string, got {type(value).__name__}")
    found = HEX_CACHE.get(value) if cache else None
    if found is not None:
        return found
    try:
        found = binascii.a2b_base64(value, strict_mode=True).hex()
    except binascii.Error as exc:
        raise RayValueError(f"{field} is not base64 ({exc}): {value[:60]!r}") from None
    if cache and len(value) <= MAX_CACHED_KEY:  # Ray's ids are 4-40 base64 characters
        keep(HEX_CACHE, value, found, HEX_CACHE_SIZE)
    return found


def creation_actor_id(task_type: Any, task_id: str | None) -> str | None:
    """The actor of an actor creation task, which its definition does not name: Ray makes
    such a task's id from 8 bytes of 0xff and the actor's id (TaskID::ForActorCreationTask)."""
    if task_type != "ACTOR_CREATION_TASK" or not task_id or len(task_id) != 48:
        return None
    return task_id[16:] if task_id[:16] == "f" * 16 else None


def ids(p: dict[str, Any], k: Keys, *columns: str) -> dict[str, str | None]:
    """{column: hex} for payload fields named like the columns (task_id, job_id, ...)."""
    return {c: b64_hex(p.get(k[c]), k[c]) for c in columns}


_SECONDS: dict[str, int] = {}


def time_ns(value: Any, field: str) -> int:
    """RFC 3339 -> integer ns. The whole-second part is cached: a batch spans few seconds."""
    if type(value) is str and len(value) == 30 and value[29] == "Z" and value[19] == ".":
        seconds = _SECONDS.get(value[:19])  # Ray's own shape: nine digits, UTC
        fraction = value[20:29]
        if seconds is not None and fraction.isdigit():
            return seconds + int(fraction)
    if not isinstance(value, str):
        raise RayValueError(f"{field} must be an RFC 3339 string, got {type(value).__name__}")
    try:
        if len(value) > 20 and value[19] == "." and value[-1] == "Z" and value[20:-1].isdigit():
            head = value[:19]
            seconds = _SECONDS.get(head)
            if seconds is None:
                seconds = parse_rfc3339_ns(head + "Z")
                keep(_SECONDS, head, seconds, 100_000)
            return seconds + int(value[20:-1][:9].ljust(9, "0"))
        return parse_rfc3339_ns(value)
    except EventError as exc:
        raise RayValueError(f"{field}: {exc}") from None


def to_int(value: Any, field: str) -> int:
    """int32 arrive as JSON numbers, int64 as strings."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise RayValueError(f"{field} must be an integer, got {value!r:.40}")


_ENVS: dict[str, str | None] = {}  # the tasks of one job share their runtime env


def runtime_env(serialized: Any) -> str | None:
    """A serialized runtime env with secret-looking env_vars values redacted."""
    if not serialized or serialized == "{}":
        return None
    cacheable = type(serialized) is str and len(serialized) <= MAX_CACHED_ENV
    if cacheable:
        cached = _ENVS.get(serialized, _MISSING)
        if cached is not _MISSING:
            return cast(str | None, cached)
    try:
        env = orjson.loads(serialized)
    except orjson.JSONDecodeError:
        return "[unreadable runtime env]"
    if isinstance(env, dict) and isinstance(env.get("env_vars"), dict):
        env["env_vars"] = redact_environment({str(a): str(b) for a, b in env["env_vars"].items()})
    found = text(env)
    if cacheable:
        keep(_ENVS, serialized, found, ENV_CACHE_SIZE)
    return found
