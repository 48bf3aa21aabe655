"""The in-memory reference of ``BatchingStore`` (``stores/extensions.py``): ``commit_tasks``
(each item's create or compare-and-set save with its history, judged as the Redis script
judges it: the version against the state before the call, the unique id and the parents after
the items before it) and ``start_tasks`` (due ``PENDING`` tasks in start order, the limits
admitted), each one critical section under the store's lock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from chongming_redis.errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition, start_rank
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    PARENT_COLUMNS,
    Row,
    encode_dt,
    row_to_snapshot,
    snapshot_to_row,
    transition_to_row,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from contextlib import AbstractContextManager

    from chongming_redis.stores._feed import MemoryFeed

#: What a save keeps of the stored row: the lease (``touch`` writes it) and the parents (fixed
#: at creation, ``DependenciesStore``).
KEPT_ON_SAVE = (*LEASE_COLUMNS, *PARENT_COLUMNS)


class MemoryBatching:
    """Mixed into ``InMemoryTaskStore``; every method runs under the store's lock."""

    _tasks: dict[str, Row]
    _history: dict[str, dict[int, Row]]
    _limit_defs: dict[str, str]

    if TYPE_CHECKING:
        _feed: MemoryFeed

        def _open(self) -> AbstractContextManager[None]: ...

        def _unique_error(self, row: Row, previous: Row | None) -> StoreError | None: ...

        def _dependency_error(self, row: Row, current: Row | None) -> StoreError | None: ...

        def _dependencies_written(self, task_id: str, previous: Row | None) -> None: ...

        def _admit(self, ready: Iterable[Row], limit: int, now_us: int) -> list[Row]: ...

    def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """Create or save each task with its history, each item atomically; a failed item
        writes nothing (see ``BatchingStore.commit_tasks``)."""
        prepared = [
            (snapshot_to_row(task), expect, [transition_to_row(t) for t in entries])
            for task, expect, entries in check.check_commit_items(items)
        ]
        with self._open():
            # Every item's version is judged against the state before the call, as the Redis
            # script does (a task appears once per call, so that is the state when the item is
            # applied, unless a release by an earlier item moved it: then it conflicts); its
            # unique id and its parents as the items before it were applied (in order).
            results: list[StoreError | None] = []
            for row, expect, entries in prepared:
                task_id = str(row["task_id"])
                current = self._tasks.get(task_id)
                error = (self._commit_error(row, expect) or self._commit_unique_error(row, current)
                         or self._dependency_error(row, current))  # fmt: skip
                results.append(error)
                if error is not None:
                    continue
                if current is not None:  # a save never writes the lease or the parents
                    for column in KEPT_ON_SAVE:
                        row[column] = current[column]
                self._tasks[task_id] = row
                self._feed.move(task_id)
                history = self._history.setdefault(task_id, {})
                for entry in entries:
                    history.setdefault(int(entry["version"]), entry)  # type: ignore[arg-type]
                self._dependencies_written(task_id, current)
            return results

    def _commit_error(self, row: Row, expect: int | None) -> StoreError | None:
        task_id = str(row["task_id"])
        current = self._tasks.get(task_id)
        if expect is None:
            return TaskAlreadyExists(task_id) if current is not None else None
        actual = None if current is None else current["status_version"]
        if actual != expect:
            return ConcurrencyConflict(task_id, expect, actual)  # type: ignore[arg-type]
        return None

    def _commit_unique_error(self, row: Row, current: Row | None) -> StoreError | None:
        """An item's unique id, judged after the items before it in its call."""
        return self._unique_error(row, current)

    def start_tasks(
        self,
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> list[TaskSnapshot]:
        """Start up to ``limit`` due ``PENDING`` tasks in start order (``model.start_rank``:
        higher priority, then due earliest), each with its lease,
        heartbeat and history entry (see ``BatchingStore.start_tasks``)."""
        wanted, types = check.check_start(owner, now, lease_until, buckets, limit, names)
        moment, until = encode_dt(now), encode_dt(lease_until)
        in_buckets, of_types = frozenset(wanted), frozenset(types)
        with self._open():
            ready = [
                row
                for row in self._tasks.values()
                if row["status"] == TaskStatus.PENDING.value
                and row["bucket"] in in_buckets
                and (not of_types or row["name"] in of_types)
                and (row["not_before"] is None or row["not_before"] <= moment)  # type: ignore[operator]
            ]
            ready.sort(key=_start_rank)
            started = []
            # Limits are judged on the earlier of the caller's clock and this process's.
            admitted = (
                ready[:limit]
                if not self._limit_defs
                else self._admit(
                    ready, limit, min(int(moment), encode_dt(datetime.now(timezone.utc)))
                )
            )
            for row in admitted:
                version = int(row["status_version"]) + 1  # type: ignore[arg-type]
                row.update(status=TaskStatus.RUNNING.value, status_version=version,
                           updated_at=moment, heartbeat_at=moment, lease_owner=owner,
                           lease_until=until)  # fmt: skip
                if row.get("timeout_s") is not None:  # this attempt's deadline
                    row["deadline"] = moment + round(float(row["timeout_s"]) * 1_000_000)  # type: ignore[arg-type]
                task_id = str(row["task_id"])
                self._feed.move(task_id)
                reason = f"started by {owner} (attempt {int(row['attempt'])})"  # type: ignore[arg-type]
                entry = Transition(task_id, version, TaskStatus.PENDING, TaskStatus.RUNNING,
                                   now, reason)  # fmt: skip
                history = self._history.setdefault(task_id, {})
                history.setdefault(version, transition_to_row(entry))
                started.append(row_to_snapshot(row))
            return started


def _start_rank(row: Row) -> tuple[int, int, str]:
    not_before = row["not_before"]
    return start_rank(
        int(row.get("priority") or 0),
        int(row["created_at"]),  # type: ignore[arg-type]
        None if not_before is None else int(not_before),
        str(row["task_id"]),
    )
