"""``MemoryPolicies``: the task-policy duties of ``InMemoryTaskStore`` (``TaskPoliciesStore``
in ``stores/extensions.py``), the reference the other stores are checked against: unique ids
that live and die with their task, retention and the removal of tasks (shared with ``prune``).

The reference keeps no derived state for them: the holder of a unique id is the unfinished task
whose row names it, an expiry is ``updated_at + retention`` of a finished row, both found by a
scan under the store's lock. The other stores index both, written by the same atomic step that
moves the task; this one shows what those indexes must always agree with.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from chongming_redis.errors import UniqueTaken
from chongming_redis.model import TaskStatus
from chongming_redis.stores import _checks as check
from chongming_redis.stores._feed import MemoryFeed
from chongming_redis.stores.codec import Row, decode_dt, encode_dt
from chongming_redis.validation import check_dt, check_identifier

_FINAL = frozenset(s.value for s in TaskStatus if s.is_terminal)


def is_final(row: Row) -> bool:
    return row["status"] in _FINAL


def expiry_us(row: Row) -> int | None:
    """When a finished row expires (µs since the epoch), or ``None`` (unfinished, no
    retention)."""
    retention = row.get("retention_s")
    if retention is None or not is_final(row):
        return None
    return int(row["updated_at"]) + round(float(retention) * 1_000_000)  # type: ignore[arg-type]


class MemoryPolicies:
    _tasks: dict[str, Row]
    _history: dict[str, dict[int, Row]]
    _task_commands: dict[str, dict[str, None]]
    _feed: MemoryFeed

    if TYPE_CHECKING:  # provided by InMemoryTaskStore

        def _open(self) -> AbstractContextManager[None]: ...

        def _pinned(self, task_id: str) -> bool: ...

    # -- unique ids --------------------------------------------------------------------------

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            if row.get("unique_id") == unique and not is_final(row):
                return task_id
        return None

    def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None:
        """A write of ``row`` over ``previous`` (``None``: a create) that would give its unique
        id a second unfinished holder: created, moved back from a final status, or given a
        unique id it did not hold."""
        unique = row.get("unique_id")
        if unique is None or is_final(row):
            return None
        if previous is not None and not is_final(previous) and previous.get("unique_id") == unique:
            return None  # it holds it already
        holder = self._holder(str(unique))
        if holder is None or holder == row["task_id"]:
            return None
        return UniqueTaken(str(unique), holder)

    def unique_holder(self, unique: str) -> str | None:
        check_identifier(unique, "unique")
        with self._open():
            return self._holder(unique)

    # -- retention and removal ---------------------------------------------------------------

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        moment, size = check.check_expire(now, limit)
        cutoff = encode_dt(moment)
        with self._open():
            expired = sorted(
                (when, task_id)
                for task_id, row in self._tasks.items()
                if (when := expiry_us(row)) is not None
                and when <= cutoff
                and not self._pinned(task_id)
            )[:size]
            for _, task_id in expired:
                self._remove(task_id, moment)
            return [task_id for _, task_id in expired]

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        cutoff = encode_dt(check_dt(now, "now"))
        with self._open():
            expiries = [
                w
                for task_id, row in self._tasks.items()
                if (w := expiry_us(row)) is not None and not self._pinned(task_id)
            ]
        due = sum(1 for w in expiries if w <= cutoff)
        kept = [w for w in expiries if w > cutoff]
        return due, (decode_dt(min(kept)) if kept else None)

    def _remove(self, task_id: str, removed_at: datetime) -> None:
        """A task gone with its history and its command listing, a tombstone in the feed."""
        row = self._tasks.pop(task_id)
        self._feed.tombstone(task_id, str(row["name"]), int(row["bucket"]), removed_at)  # type: ignore[arg-type]
        self._history.pop(task_id, None)
        self._task_commands.pop(task_id, None)  # the commands stay, unlisted
