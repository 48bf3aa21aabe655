"""Limits on when a task may start: ``Concurrency`` (at most ``max`` running at once) and
``RateLimit`` (at most ``burst + rate * w / per`` starts in any window of ``w`` seconds), over
the whole pool, per key of the task's params or for a task type in all.

A task type's limits are bound to it (``bind``: each gets its id, its ``name`` or one derived
from the type) and resolved into *refs* when a task is submitted (``refs_for``): ``"<id>"`` for
a limit without a key, ``"<id>=<key>"`` with the task's value of the params field the limit
names. The refs are frozen into the task (``TaskSnapshot.limits``), so the store that starts
the task checks them without the task's code. The definitions are recorded in the store
(``to_json``/``from_json``), so a producer without the code resolves the same refs and a worker
with a different definition is told so.

Low in the package: the model and the stores import it; it imports only ``validation``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chongming_redis.validation import check_int

#: The most holders one concurrency limit may allow, and the most starts per period.
MAX_CONCURRENCY = 100_000
MAX_RATE = 1_000_000.0
#: The longest rate period accepted (a day).
MAX_PERIOD = 86400.0
#: The longest key a params field may give a limit (UTF-8 bytes).
MAX_KEY_BYTES = 200
#: The most limits a task type may have.
MAX_LIMITS = 8

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class LimitKeyError(ValueError):
    """A task's params do not give the key its limit needs (a missing field, or a value that is
    neither a ``str`` nor an ``int``): raised at submit, nothing is written."""


class LimitConflict(ValueError):
    """A worker's definition of a limit differs from the one recorded in the store."""

    def __init__(self, limit_id: str, recorded: str, given: str) -> None:
        super().__init__(
            f"limit {limit_id!r} is recorded as {recorded} but this worker defines it as {given};"
            " start it with --replace-limits to record the new definition"
        )
        self.limit_id, self.recorded, self.given = limit_id, recorded, given


def _seconds(value: object, what: str, maximum: float) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number or a timedelta)")
    seconds = float(value)
    if not (0 < seconds <= maximum) or math.isnan(seconds):
        raise ValueError(f"{what} must be > 0 and at most {maximum:g} seconds, not {value!r}")
    return seconds


def _matching(value: object, pattern: re.Pattern[str], what: str, shape: str) -> str | None:
    """``value`` if it is ``None`` or a ``str`` that ``pattern`` matches, else ``ValueError``."""
    if value is not None and (not isinstance(value, str) or not pattern.match(value)):
        raise ValueError(f"{what} must be {shape}, not {value!r}")
    return value


def _field(value: object, what: str) -> str | None:
    return _matching(value, _FIELD, what, "the name of a params field (such as 'customer_id')")


def _limit_id(value: object, what: str) -> str | None:
    return _matching(value, _ID, what, "1..100 of A-Z a-z 0-9 _ . : -")


@dataclass(frozen=True)
class Concurrency:
    """At most ``max`` tasks ``RUNNING`` or ``PAUSED`` at once: per value of the params field
    ``per`` when given, else of the task type in all. ``name``: an id shared by the task types
    that name it (one limit over all of them)."""

    max: int
    per: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        check_int(self.max, "Concurrency.max", minimum=1, maximum=MAX_CONCURRENCY)
        _field(self.per, "Concurrency.per")
        _limit_id(self.name, "Concurrency.name")

    @property
    def key_field(self) -> str | None:
        return self.per

    def definition(self) -> dict[str, Any]:
        return {"kind": "concurrency", "max": self.max, "per": self.per}


@dataclass(frozen=True)
class RateLimit:
    """At most ``rate`` starts per ``per`` seconds, ``burst`` at once (default: ``rate``, at
    least 1): a token bucket of ``burst`` tokens refilled at ``rate / per`` a second on the
    store's clock, one spent by each start. ``key``: a params field, one bucket per value;
    ``name``: an id shared by the task types that name it."""

    rate: float
    per: float | timedelta = 1.0  # seconds as a float once constructed
    burst: int | None = None
    key: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        rate = _seconds(self.rate, "RateLimit.rate", MAX_RATE)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "per", _seconds(self.per, "RateLimit.per", MAX_PERIOD))
        if self.burst is None:
            object.__setattr__(self, "burst", max(1, math.ceil(rate)))
        check_int(self.burst, "RateLimit.burst", minimum=1, maximum=int(MAX_RATE))
        _field(self.key, "RateLimit.key")
        _limit_id(self.name, "RateLimit.name")

    @property
    def key_field(self) -> str | None:
        return self.key

    @property
    def period(self) -> float:
        """``per`` in seconds."""
        return self.per.total_seconds() if isinstance(self.per, timedelta) else self.per

    def definition(self) -> dict[str, Any]:
        return {"kind": "rate", "rate": self.rate, "per": self.period, "burst": self.burst,
                "key": self.key}  # fmt: skip


Limit = Concurrency | RateLimit


@dataclass(frozen=True)
class BoundLimit:
    """A limit bound to its id (``limit.name``, or ``<task>.concurrency`` / ``<task>.rate``)."""

    id: str
    limit: Limit

    def to_json(self) -> str:
        return to_json(self.limit)


