"""The in-memory reference of the limits (``chongming_redis.limits``): the recorded definitions
and the admission check of ``start_tasks``. Not yet a declared extension: the runtime does not
give tasks limits until every store enforces them.

The holders of a concurrency ref are derived from the tasks themselves (those ``RUNNING`` or
``PAUSED`` whose refs name it), so every write that moves a task out of those statuses frees
its slot by construction: the reference cannot leak one. A rate ref's token bucket is the only
state of its own: ``(tokens, at_us)``, refilled lazily at each start on the store's clock. The
waiters (tasks a start passed over, per ref) are kept as ids with the version they were passed
over at and read through the rows: one that started or left ``PENDING`` since (its version
moved on, even if it is ``PENDING`` again) is not counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from chongming_redis.limits import (
    Concurrency,
    Limit,
    LimitConflict,
    LimitUsage,
    RateLimit,
    from_json,
    ref_limit_id,
    refill,
)
from chongming_redis.model import TaskStatus
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import Row

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

_HOLDING = frozenset({TaskStatus.RUNNING.value, TaskStatus.PAUSED.value})


def refs_of(row: Row) -> tuple[str, ...]:
    text = row.get("limit_refs")
    return () if text is None else tuple(json.loads(str(text)))


class MemoryLimits:
    """Mixed into ``InMemoryTaskStore``; every method runs under the store's lock."""

    _tasks: dict[str, Row]
    _limit_defs: dict[str, str]
    _limits_by_id: dict[str, Limit]
    _limit_types: dict[str, tuple[str, ...]]
    _token_buckets: dict[str, tuple[float, int]]
    _limit_waiters: dict[str, dict[str, int]]

    if TYPE_CHECKING:

        def _open(self) -> AbstractContextManager[None]: ...

    def _init_limits(self) -> None:
        self._limit_defs, self._limit_types, self._token_buckets = {}, {}, {}
        self._limits_by_id = {}  # the definitions parsed once, when recorded
        self._limit_waiters = {}

    def record_limits(
        self,
        definitions: Mapping[str, str],
        task_limits: Mapping[str, Sequence[str]],
        *,
        replace: bool = False,
    ) -> None:
        """Record each limit's definition (id -> ``limits.to_json``) and each task type's limit
        ids, all or nothing: a recorded id with another definition is ``LimitConflict`` and
        nothing is written, unless ``replace``."""
        checked, types = check.check_record_limits(definitions, task_limits)
        with self._open():
            if not replace:
                for limit_id, text in checked.items():
                    recorded = self._limit_defs.get(limit_id)
                    if recorded is not None and recorded != text:
                        raise LimitConflict(limit_id, recorded, text)
            self._limit_defs.update(checked)
            self._limits_by_id.update({i: from_json(text) for i, text in checked.items()})
            self._limit_types.update(types)

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``(limit id -> definition JSON, task type -> its limit ids)`` as recorded."""
        with self._open():
            return dict(self._limit_defs), dict(self._limit_types)

    def _admit(self, ready: Iterable[Row], limit: int, now_us: int) -> list[Row]:
        """Of ``ready`` (due ``PENDING`` rows in start order), the first ``limit`` that their
        limits let start now, with the slots and tokens they take. A row a ref refuses is
        passed over, and so is every later row of that ref in this call (first come, first
        served within a ref); rows of other refs and without limits go on."""
        held = self._held_counts()
        refused: set[str] = set()
        taken: list[Row] = []
        for row in ready:
            if len(taken) == limit:
                break
            refs = refs_of(row)
            limits = [(ref, self._limit_of(ref)) for ref in refs]
            blocking = [ref for ref, lim in limits if ref in refused or
                        not self._has_room(ref, lim, held, now_us)]  # fmt: skip
            if blocking:
                refused.update(blocking)
                for ref in blocking:
                    waiters = self._limit_waiters.setdefault(ref, {})
                    waiters[str(row["task_id"])] = int(row["status_version"])  # type: ignore[arg-type]
                continue
            for waiters in self._limit_waiters.values():
                waiters.pop(str(row["task_id"]), None)
            for ref, lim in limits:
                if isinstance(lim, Concurrency):
                    held[ref] = held.get(ref, 0) + 1
                elif isinstance(lim, RateLimit):
                    tokens, at = self._tokens(ref, lim, now_us)
                    self._token_buckets[ref] = (tokens - 1.0, at)
            taken.append(row)
        return taken

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        """The refs with a holder or a waiter, busiest first (``LimitsStore``)."""
        size = check.check_usage_limit(limit)
        with self._open():
            held = {
                ref: n
                for ref, n in self._held_counts().items()
                if not isinstance(self._limit_of(ref), RateLimit)
            }  # a rate holds nothing
            waiting = {ref: sum(1 for task_id, version in ids.items()
                                if self._still_waiting(task_id, ref, version))
                       for ref, ids in self._limit_waiters.items()}  # fmt: skip
        refs = {ref for ref, n in held.items() if n} | {ref for ref, n in waiting.items() if n}
        usage = [LimitUsage(ref, held.get(ref, 0), waiting.get(ref, 0)) for ref in refs]
        usage.sort(key=lambda u: (-(u.held + u.waiting), u.ref))
        return usage[:size]

    def _still_waiting(self, task_id: str, ref: str, version: int) -> bool:
        """A waiter passed over at ``version`` still waits: no write has moved it since."""
        row = self._tasks.get(task_id)
        return (row is not None and row["status"] == TaskStatus.PENDING.value
                and row["status_version"] == version and ref in refs_of(row))  # fmt: skip

    def _limit_of(self, ref: str) -> Limit | None:
        return self._limits_by_id.get(ref_limit_id(ref))

    def _held_counts(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for row in self._tasks.values():
            if row["status"] in _HOLDING:
                for ref in refs_of(row):
                    held[ref] = held.get(ref, 0) + 1
        return held

    def _tokens(self, ref: str, lim: RateLimit, now_us: int) -> tuple[float, int]:
        """The bucket's tokens now and the moment they are counted to: a clock behind the last
        start refills nothing and never moves that moment back (no token counted twice)."""
        tokens, at = self._token_buckets.get(ref, (float(lim.burst or 1), now_us))
        if now_us <= at:
            return tokens, at
        return refill(tokens, at, now_us, lim), now_us

    def _has_room(self, ref: str, lim: Limit | None, held: dict[str, int], now_us: int) -> bool:
        if isinstance(lim, Concurrency):
            return held.get(ref, 0) < lim.max
        if isinstance(lim, RateLimit):
            return self._tokens(ref, lim, now_us)[0] >= 1.0
        return True  # a ref naming no recorded limit is not limited
