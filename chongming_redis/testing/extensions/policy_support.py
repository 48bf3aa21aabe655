"""What the task-policy sections of ``ExtensionsContract`` share (``task_policies``: the fields,
deadlines and unique ids; ``task_retention``: expiry): the tasks they write and the helpers that
move them through the store. Not a section itself."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta, timezone
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Tombstone, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.stores.extensions import (
    BatchingStore,
    TaskPoliciesStore,
)
from chongming_redis.stores.protocol import ChangeFeed
from chongming_redis.testing.contract.support import (
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
)

P, R, PA, OK = PENDING, RUNNING, PAUSED, SUCCEEDED

#: Every knob away from its default, classes and dotted names mixed (stored as names).
POLICY = RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=60, multiplier=3, jitter=0.25,
                     retry_on=(ValueError, "myapp.errors.Flaky"),
                     no_retry_on=(KeyError, "myapp.errors.Fatal"))  # fmt: skip
#: Retries nothing: empty tuples of names must come back empty, not as the defaults.
NEVER = RetryPolicy(max_attempts=1, retry_on=())
TZ = timezone(timedelta(hours=5, minutes=45))


def task(task_id: str, status: TaskStatus = P, version: int = 1, created: float = 0.0,
         **fields: Any) -> TaskSnapshot:  # fmt: skip
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, fields.pop("name", "job"), status, version, at(created), **fields)


def done(task_id: str, status: TaskStatus = OK, updated: float = 0.0,
         retention: float | None = None, **fields: Any) -> TaskSnapshot:  # fmt: skip
    """A task created finished at ``at(updated)``: it expires at ``at(updated + retention)``."""
    fields.setdefault("updated_at", at(updated))
    return task(task_id, status, 2, min(0.0, updated), retention=retention, **fields)


def entry(task_id: str, version: int, to: TaskStatus = P) -> Transition:
    return Transition(task_id, version, None if version == 1 else P, to, at(version))


class PolicySupport(ContractBase):
    # -- helpers -----------------------------------------------------------------------------

    def policies(self) -> TaskPoliciesStore | None:
        return self.store if isinstance(self.store, TaskPoliciesStore) else None

    def policy_batching(self) -> BatchingStore | None:
        return self.store if isinstance(self.store, BatchingStore) else None

    def move(
        self, task_id: str, status: TaskStatus, seconds: float, **changes: Any
    ) -> TaskSnapshot:
        """``save`` the task in ``status``, updated at ``at(seconds)``, one version up."""
        current = self.store.get(task_id)
        assert current is not None, task_id
        new = replace(current, status=status, status_version=current.status_version + 1,
                      updated_at=at(seconds), **changes)  # fmt: skip
        self.store.save(new, expect_version=current.status_version)
        return new

    def reopened(self, task_id: str, seconds: float) -> tuple[TaskSnapshot, int]:
        """What a retry by hand writes over a finished task: ``PENDING``, the next attempt."""
        current = self.store.get(task_id)
        assert current is not None and current.status.is_terminal, task_id
        new = replace(current, status=P, status_version=current.status_version + 1,
                      updated_at=at(seconds), attempt=current.attempt + 1)  # fmt: skip
        return new, current.status_version

    def feed_after(self, cursor: str) -> tuple[list[TaskSnapshot | Tombstone], str] | None:
        """Everything the change feed has after ``cursor`` and the cursor read up to, or
        ``None`` when the store has no feed."""
        if not isinstance(self.store, ChangeFeed):
            return None
        items: list[TaskSnapshot | Tombstone] = []
        for _ in range(1000):
            page = self.store.changes(after=cursor)
            if not page.tasks:
                return items, cursor
            items.extend(page.tasks)
            cursor = page.next_cursor
        raise AssertionError("the feed never returned an empty page")

    def holders(self, store: TaskPoliciesStore, *uniques: str) -> list[str | None]:
        return [store.unique_holder(u) for u in uniques]
