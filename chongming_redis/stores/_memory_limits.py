"""The in-memory reference of the limits (``chongming_redis.limits``): the recorded definitions
and the admission check of ``start_tasks``. Not yet a declared extension: the runtime does not
give tasks limits until every store enforces them.

The holders of a concurrency ref are derived from the tasks themselves (those ``RUNNING`` or
``PAUSED`` whose refs name it), so every write that moves a task out of those statuses frees
its slot by construction: the reference cannot leak one. A rate ref's token bucket is the only
state of its own: ``(tokens, at_us)``, refilled lazily at each start on the store's clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from chongming_redis.limits import (
    Concurrency,
    Limit,
    LimitConflict,
    RateLimit,
    check_refs,
    from_json,
    ref_limit_id,
    refill,
    to_json,
)
from chongming_redis.model import TaskStatus
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

    if TYPE_CHECKING:

        def _open(self) -> AbstractContextManager[None]: ...

    def _init_limits(self) -> None:
        self._limit_defs, self._limit_types, self._token_buckets = {}, {}, {}
        self._limits_by_id = {}  # the definitions parsed once, when recorded

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
        checked = {limit_id: _definition(limit_id, text) for limit_id, text in definitions.items()}
        types = {name: tuple(check_refs(list(ids))) for name, ids in task_limits.items()}
        for name, ids in types.items():
            for limit_id in ids:
                if limit_id not in checked:
                    raise ValueError(f"task {name!r} names limit {limit_id!r}, not defined")
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
                continue
            for ref, lim in limits:
                if isinstance(lim, Concurrency):
                    held[ref] = held.get(ref, 0) + 1
                elif isinstance(lim, RateLimit):
                    tokens, at = self._tokens(ref, lim, now_us)
                    self._token_buckets[ref] = (tokens - 1.0, at)
            taken.append(row)
        return taken

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


def _definition(limit_id: str, text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"limit {limit_id!r}: a definition is limits.to_json text")
    check_refs([limit_id])
    return to_json(from_json(text))  # canonical: equal definitions are equal text
