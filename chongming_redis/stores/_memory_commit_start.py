"""The in-memory reference of ``CommitStartStore``: ``commit_tasks`` then ``start_tasks``,
capped at the items that moved a task out of ``RUNNING``, under one hold of the store's
(re-entrant) lock, so no other call comes between them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores import _checks as check
from chongming_redis.stores._memory_batching import MemoryBatching
from chongming_redis.stores.commit_start import CommitItem


class MemoryCommitStart(MemoryBatching):
    """Mixed into ``InMemoryTaskStore``, over its ``commit_tasks`` and ``start_tasks``."""

    def commit_and_start(
        self,
        items: Sequence[CommitItem],
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> tuple[list[StoreError | None], list[TaskSnapshot] | StoreError]:
        """``CommitStartStore.commit_and_start`` (``stores/commit_start.py``)."""
        running = TaskStatus.RUNNING.value
        check.check_start(owner, now, lease_until, buckets, limit, names)  # before any write
        items = check.check_commit_items(items)
        with self._open():
            before = {snapshot.task_id: self._status_of(snapshot.task_id)
                      for snapshot, _, _ in items}  # fmt: skip
            results = self.commit_tasks(items)
            freed = sum(
                1
                for (snapshot, expect, _), result in zip(items, results)
                if result is None
                and expect is not None
                and before[snapshot.task_id] == running
                and snapshot.status is not TaskStatus.RUNNING
            )
            if not freed:
                return results, []
            return results, self.start_tasks(owner=owner, now=now, lease_until=lease_until,
                                             buckets=buckets, limit=min(limit, freed),
                                             names=names)  # fmt: skip

    def _status_of(self, task_id: str) -> object:
        row = self._tasks.get(task_id)
        return None if row is None else row["status"]
