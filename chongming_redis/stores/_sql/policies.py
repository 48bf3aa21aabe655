"""``SqlPolicies``: the task-policy methods of every SQL store (``TaskPoliciesStore`` in
``stores/extensions.py``), mixed into ``SqlTaskStore``, and the SQL they run.

The duties on the existing writes live where the writes are (``tasks.py``: the unique id held
through the ``tasks_unique`` index, ``expires_at`` and the start's ``deadline`` written by the
statement that writes the row); what is here reads those indexes:

* ``expire_finished`` walks ``tasks_expiry`` (``expires_at, task_id``: earliest expiry first,
  the order of the in-memory reference) and removes what it picked as ``prune`` does
  (``tasks.remove``), in one write transaction;
* ``expiry_backlog`` counts the expired entries of that index and reads the first one after
  them; ``unique_holder`` reads ``tasks_unique``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from chongming_redis.errors import CorruptRecord
from chongming_redis.stores import _checks as check
from chongming_redis.stores._sql import tasks
from chongming_redis.stores._sql import unique as uniques
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import integer
from chongming_redis.stores._sql.schema import UNPINNED, Tx
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.validation import MAX_EPOCH_US, check_dt, check_identifier


class SqlPolicies:
    if TYPE_CHECKING:  # provided by SqlTaskStore

        def _writing(self) -> AbstractContextManager[tuple[Tx, FeedPositions]]: ...

        def _reading(self) -> AbstractContextManager[Tx]: ...

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        """``TaskPoliciesStore``: remove up to ``limit`` expired finished tasks, earliest
        expiry first, each with its history, tags, unique id and command listing, leaving
        the tombstones ``prune`` leaves (removed at ``now``)."""
        moment, size = check.check_expire(now, limit)
        with self._writing() as (tx, feed):
            return expire(tx, feed, moment, size)

    def unique_holder(self, unique: str) -> str | None:
        """``TaskPoliciesStore``: the unfinished task that holds ``unique``, or ``None``."""
        check_identifier(unique, "unique")
        with self._reading() as tx:
            return uniques.holder(tx, unique)

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        """``TaskPoliciesStore``: ``(expired by now and not yet removed, the earliest expiry
        still to come or None)``, from the expiry index (one consistent read)."""
        cutoff = encode_dt(check_dt(now, "now"))
        with self._reading() as tx:
            return backlog(tx, cutoff)


def expire(tx: Tx, feed: FeedPositions, now: datetime, limit: int) -> list[str]:
    """Pick (and lock) the first ``limit`` expired tasks by ``(expires_at, task_id)`` and
    remove them; returns their ids in that order. Only a final task with a retention has an
    ``expires_at``, so nothing unfinished or kept forever is ever picked; a parent of an
    unfinished child is passed over (``schema.UNPINNED``) until that child ends."""
    feed.lock()  # the head before any task row (FeedPositions.lock)
    doomed = tx.rows(
        "SELECT task_id, name, bucket FROM tasks WHERE expires_at IS NOT NULL"
        f" AND expires_at <= ? AND {UNPINNED}"
        f" ORDER BY expires_at, task_id LIMIT ?{tx.dialect.for_update}",
        [encode_dt(now), limit],
    )
    return tasks.remove(tx, feed, doomed, now)


def backlog(tx: Tx, cutoff: int) -> tuple[int, datetime | None]:
    ((due,),) = tx.rows(
        "SELECT COUNT(*) FROM tasks WHERE expires_at IS NOT NULL AND expires_at <= ?"
        f" AND {UNPINNED}",
        [cutoff],
    )
    ((first,),) = tx.rows(
        "SELECT MIN(expires_at) FROM tasks WHERE expires_at IS NOT NULL AND expires_at > ?"
        f" AND {UNPINNED}",
        [cutoff],
    )
    return int(due), None if first is None else _expiry(first)


def _expiry(value: object) -> datetime:
    micros = integer(value, "tasks", "expires_at")
    if micros < 0:  # every write derives it from a stored updated_at: not a value we wrote
        raise CorruptRecord("tasks", "expires_at", f"negative expiry {micros}")
    # A long retention of a task updated near the end of the storable range (2255) expires
    # beyond it: reported as that end, when it is as good as never.
    return decode_dt(min(micros, MAX_EPOCH_US))
