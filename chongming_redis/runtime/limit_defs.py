"""The limits as the runtime sees them: the definitions a store recorded (for a producer that
does not import the task's code), the refusal to run limits on a store that would not enforce
them, and which of a waiting task's refs is full (the dashboard, ``chongming-redis limits``).

The law itself (what a store checks at start) is in ``stores/extensions.py`` (``LimitsStore``)
and ``chongming_redis.limits``; nothing here enforces anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from chongming_redis.limits import (
    BoundLimit,
    Concurrency,
    Limit,
    LimitUsage,
    RateLimit,
    from_json,
    ref_limit_id,
)

#: How long a producer trusts the definitions it read from the store (seconds): a worker
#: that records a new type's limits is seen by a running producer within this.
RECORDED_TTL = 5.0

Recorded = tuple[dict[str, str], dict[str, tuple[str, ...]]]


class LimitsNotEnforced(TypeError):
    """The app's task types have limits but the store is no ``LimitsStore``: a worker would
    start their tasks unchecked, so it refuses to start."""

    def __init__(self, store: object, limit_ids: Iterable[str]) -> None:
        ids = ", ".join(sorted(limit_ids))
        super().__init__(
            f"the app's tasks have limits ({ids}) but {type(store).__name__} does not enforce "
            "limits (it is no LimitsStore): they would not hold; run on a store that does"
        )


def bound_by_type(recorded: Recorded) -> dict[str, tuple[BoundLimit, ...]]:
    """Task type -> its limits, from ``LimitsStore.limit_definitions()``; an id the types name
    without a recorded (or readable) definition is left out: it would limit nothing."""
    definitions, task_limits = recorded
    parsed: dict[str, Limit] = {}
    for limit_id, text in definitions.items():
        try:
            parsed[limit_id] = from_json(text)
        except ValueError:
            continue
    return {
        name: tuple(BoundLimit(i, parsed[i]) for i in ids if i in parsed)
        for name, ids in task_limits.items()
    }


class DefinitionsCache:
    """A producer's cache of the recorded definitions, read again after ``RECORDED_TTL``. A
    task type no worker has recorded yet has no limits here: its tasks are submitted without
    refs, and no limit holds them (``docs/runtime.md``, *Limits*)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_type: dict[str, tuple[BoundLimit, ...]] | None = None
        self._read_at = 0.0

    def fresh(self) -> bool:
        return self._by_type is not None and self._clock() - self._read_at < RECORDED_TTL

    def update(self, recorded: Recorded | None) -> None:
        """What the store answered (``None``: it records no limits)."""
        self._by_type = {} if recorded is None else bound_by_type(recorded)
        self._read_at = self._clock()

    def of(self, name: str) -> tuple[BoundLimit, ...]:
        return () if self._by_type is None else self._by_type.get(name, ())


@dataclass(frozen=True)
class RefState:
    """One of a task's refs as the store reports it now, and whether it is full."""

    ref: str
    definition: Limit | None
    held: int
    waiting: int

    @property
    def full(self) -> bool:
        """A concurrency ref with ``max`` holders. A rate ref's tokens are not reported: it is
        never called full here (its waiters say it refused a start)."""
        return isinstance(self.definition, Concurrency) and self.held >= self.definition.max

    def describe(self) -> str:
        d = self.definition
        if isinstance(d, Concurrency):
            state = "full" if self.full else "has room"
            return f"{self.ref}: {self.held} of {d.max} running ({state}), {self.waiting} waiting"
        if isinstance(d, RateLimit):
            return (f"{self.ref}: rate {d.rate:g} per {d.period:g}s (burst {d.burst}), "
                    f"{self.waiting} waiting")  # fmt: skip
        return f"{self.ref}: no recorded definition (limits nothing)"


def ref_states(
    refs: Iterable[str], usage: Iterable[LimitUsage], definitions: Mapping[str, str]
) -> list[RefState]:
    """Each of ``refs`` with its held/waiting (``limit_usage``) and its definition."""
    by_ref = {u.ref: u for u in usage}
    states = []
    for ref in refs:
        text = definitions.get(ref_limit_id(ref))
        try:
            limit = None if text is None else from_json(text)
        except ValueError:
            limit = None
        one = by_ref.get(ref)
        states.append(RefState(ref, limit, one.held if one else 0, one.waiting if one else 0))
    return states


def describe_definition(text: str) -> str:
    """A recorded definition in words: ``concurrency 2 per customer``, ``rate 100/1s``."""
    try:
        limit = from_json(text)
    except ValueError:
        return f"unreadable definition {text}"
    if isinstance(limit, Concurrency):
        per = f" per {limit.per}" if limit.per else ""
        return f"concurrency {limit.max}{per}"
    key = f" per {limit.key}" if limit.key else ""
    return f"rate {limit.rate:g}/{limit.period:g}s burst {limit.burst}{key}"


@dataclass(frozen=True)
class LimitRow:
    """One limit as ``chongming-redis limits``, the dashboard and ``/metrics`` show it: its
    definition, its held and waiting summed over its refs, and its busiest refs."""

    limit_id: str
    definition: str | None  # the recorded JSON; None: named by refs but not recorded
    held: int
    waiting: int
    busiest: tuple[LimitUsage, ...]
    #: How many of its refs have a holder or a waiter (``busiest`` shows the first few).
    refs: int

    @property
    def described(self) -> str:
        return "not recorded" if self.definition is None else describe_definition(self.definition)


#: The most refs ``limit_usage`` is asked for: the sums are over these (busiest first).
USAGE_READ = 10_000


def limit_rows(
    definitions: Mapping[str, str], usage: Iterable[LimitUsage], *, busiest: int = 5
) -> list[LimitRow]:
    """Every recorded limit (and any limit id a ref names without a recorded definition), by
    id, with its sums and its ``busiest`` refs (``usage`` comes busiest first)."""
    per: dict[str, list[LimitUsage]] = {limit_id: [] for limit_id in definitions}
    for one in usage:
        per.setdefault(one.limit_id, []).append(one)
    rows = []
    for limit_id, refs in sorted(per.items()):
        held, waiting = sum(u.held for u in refs), sum(u.waiting for u in refs)
        rows.append(LimitRow(limit_id, definitions.get(limit_id), held, waiting,
                             tuple(refs[:busiest]), len(refs)))  # fmt: skip
    return rows
