"""Broken extension stores: each breaks one rule of ``stores/extensions.py``.

Every class is a small subclass of ``InMemoryTaskStore`` (the reference) that keeps its
signatures and its extensions (``EXPECTED``, the reference's), and breaks exactly one rule the
extension docstrings state. ``CAUGHT_BY`` names the ``ExtensionsContract`` test that pins that
rule; ``test_extensions_teeth.py`` requires that very test to fail on the store.

Two rules (``start_tasks`` and ``bucket_counts``) are easier to break on a rebuilt version:
``_Starter`` starts tasks with the protocol's own calls and ``_Counting`` keeps its own bucket
tally, each with one hook per rule. Both are sound as written (``SOUND``): the contract passes
them, so a failure on a subclass is the one hook it changes.

The broken stores of the dashboard reads (keyset paging, a task's commands, the command
backlog) are in ``tests/broken_dashboard_stores.py``, those of the task policies (the policy
fields' round trip, the start's deadline, unique ids, retention) in
``tests/broken_policy_stores.py``, those of the limits in ``tests/broken_limit_stores.py``;
their tables are merged into these.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chongming_redis.errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
    start_rank,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import encode_dt as snapshot_to_row_dt
from chongming_redis.stores.codec import snapshot_to_row
from chongming_redis.stores.extensions import CommitItem
from chongming_redis.stores.memory import InMemoryTaskStore
from tests import (
    broken_dashboard_stores,
    broken_limit_stores,
    broken_policy_stores,
    broken_schedule_stores,
)

EXPECTED = frozenset(
    {
        "BatchingStore",
        "FencedTouchStore",
        "ServerClockStore",
        "BucketCountingStore",
        "CommandReadingStore",
        "TaskTypesStore",
        "PagedQueryStore",
        "CommandInspectingStore",
        "TaskPoliciesStore",
        "LimitsStore",
        "SchedulesStore",
    }
)
P, R, PA = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED


def _ids(items: Sequence[CommitItem]) -> list[str]:
    return [item[0].task_id for item in items]


# -- BatchingStore.commit_tasks ------------------------------------------------------------


class CommitFailedItemWritesHistory(InMemoryTaskStore):
    """commit_tasks appends an item's history entries even when its snapshot was refused."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results = super().commit_tasks(items)
        for (_, _, entries), error in zip(items, results):
            for entry in entries if error is not None else ():
                self.append(entry)
        return results


class CommitAllowsATaskTwice(InMemoryTaskStore):
    """commit_tasks takes a task named twice in one call, one item after the other (on Redis
    both items were judged against the state before the call: the feed got the task twice)."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results: list[StoreError | None] = []
        for item in items:
            results += super().commit_tasks([item])
        return results


class CommitSaveWritesTheLease(InMemoryTaskStore):
    """commit_tasks saves the snapshot's lease columns too, over the lease touch wrote."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results = super().commit_tasks(items)
        for (snapshot, expect, _), error in zip(items, results):
            if expect is not None and error is None:
                owner, until = snapshot.lease_owner, snapshot.lease_until
                self.touch(snapshot.task_id, lease_owner=owner, lease_until=until)
        return results


class CommitCreateDropsTheLease(InMemoryTaskStore):
    """commit_tasks creates without the lease columns, as a save would."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        bare = [
            (replace(s, lease_owner=None, lease_until=None) if e is None else s, e, t)
            for s, e, t in items
        ]
        return super().commit_tasks(bare)


class CommitCreateSkipsItsHistory(InMemoryTaskStore):
    """commit_tasks writes the history of saves only: a created task has none."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        checked = check.check_commit_items(items)
        return super().commit_tasks([(s, e, t if e is not None else []) for s, e, t in checked])


class CommitAConflictAbortsTheBatch(InMemoryTaskStore):
    """commit_tasks is all or nothing: one failing item and no item is written (the others
    still report None)."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        check.check_commit_items(items)
        errors: list[StoreError | None] = []
        for snapshot, expect, _ in items:
            current = self.get(snapshot.task_id)
            actual = None if current is None else current.status_version
            if expect is None:
                errors.append(None if current is None else TaskAlreadyExists(snapshot.task_id))
            else:
                ok = actual == expect
                errors.append(None if ok else ConcurrencyConflict(snapshot.task_id, expect, actual))
        return errors if any(errors) else super().commit_tasks(items)


class CommitIgnoresTheExpectedVersion(InMemoryTaskStore):
    """commit_tasks saves over whatever version is stored (last writer wins)."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        forced: list[CommitItem] = []
        for snapshot, expect, entries in items:
            current = self.get(snapshot.task_id) if expect is not None else None
            if current is not None and current.status_version < snapshot.status_version:
                expect = current.status_version
            forced.append((snapshot, expect, entries))
        return super().commit_tasks(forced)