def bind(task_name: str, limits: Iterable[Limit]) -> tuple[BoundLimit, ...]:
    """The limits of task type ``task_name`` with their ids. Two limits with one id (two
    unnamed of one kind, or one name twice) are a ``ValueError``."""
    bound: list[BoundLimit] = []
    for limit in limits:
        if not isinstance(limit, (Concurrency, RateLimit)):
            raise TypeError(f"limits takes Concurrency and RateLimit, not {type(limit).__name__}")
        kind = "concurrency" if isinstance(limit, Concurrency) else "rate"
        limit_id = limit.name or f"{task_name}.{kind}"
        if _ID.match(limit_id) is None:
            raise ValueError(f"task {task_name!r}: give its limits a name (1..100 of A-Z a-z 0-9"
                             " _ . : -)")  # fmt: skip
        if any(b.id == limit_id for b in bound):
            raise ValueError(
                f"task {task_name!r} has two limits with the id {limit_id!r}: name them"
            )
        bound.append(BoundLimit(limit_id, limit))
    if len(bound) > MAX_LIMITS:
        raise ValueError(f"task {task_name!r} has {len(bound)} limits; at most {MAX_LIMITS}")
    return tuple(bound)


def _value_at(params: object, path: str) -> object:
    value = params
    for part in path.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                raise KeyError(part)
            value = value[part]
        elif hasattr(value, part) and not isinstance(value, (str, bytes, int, float)):
            value = getattr(value, part)
        else:
            raise KeyError(part)
    return value


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8; a lone surrogate (no UTF-8 at all) counts as too many."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return MAX_KEY_BYTES + 1


def key_of(params: object, field: str, limit_id: str) -> str:
    """The key the params field ``field`` gives limit ``limit_id``; ``LimitKeyError`` when the
    field is missing or its value is not a non-empty ``str`` (at most 200 bytes) or an ``int``."""
    try:
        value = _value_at(params, field)
    except KeyError:
        raise LimitKeyError(
            f"limit {limit_id!r} needs params field {field!r}, which is missing"
        ) from None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise LimitKeyError(
            f"limit {limit_id!r}: params field {field!r} must be a str or an int,"
            f" not {type(value).__name__}"
        )
    try:
        key = str(value)
    except ValueError:  # an int too long for str() (over 4300 digits) is no key either
        key = "x" * (MAX_KEY_BYTES + 1)
    if not key or _utf8_size(key) > MAX_KEY_BYTES:
        raise LimitKeyError(f"limit {limit_id!r}: params field {field!r} gives an empty key or"
                            f" one over {MAX_KEY_BYTES} bytes")  # fmt: skip
    return key


def refs_for(bound: Iterable[BoundLimit], params: object) -> tuple[str, ...]:
    """The refs a task with ``params`` holds under ``bound`` limits, in their order."""
    refs = []
    for b in bound:
        field = b.limit.key_field
        refs.append(b.id if field is None else f"{b.id}={key_of(params, field, b.id)}")
    return tuple(refs)


def ref_limit_id(ref: str) -> str:
    """The limit id of a ref (``"<id>"`` or ``"<id>=<key>"``)."""
    return ref.split("=", 1)[0]


def check_limit_id(value: object) -> str:
    """``value`` as a limit id (``[A-Za-z0-9_.:-]``, 1 to 100 characters), else
    ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"a limit id must be a str, not {type(value).__name__}")
    _limit_id(value, "a limit id")
    return value


def check_refs(value: object) -> tuple[str, ...]:
    """``value`` as a task's refs (a tuple of ``"<id>"`` / ``"<id>=<key>"``, distinct limit
    ids), else ``TypeError``/``ValueError``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"limits must be a tuple of refs, not {type(value).__name__}")
    refs = tuple(value)
    if len(refs) > MAX_LIMITS:
        raise ValueError(f"limits holds {len(refs)} refs; at most {MAX_LIMITS}")
    seen = set()
    for ref in refs:
        if not isinstance(ref, str):
            raise TypeError(f"a limit ref must be a str, not {type(ref).__name__}")
        limit_id, _, key = ref.partition("=")
        if _ID.match(limit_id) is None or ("=" in ref and not key):
            raise ValueError(f"limit ref {ref!r} is not '<id>' or '<id>=<key>'")
        if _utf8_size(key) > MAX_KEY_BYTES:
            raise ValueError(f"limit ref {ref!r} has a key over {MAX_KEY_BYTES} bytes")
        if limit_id in seen:
            raise ValueError(f"limits names {limit_id!r} twice")
        seen.add(limit_id)
    return refs


def to_json(limit: Limit) -> str:
    """A limit's definition as recorded in the store (sorted keys: equal definitions are equal
    text)."""
    return json.dumps(limit.definition(), sort_keys=True, separators=(",", ":"))


def from_json(text: str) -> Limit:
    """The limit a recorded definition describes (its id is kept beside it); ``ValueError``
    when it is not one."""
    try:
        d = json.loads(text)
        if d["kind"] == "concurrency":
            return Concurrency(max=d["max"], per=d.get("per"))
        if d["kind"] == "rate":
            return RateLimit(rate=d["rate"], per=d["per"], burst=d["burst"], key=d.get("key"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a limit definition: {text!r} ({exc})") from None
    raise ValueError(f"not a limit definition: {text!r} (unknown kind)")


def refill(tokens: float, at_us: int, now_us: int, limit: RateLimit) -> float:
    """A token bucket's tokens at ``now_us`` that held ``tokens`` at ``at_us``: refilled at
    ``rate / per`` a second, never above ``burst``, never lowered by a clock that went back."""
    elapsed = max(0, now_us - at_us) / 1e6
    assert limit.burst is not None
    return min(float(limit.burst), tokens + elapsed * limit.rate / limit.period)


@dataclass(frozen=True)
class LimitUsage:
    """One ref's use as a store reports it (``LimitsStore.limit_usage``): ``held``, the tasks
    ``RUNNING`` or ``PAUSED`` that name it (0 for a rate limit, which holds nothing), and
    ``waiting``, the ``PENDING`` tasks naming it that a start passed over because of it and
    that have not started since."""

    ref: str
    held: int
    waiting: int

    @property
    def limit_id(self) -> str:
        return ref_limit_id(self.ref)