class CommitMissingTaskReportsVersionZero(InMemoryTaskStore):
    """commit_tasks reports a missing task as ConcurrencyConflict(actual=0), not None."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        return [
            ConcurrencyConflict(e.task_id, e.expected, 0)
            if isinstance(e, ConcurrencyConflict) and e.actual is None
            else e
            for e in super().commit_tasks(items)
        ]


class CommitCreateOverwritesAnExistingTask(InMemoryTaskStore):
    """commit_tasks reports TaskAlreadyExists but has already written the new snapshot."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results = super().commit_tasks(items)
        for (snapshot, _, _), error in zip(items, results):
            if isinstance(error, TaskAlreadyExists):
                with self._open():
                    self._tasks[snapshot.task_id] = snapshot_to_row(snapshot)
        return results


class CommitReplacesKeptHistoryEntries(InMemoryTaskStore):
    """commit_tasks overwrites a history entry already there instead of keeping it."""

    def __init__(self) -> None:
        super().__init__()
        self._replaced: dict[tuple[str, int], Transition] = {}

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        ids = _ids(check.check_commit_items(items))
        before = {i: {t.version for t in self.history(i)} for i in ids}
        results = super().commit_tasks(items)
        for (snapshot, _, entries), error in zip(items, results):
            for entry in entries if error is None else ():
                if entry.version in before[snapshot.task_id]:
                    self._replaced[(entry.task_id, entry.version)] = entry
        return results

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        found = super().history(task_id, since_version=since_version)
        return [self._replaced.get((t.task_id, t.version), t) for t in found]


class CommitAppendsDuplicateEntries(InMemoryTaskStore):
    """commit_tasks appends every entry, so a version already in the history is listed twice."""

    def __init__(self) -> None:
        super().__init__()
        self._extra: dict[str, list[Transition]] = {}

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        ids = _ids(check.check_commit_items(items))
        before = {i: {t.version for t in self.history(i)} for i in ids}
        results = super().commit_tasks(items)
        for (snapshot, _, entries), error in zip(items, results):
            for entry in entries if error is None else ():
                if entry.version in before[snapshot.task_id]:
                    self._extra.setdefault(entry.task_id, []).append(entry)
        return results

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        found = super().history(task_id, since_version=since_version)
        extra = [t for t in self._extra.get(task_id, []) if t.version > since_version]
        return sorted(found + extra, key=lambda t: t.version)


class CommitSkipsTheTransitionTaskCheck(InMemoryTaskStore):
    """commit_tasks drops a transition of another task instead of refusing the call."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        own: list[CommitItem] = []
        for item in items:
            if isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], TaskSnapshot):
                snapshot, expect, entries = item
                mine = [t for t in entries if getattr(t, "task_id", None) == snapshot.task_id]
                item = (snapshot, expect, mine)
            own.append(item)
        return super().commit_tasks(own)


class CommitWritesItemsBeforeCheckingTheNext(InMemoryTaskStore):
    """commit_tasks checks and writes one item at a time: a bad item leaves the earlier
    ones written."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        if not isinstance(items, (list, tuple)) or not items:
            return super().commit_tasks(items)
        results: list[StoreError | None] = []
        for item in items:
            results += super().commit_tasks([item])
        return results


class CommitOfNothingWorksAfterClose(InMemoryTaskStore):
    """commit_tasks([]) returns [] before checking whether the store is closed."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        return [] if isinstance(items, list) and not items else super().commit_tasks(items)


# -- BatchingStore.start_tasks -------------------------------------------------------------


class _Starter(InMemoryTaskStore):
    """start_tasks rebuilt from query, save, touch and append, one hook per rule."""

    startable: frozenset[TaskStatus] = frozenset({P})
    step = 1

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
        wanted, types = check.check_start(owner, now, lease_until, buckets, limit, names)
        candidates = self.query(TaskQuery(statuses=self.startable))
        ready = [s for s in candidates if self.eligible(s, now, wanted, types)]
        self.start_now = min(now, datetime.now(timezone.utc))  # what the limits are judged on
        return [self.start_one(s, owner, now, lease_until) for s in self.pick(ready, limit)]

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return (
            s.bucket in wanted
            and (not types or s.name in types)
            and (s.not_before is None or s.not_before <= now)
        )

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        ordered = sorted(ready, key=_rank)
        if not self._limit_defs:
            return ordered[:limit]
        # The limits (LimitsStore) are the reference's, judged on its rows.
        rows = [self._tasks[s.task_id] for s in ordered]
        admitted = self._admit(rows, limit, snapshot_to_row_dt(self.start_now))
        chosen = {str(row["task_id"]) for row in admitted}
        return [s for s in ordered if s.task_id in chosen]

    def start_one(
        self, s: TaskSnapshot, owner: str, now: datetime, until: datetime
    ) -> TaskSnapshot:
        self.save(self.running(s, now), expect_version=s.status_version)
        self.lease(s.task_id, owner, now, until)
        self.record(s, owner, now)
        started = self.get(s.task_id)
        assert started is not None
        return started

    def running(self, s: TaskSnapshot, now: datetime) -> TaskSnapshot:
        deadline = s.deadline if s.timeout is None else now + timedelta(seconds=s.timeout)
        return replace(s, status=R, status_version=s.status_version + self.step, updated_at=now,
                       deadline=deadline)  # fmt: skip

    def lease(self, task_id: str, owner: str, now: datetime, until: datetime) -> None:
        self.touch(task_id, heartbeat_at=now, lease_owner=owner, lease_until=until)

    def record(self, s: TaskSnapshot, owner: str, now: datetime) -> None:
        reason = f"started by {owner} (attempt {s.attempt})"
        self.append(Transition(s.task_id, s.status_version + self.step, P, R, now, reason))


def _rank(s: TaskSnapshot) -> tuple[int, int, str]:
    nb = None if s.not_before is None else snapshot_to_row_dt(s.not_before)
    return start_rank(s.priority, snapshot_to_row_dt(s.created_at), nb, s.task_id)


class StartLooksOnlyAtTheOldestFew(_Starter):
    """start_tasks takes the oldest 2 * limit PENDING tasks of each bucket by created_at and
    skips those not yet due, looking no further: delayed tasks at the head stall due ones
    (the Redis store's defect before its start queues)."""

    def start_tasks(self, *, owner: str, now: datetime, lease_until: datetime,
                    buckets: Sequence[int], limit: int = 50,
                    names: Sequence[str] = ()) -> list[TaskSnapshot]:  # fmt: skip
        wanted, types = check.check_start(owner, now, lease_until, buckets, limit, names)
        heads: list[TaskSnapshot] = []
        for b in wanted:
            query = TaskQuery(statuses=frozenset({P}), buckets=frozenset({b}), limit=2 * limit)
            heads += [s for s in self.query(query) if self.eligible(s, now, wanted, types)]
        return [self.start_one(s, owner, now, lease_until) for s in self.pick(heads, limit)]


class StartIgnoresPriority(_Starter):
    """start_tasks starts the oldest due tasks whatever their priority."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return super().pick([replace(s, priority=0) for s in ready], limit)


class StartLowPriorityFirst(_Starter):
    """start_tasks reads priority the other way round (lower first, BullMQ's convention)."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return sorted(ready, key=lambda s: _rank(replace(s, priority=-s.priority)))[:limit]


class StartOrdersByCreatedNotByDue(_Starter):
    """start_tasks orders equal priorities by created_at, so a retry due later (an old task
    with a backoff) jumps ahead of tasks that were waiting before it came due."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return sorted(ready, key=lambda s: (-s.priority, s.created_at, s.task_id))[:limit]


class StartBreaksTiesNewestFirst(_Starter):
    """start_tasks orders equal priorities last come, first served."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        def key(s: TaskSnapshot) -> tuple[int, int, str]:
            rank = _rank(s)
            return (rank[0], -rank[1], rank[2])

        return sorted(ready, key=key)[:limit]


class StartForgetsThePriorityOfADelayedTask(_Starter):
    """start_tasks ranks a task that had a not_before as priority 0 once it is due (a
    promotion from the delayed queue that drops the priority)."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        flat = [replace(s, priority=0) if s.not_before is not None else s for s in ready]
        order = [s.task_id for s in sorted(flat, key=_rank)[:limit]]
        return sorted(
            (s for s in ready if s.task_id in order), key=lambda s: order.index(s.task_id)
        )


class StartOrderKeepsThePriorityOfTheCreate(_Starter):
    """start_tasks ranks each task by the priority it was created with: a save that changes
    it does not move the task (a start queue not kept in step with the task)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        self.__dict__.setdefault("created_priority", {})[snapshot.task_id] = snapshot.priority

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        first = self.__dict__.get("created_priority", {})
        return sorted(ready, key=lambda s: _rank(replace(s, priority=first.get(s.task_id, 0))))[
            :limit
        ]


class StartReadsAFewPerBucket(_Starter):
    """start_tasks merges only the first ceil(2 * limit / buckets) due tasks of each bucket
    (at least 2): the best tasks crowded in one bucket lose to worse ones elsewhere."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        buckets = sorted({s.bucket for s in ready})
        each = max(2, -(-2 * limit // max(1, len(buckets))))
        heads = [s for b in buckets for s in sorted((r for r in ready if r.bucket == b),
                                                     key=_rank)[:each]]  # fmt: skip
        return sorted(heads, key=_rank)[:limit]


class StartPromotesDelayedByDueTime(_Starter):
    """start_tasks lets only the `limit` earliest-due of the delayed tasks that came due compete
    (a promotion that moves a few at a time, by not_before): a higher priority due later
    waits behind them."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        delayed = sorted((s for s in ready if s.not_before is not None),
                         key=lambda s: (s.not_before, s.task_id))  # fmt: skip
        promoted = {s.task_id for s in delayed[:limit]}
        keep = [s for s in ready if s.not_before is None or s.task_id in promoted]
        return sorted(keep, key=_rank)[:limit]


class SaveDropsThePriority(InMemoryTaskStore):
    """save writes every field but the priority (back to 0): a retry loses its priority."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(replace(snapshot, priority=0), expect_version=expect_version)


class StartIgnoresNotBefore(_Starter):
    """start_tasks starts a task whose not_before is still in the future."""

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return super().eligible(replace(s, not_before=None), now, wanted, types)


class StartNotBeforeIsExclusive(_Starter):
    """start_tasks waits until now > not_before: a task due exactly now is left."""

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return super().eligible(s, now, wanted, types) and s.not_before != now


class StartIgnoresBuckets(_Starter):
    """start_tasks starts pending tasks of any bucket."""

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return super().eligible(s, now, [s.bucket] if wanted else [], types)


class StartWithNoBucketsMeansAll(_Starter):
    """start_tasks(buckets=[]) starts tasks of every bucket instead of none."""

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return super().eligible(s, now, wanted or [s.bucket], types)


class StartIgnoresNames(_Starter):
    """start_tasks starts tasks of any name."""

    def eligible(self, s: TaskSnapshot, now: datetime, wanted: list[int], types: list[str]) -> bool:
        return super().eligible(s, now, wanted, [])


class StartTakesPausedTasks(_Starter):
    """start_tasks starts PAUSED tasks too."""

    startable = frozenset({P, PA})

    def running(self, s: TaskSnapshot, now: datetime) -> TaskSnapshot:
        return super().running(replace(s, status=P), now)


class StartRestartsRunningTasks(_Starter):
    """start_tasks takes RUNNING tasks again (a second caller steals a started task)."""

    startable = frozenset({P, R})


class StartOneMoreThanLimit(_Starter):
    """start_tasks starts limit + 1 tasks (an inclusive range end)."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return super().pick(ready, limit + 1)


class StartNewestFirst(_Starter):
    """start_tasks starts the newest tasks first."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return sorted(ready, key=lambda s: (s.created_at, s.task_id), reverse=True)[:limit]


class StartInTaskIdOrder(_Starter):
    """start_tasks orders by task_id alone, ignoring created_at."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return sorted(ready, key=lambda s: s.task_id)[:limit]


class StartTakesBucketsOneAfterAnother(_Starter):
    """start_tasks drains the buckets in order (lowest first) instead of taking the oldest
    tasks across them."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        return sorted(ready, key=lambda s: (s.bucket, s.created_at, s.task_id))[:limit]


class StartLimitsEachBucket(_Starter):
    """start_tasks applies limit to each bucket, so several buckets start more than limit."""

    def pick(self, ready: list[TaskSnapshot], limit: int) -> list[TaskSnapshot]:
        picked: list[TaskSnapshot] = []
        for bucket in sorted({s.bucket for s in ready}):
            picked += super().pick([s for s in ready if s.bucket == bucket], limit)
        return sorted(picked, key=lambda s: (s.created_at, s.task_id))


class StartBumpsTheVersionTwice(_Starter):
    """start_tasks adds 2 to status_version (and records that version)."""

    step = 2


class StartWritesNoHistory(_Starter):
    """start_tasks writes no history entry."""

    def record(self, s: TaskSnapshot, owner: str, now: datetime) -> None:
        pass


class StartReasonCountsTheNextAttempt(_Starter):
    """start_tasks' history entry names attempt + 1."""

    def record(self, s: TaskSnapshot, owner: str, now: datetime) -> None:
        super().record(replace(s, attempt=s.attempt + 1), owner, now)


class StartSetsNoLease(_Starter):
    """start_tasks writes the heartbeat but not the lease."""

    def lease(self, task_id: str, owner: str, now: datetime, until: datetime) -> None:
        self.touch(task_id, heartbeat_at=now)


class StartSetsNoHeartbeat(_Starter):
    """start_tasks writes the lease but not heartbeat_at."""

    def lease(self, task_id: str, owner: str, now: datetime, until: datetime) -> None:
        self.touch(task_id, lease_owner=owner, lease_until=until)


class StartKeepsUpdatedAt(_Starter):
    """start_tasks leaves updated_at as it was."""

    def running(self, s: TaskSnapshot, now: datetime) -> TaskSnapshot:
        return replace(super().running(s, now), updated_at=s.updated_at)


class StartResetsProgress(_Starter):
    """start_tasks clears the progress a previous attempt reported."""

    def running(self, s: TaskSnapshot, now: datetime) -> TaskSnapshot:
        return replace(super().running(s, now), progress=None)


class StartReturnsTheTasksAsTheyWere(_Starter):
    """start_tasks returns the pending snapshots it read, not the started ones."""

    def start_one(
        self, s: TaskSnapshot, owner: str, now: datetime, until: datetime
    ) -> TaskSnapshot:
        super().start_one(s, owner, now, until)
        return s


class StartAllowsLimitsAbove100(InMemoryTaskStore):
    """start_tasks caps a limit above 100 instead of refusing it."""

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
        limit = min(limit, 100) if isinstance(limit, int) else limit
        return super().start_tasks(owner=owner, now=now, lease_until=lease_until,
                                   buckets=buckets, limit=limit, names=names)  # fmt: skip


# -- FencedTouchStore.touch_fenced ---------------------------------------------------------


class _Fenced(InMemoryTaskStore):
    def fenced(
        self,
        task_id: str,
        expect_version: int,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> bool:
        return super().touch_fenced(task_id, expect_version=expect_version, progress=progress,
                                    heartbeat_at=heartbeat_at, lease_owner=lease_owner,
                                    lease_until=lease_until)  # fmt: skip

    def plain(
        self,
        task_id: str,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> None:
        self.touch(task_id, progress=progress, heartbeat_at=heartbeat_at,
                   lease_owner=lease_owner, lease_until=lease_until)  # fmt: skip


class FencedTouchIgnoresTheVersion(_Fenced):
    """touch_fenced is a plain touch: it applies on any version."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        check.require(expect_version, int, "expect_version")
        self.plain(task_id, progress, heartbeat_at, lease_owner, lease_until)
        return self.get(task_id) is not None


class FencedTouchWritesOnAMismatch(_Fenced):
    """touch_fenced returns False on another version, but has written the fields anyway."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        applied = self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                              lease_until)  # fmt: skip
        if not applied and self.get(task_id) is not None:
            self.plain(task_id, progress, heartbeat_at, lease_owner, lease_until)
        return applied


class FencedTouchBumpsTheVersion(_Fenced):
    """touch_fenced adds 1 to status_version when it applies."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        applied = self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                              lease_until)  # fmt: skip
        current = self.get(task_id)
        if applied and current is not None:
            bumped = replace(current, status_version=current.status_version + 1)
            self.save(bumped, expect_version=current.status_version)
        return applied


class FencedTouchIsTrueForAMissingTask(_Fenced):
    """touch_fenced returns True for a task that does not exist."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        applied = self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                              lease_until)  # fmt: skip
        return applied or self.get(task_id) is None


class FencedTouchClearsTheLeaseItWasNotGiven(_Fenced):
    """touch_fenced writes every lease column: one it was not given is cleared."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        applied = self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                              lease_until)  # fmt: skip
        if applied and lease_owner is None:
            with self._open():
                self._tasks[task_id].update(lease_owner=None, lease_until=None)
        return applied


class FencedTouchChecksTheLeaseOwner(_Fenced):
    """touch_fenced also refuses while another owner's lease is stored."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        current = self.get(task_id)
        held = None if current is None else current.lease_owner
        if lease_owner is not None and held not in (None, lease_owner):
            return False
        return self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                           lease_until)  # fmt: skip


class FencedTouchSkipsFinishedTasks(_Fenced):
    """touch_fenced also refuses a task in a terminal status."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        current = self.get(task_id)
        if current is not None and current.status.is_terminal:
            return False
        return self.fenced(task_id, expect_version, progress, heartbeat_at, lease_owner,
                           lease_until)  # fmt: skip


class FencedTouchAcceptsAStringVersion(_Fenced):
    """touch_fenced converts expect_version with int() instead of refusing a str."""

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        return self.fenced(task_id, int(expect_version), progress, heartbeat_at, lease_owner,
                           lease_until)  # fmt: skip


# -- ServerClockStore.server_time ----------------------------------------------------------


class ServerTimeIsNaive(InMemoryTaskStore):
    """server_time returns a naive datetime."""

    def server_time(self) -> datetime:
        super().server_time()
        return datetime.now()


class ServerTimeInAnotherOffset(InMemoryTaskStore):
    """server_time returns the right instant, but in UTC+8 rather than UTC."""

    def server_time(self) -> datetime:
        return super().server_time().astimezone(timezone(timedelta(hours=8)))


class ServerTimeWorksAfterClose(InMemoryTaskStore):
    """server_time reads the clock without checking that the store is open."""

    def server_time(self) -> datetime:
        return datetime.now(timezone.utc)


# -- BucketCountingStore.bucket_counts -----------------------------------------------------


class _Counting(InMemoryTaskStore):
    """bucket_counts from a tally of its own, refreshed by each write it follows."""

    follows = frozenset({"create", "save", "commit_tasks", "start_tasks", "prune"})

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, tuple[int, TaskStatus]] = {}

    def note(self, write: str, *task_ids: str) -> None:
        if write not in self.follows:
            return
        for task_id in task_ids:
            s = self.get(task_id)
            if s is None:
                self._seen.pop(task_id, None)
            else:
                self._seen[task_id] = (self.bucket_of(task_id, s), s.status)

    def bucket_of(self, task_id: str, s: TaskSnapshot) -> int:
        return s.bucket

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        self.note("create", snapshot.task_id)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        self.note("save", snapshot.task_id)

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results = super().commit_tasks(items)
        self.note("commit_tasks", *_ids(items))
        return results

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
        started = super().start_tasks(owner=owner, now=now, lease_until=lease_until,
                                      buckets=buckets, limit=limit, names=names)  # fmt: skip
        self.note("start_tasks", *(s.task_id for s in started))
        return started

    def prune(self, *, keep_terminal: int) -> int:
        pruned = super().prune(keep_terminal=keep_terminal)
        self.note("prune", *list(self._seen))
        return pruned

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        self.counts()  # StoreClosed once closed
        result: dict[int, dict[TaskStatus, int]] = {}
        for bucket, status in self._seen.values():
            result.setdefault(bucket, dict.fromkeys(TaskStatus, 0))[status] += 1
        return result


class BucketCountsOmitZeroStatuses(_Counting):
    """bucket_counts lists only the statuses a bucket has tasks in."""

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        found = super().bucket_counts().items()
        return {bucket: {s: n for s, n in per.items() if n} for bucket, per in found}


class BucketCountsIgnoreSave(_Counting):
    """bucket_counts does not follow save."""

    follows = _Counting.follows - {"save"}


class BucketCountsIgnoreCommit(_Counting):
    """bucket_counts does not follow commit_tasks."""

    follows = _Counting.follows - {"commit_tasks"}


class BucketCountsIgnoreStart(_Counting):
    """bucket_counts does not follow start_tasks."""

    follows = _Counting.follows - {"start_tasks"}


class BucketCountsIgnorePrune(_Counting):
    """bucket_counts still counts the tasks prune deleted."""

    follows = _Counting.follows - {"prune"}


class BucketCountsKeepTheCreatedBucket(_Counting):
    """bucket_counts counts a task in the bucket it was created in, even after a write that
    moved it to another bucket."""

    def bucket_of(self, task_id: str, s: TaskSnapshot) -> int:
        seen = self._seen.get(task_id)
        return s.bucket if seen is None else seen[0]


class BucketCountsWorkAfterClose(_Counting):
    """bucket_counts answers from its tally after close."""

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        result: dict[int, dict[TaskStatus, int]] = {}
        for bucket, status in self._seen.values():
            result.setdefault(bucket, dict.fromkeys(TaskStatus, 0))[status] += 1
        return result


# -- which extensions ----------------------------------------------------------------------


class LostTheServerClock(InMemoryTaskStore):
    """server_time was renamed away: the store silently stops being a ServerClockStore."""

    server_time = None  # type: ignore[assignment]


class ClaimsAHalfFinishedPool(InMemoryTaskStore):
    """pool_tick and pool_state exist but do nothing: the store claims BucketPoolStore."""

    def pool_tick(
        self,
        *,
        worker: str,
        now: datetime,
        lease_seconds: float,
        num_buckets: int,
        wanted: Sequence[int],
        leaving: bool = False,
    ) -> tuple[list[int], list[str]]:
        return [], []

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        return {}, {}


SOUND: dict[str, type[InMemoryTaskStore]] = {
    "InMemoryTaskStore": InMemoryTaskStore,
    "_Starter": _Starter,
    "_Counting": _Counting,
}

BATCHING = "test_commit_with_no_expected_version_creates_the_task_with_its_history"
EXISTING = "test_commit_of_an_existing_id_is_task_already_exists_and_writes_nothing"
KEEPS_LEASE = "test_commit_saves_by_compare_and_set_and_keeps_the_stored_lease"
CONFLICT = "test_a_conflicting_item_writes_nothing_and_the_others_still_apply"
IDEMPOTENT = "test_committed_history_entries_are_idempotent"
BAD_ITEMS = "test_bad_items_are_refused_before_anything_is_written"
START = "test_start_moves_pending_tasks_to_running_with_lease_heartbeat_and_history"
ONLY = "test_start_takes_only_pending_tasks_of_the_given_buckets_and_names"
ORDER = "test_start_respects_not_before_order_and_limit"
ACROSS = "test_start_takes_the_oldest_tasks_across_buckets_up_to_the_limit"
START_ARGS = "test_start_refuses_bad_arguments"


class GetCommandLeasesIt(InMemoryTaskStore):
    """Reading a command claims it (a producer waiting for an outcome would steal it)."""

    def get_command(self, command_id: str) -> Command | None:
        found = super().get_command(command_id)
        if found is not None and found.lease_until is None and found.finished_at is None:
            self._commands[command_id]["lease_until"] = snapshot_to_row_dt(found.created_at)
            return super().get_command(command_id)
        return found


class GetCommandDropsTheOutcome(InMemoryTaskStore):
    """A completed command reads back without its outcome."""

    def get_command(self, command_id: str) -> Command | None:
        found = super().get_command(command_id)
        return None if found is None else replace(found, outcome=None)


class GetCommandWorksAfterClose(InMemoryTaskStore):
    def get_command(self, command_id: str) -> Command | None:
        self._closed, closed = False, self._closed
        try:
            return super().get_command(command_id)
        finally:
            self._closed = closed


class TaskTypesReplaceInsteadOfAdd(InMemoryTaskStore):
    """A second worker's names replace the first's."""

    def record_task_types(self, names: Collection[str]) -> None:
        if names:
            self._types.clear()
        super().record_task_types(names)


class TaskTypesKeepAHalfRefusedCall(InMemoryTaskStore):
    """Names before a bad one are recorded."""

    def record_task_types(self, names: Collection[str]) -> None:
        if isinstance(names, list):
            for name in names:
                if not isinstance(name, str) or not name:
                    break
                self._types.add(name)
        super().record_task_types(names)


FENCE_APPLIES = "test_a_fenced_touch_applies_on_its_version_and_never_bumps_it"
FENCE_REFUSES = "test_a_fenced_touch_on_another_version_or_missing_task_writes_nothing"
FENCE_ONLY = "test_a_fenced_touch_checks_nothing_but_the_version"
CLOCK = "test_server_time_is_an_aware_utc_now"
COUNTS = "test_bucket_counts_follow_every_write_and_list_zeros"
MOVES = "test_bucket_counts_follow_a_task_that_changes_bucket"
DECLARED = "test_the_store_implements_exactly_the_declared_extensions"
READS_COMMANDS = "test_get_command_reads_a_command_back_as_it_moves_and_never_claims_it"
READS_REFUSE = "test_get_command_refuses_bad_ids_and_a_closed_store"

#: Broken store -> the ExtensionsContract test that pins the rule it breaks.
CAUGHT_BY: dict[str, str] = {
    "StartLooksOnlyAtTheOldestFew": "test_delayed_tasks_in_front_of_a_due_one_in_every_bucket_never_hold_it_back",
    "StartIgnoresPriority": "test_higher_priority_starts_first_within_a_call_and_across_buckets",
    "StartLowPriorityFirst": "test_higher_priority_starts_first_within_a_call_and_across_buckets",
    "StartOrdersByCreatedNotByDue": "test_equal_priorities_start_first_come_first_served_by_when_they_became_due",
    "StartBreaksTiesNewestFirst": "test_equal_priorities_start_first_come_first_served_by_when_they_became_due",
    "StartForgetsThePriorityOfADelayedTask": "test_a_higher_priority_task_not_yet_due_waits_and_then_goes_first",
    "StartOrderKeepsThePriorityOfTheCreate": "test_a_saved_priority_change_moves_the_task_in_the_start_order",
    "StartReadsAFewPerBucket": "test_a_batch_takes_the_best_tasks_even_when_they_crowd_one_bucket",
    "StartPromotesDelayedByDueTime": "test_due_delayed_tasks_start_by_priority_not_by_when_they_came_due",
    "SaveDropsThePriority": "test_a_retry_keeps_its_priority_and_goes_before_older_tasks_of_lower_priority",
    "CommitFailedItemWritesHistory": CONFLICT,
    "CommitAllowsATaskTwice": "test_a_task_named_twice_in_one_call_is_refused_and_nothing_is_written",
    "CommitSaveWritesTheLease": KEEPS_LEASE,
    "CommitCreateDropsTheLease": BATCHING,
    "CommitCreateSkipsItsHistory": BATCHING,
    "CommitAConflictAbortsTheBatch": CONFLICT,
    "CommitIgnoresTheExpectedVersion": CONFLICT,
    "CommitMissingTaskReportsVersionZero": CONFLICT,
    "CommitCreateOverwritesAnExistingTask": EXISTING,
    "CommitReplacesKeptHistoryEntries": IDEMPOTENT,
    "CommitAppendsDuplicateEntries": IDEMPOTENT,
    "CommitSkipsTheTransitionTaskCheck": BAD_ITEMS,
    "CommitWritesItemsBeforeCheckingTheNext": BAD_ITEMS,
    "CommitOfNothingWorksAfterClose": BAD_ITEMS,
    "StartIgnoresNotBefore": ORDER,
    "StartNotBeforeIsExclusive": ORDER,
    "StartIgnoresBuckets": ONLY,
    "StartWithNoBucketsMeansAll": ONLY,
    "StartIgnoresNames": ONLY,
    "StartTakesPausedTasks": ONLY,
    "StartRestartsRunningTasks": START,
    "StartOneMoreThanLimit": ORDER,
    "StartNewestFirst": ORDER,
    "StartInTaskIdOrder": ORDER,
    "StartTakesBucketsOneAfterAnother": ACROSS,
    "StartLimitsEachBucket": ACROSS,
    "StartBumpsTheVersionTwice": START,
    "StartWritesNoHistory": START,
    "StartReasonCountsTheNextAttempt": START,
    "StartSetsNoLease": START,
    "StartSetsNoHeartbeat": START,
    "StartKeepsUpdatedAt": START,
    "StartResetsProgress": START,
    "StartReturnsTheTasksAsTheyWere": START,
    "StartAllowsLimitsAbove100": START_ARGS,
    "FencedTouchIgnoresTheVersion": FENCE_REFUSES,
    "FencedTouchWritesOnAMismatch": FENCE_REFUSES,
    "FencedTouchBumpsTheVersion": FENCE_APPLIES,
    "FencedTouchIsTrueForAMissingTask": FENCE_REFUSES,
    "FencedTouchClearsTheLeaseItWasNotGiven": FENCE_APPLIES,
    "FencedTouchChecksTheLeaseOwner": FENCE_ONLY,
    "FencedTouchSkipsFinishedTasks": FENCE_ONLY,
    "FencedTouchAcceptsAStringVersion": FENCE_REFUSES,
    "ServerTimeIsNaive": CLOCK,
    "ServerTimeInAnotherOffset": CLOCK,
    "ServerTimeWorksAfterClose": CLOCK,
    "BucketCountsOmitZeroStatuses": COUNTS,
    "BucketCountsIgnoreSave": COUNTS,
    "BucketCountsIgnoreCommit": COUNTS,
    "BucketCountsIgnoreStart": COUNTS,
    "BucketCountsIgnorePrune": COUNTS,
    "BucketCountsKeepTheCreatedBucket": MOVES,
    "BucketCountsWorkAfterClose": COUNTS,
    "LostTheServerClock": DECLARED,
    "ClaimsAHalfFinishedPool": DECLARED,
    "GetCommandLeasesIt": READS_COMMANDS,
    "GetCommandDropsTheOutcome": READS_COMMANDS,
    "GetCommandWorksAfterClose": READS_REFUSE,
    "TaskTypesReplaceInsteadOfAdd": "test_task_types_are_a_union_of_what_workers_recorded",
    "TaskTypesKeepAHalfRefusedCall": "test_task_types_refuse_bad_names_whole_and_a_closed_store",
}

#: Every broken store of this module, by class name.
BROKEN_EXTENSION_STORES: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}

# The dashboard reads' broken stores, kept in their own module (this one is long enough).
CAUGHT_BY.update(broken_dashboard_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_dashboard_stores.BROKEN)
SOUND.update(broken_dashboard_stores.SOUND)

# The task policies' broken stores, in their own module too.
CAUGHT_BY.update(broken_policy_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_policy_stores.BROKEN)
SOUND.update(broken_policy_stores.SOUND)

# The limits' broken stores, in their own module too.
CAUGHT_BY.update(broken_limit_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_limit_stores.BROKEN)
SOUND.update(broken_limit_stores.SOUND)

# The schedules' broken stores, in their own module too.
CAUGHT_BY.update(broken_schedule_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_schedule_stores.BROKEN)
SOUND.update(broken_schedule_stores.SOUND)
