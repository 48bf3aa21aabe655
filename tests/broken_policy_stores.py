"""Broken task-policy stores: each breaks one rule of ``TaskPoliciesStore``
(``stores/extensions.py``) or of the policy fields' round trip.

The scheme of ``tests/broken_extension_stores.py``, which merges ``BROKEN``, ``CAUGHT_BY`` and
``SOUND`` into its own tables: every class is a small subclass of ``InMemoryTaskStore`` that
keeps its signatures and its extensions, and breaks one rule; ``CAUGHT_BY`` names the
``ExtensionsContract`` test (``testing/extensions/task_policies.py``) that pins it.

The reference derives everything from its rows (the holder of a unique id is the unfinished
row naming it; an expiry is computed from a finished row), so the rules a store with indexes
breaks are broken here on rebuilds, each sound as written (``SOUND``):

* ``_Indexed`` keeps unique ids and expiries in explicit indexes (unique -> holder, task ->
  expiry), written after each write from the row before and the row after, as the Redis and
  SQL stores keep them: one hook per rule (``take``, ``let_go``, ``removed``, ``set_expiry``);
  ``_LazyUnique`` lets a unique id go only when the task is removed (a read skips a finished
  holder);
* ``_Expiring`` is ``expire_finished`` as a query with hooks (``expiry``, ``due``, ``rank``,
  ``cut``, ``remove``, ``report``), ``_ExpiryBacklog`` the same for ``expiry_backlog``;
* ``_Deadlines`` passes the deadline ``start_tasks`` writes through one hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from fnmatch import fnmatchcase

from chongming_redis.errors import StoreError, UniqueTaken
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.policy import DEFAULT_RETENTION
from chongming_redis.stores import _checks as check
from chongming_redis.stores._memory_policies import expiry_us, is_final
from chongming_redis.stores.codec import Row, decode_dt, encode_dt, snapshot_to_row
from chongming_redis.stores.extensions import CommitItem
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.validation import check_dt

OK, PAUSED = TaskStatus.SUCCEEDED, TaskStatus.PAUSED


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


# -- the round trip of the fields ----------------------------------------------------------


class SaveDropsTheRetryPolicy(InMemoryTaskStore):
    """save writes every field but the retry policy (a column the UPDATE forgot)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        if isinstance(snapshot, TaskSnapshot):
            snapshot = replace(snapshot, retry=None)
        super().save(snapshot, expect_version=expect_version)


class CreateRoundsTheTimeoutToMilliseconds(InMemoryTaskStore):
    """create stores the timeout in whole milliseconds."""

    def create(self, snapshot: TaskSnapshot) -> None:
        if isinstance(snapshot, TaskSnapshot) and snapshot.timeout is not None:
            snapshot = replace(snapshot, timeout=max(0.001, round(snapshot.timeout, 3)))
        super().create(snapshot)


class CommitCreateDropsTheRetention(InMemoryTaskStore):
    """commit_tasks creates without the retention (the batched create's column list is short)."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        checked = check.check_commit_items(items)
        return super().commit_tasks(
            [(replace(s, retention=None) if e is None else s, e, t) for s, e, t in checked]
        )


class QueryDropsTheUnique(InMemoryTaskStore):
    """query returns the tasks without their unique id (get has it)."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return [replace(s, unique=None) for s in super().query(query)]


class StartDropsTheRetryPolicy(InMemoryTaskStore):
    """start_tasks writes the started tasks without their retry policy."""

    def start_tasks(self, *, owner: str, now: datetime, lease_until: datetime,
                    buckets: Sequence[int], limit: int = 50,
                    names: Sequence[str] = ()) -> list[TaskSnapshot]:  # fmt: skip
        started = super().start_tasks(owner=owner, now=now, lease_until=lease_until,
                                      buckets=buckets, limit=limit, names=names)  # fmt: skip
        for s in started:
            self._tasks[s.task_id]["retry_policy"] = None
        return [replace(s, retry=None) for s in started]


# -- the deadline --------------------------------------------------------------------------


class _Deadlines(InMemoryTaskStore):
    """start_tasks whose written deadline goes through ``deadline``."""

    def start_tasks(self, *, owner: str, now: datetime, lease_until: datetime,
                    buckets: Sequence[int], limit: int = 50,
                    names: Sequence[str] = ()) -> list[TaskSnapshot]:  # fmt: skip
        before = {t: row["deadline"] for t, row in self._tasks.items()}
        started = super().start_tasks(owner=owner, now=now, lease_until=lease_until,
                                      buckets=buckets, limit=limit, names=names)  # fmt: skip
        result = []
        for s in started:
            raw = before[s.task_id]
            previous = None if raw is None else decode_dt(int(raw))  # type: ignore[arg-type]
            deadline = self.deadline(s, previous, lease_until)
            self._tasks[s.task_id]["deadline"] = None if deadline is None else encode_dt(deadline)
            result.append(replace(s, deadline=deadline))
        return result

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        return started.deadline


class StartWritesNoDeadline(_Deadlines):
    """start_tasks leaves the deadline as it was: the runtime never times an attempt out."""

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        return previous


class StartDeadlineIsTheLease(_Deadlines):
    """start_tasks writes the lease's end as the deadline of a task with a timeout."""

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        return lease_until if started.timeout is not None else previous


class StartClearsTheDeadlineWithoutATimeout(_Deadlines):
    """start_tasks clears the deadline of a task without a timeout instead of keeping it."""

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        return started.deadline if started.timeout is not None else None


class StartKeepsAnEarlierDeadline(_Deadlines):
    """start_tasks writes a deadline only when the task has none: a retry keeps the first
    attempt's, long past."""

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        return previous if previous is not None else started.deadline


class StartDeadlineInWholeSeconds(_Deadlines):
    """start_tasks adds the timeout in whole seconds (an integer TTL)."""

    def deadline(
        self, started: TaskSnapshot, previous: datetime | None, lease_until: datetime
    ) -> datetime | None:
        if started.timeout is None:
            return started.deadline
        return started.updated_at + timedelta(seconds=int(started.timeout))


# -- unique ids on the reference -------------------------------------------------------------


class CreateIgnoresTheUnique(InMemoryTaskStore):
    """create (and a batched create) never checks the unique id: duplicates."""

    def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None:
        return None if previous is None else super()._unique_error(row, previous)


class CommitCreateIgnoresTheUnique(InMemoryTaskStore):
    """commit_tasks checks the unique id of its saves only (create checks it)."""

    def _commit_unique_error(self, row: Row, current: Row | None) -> StoreError | None:
        return None if current is None else super()._commit_unique_error(row, current)


class CommitJudgesUniqueBeforeTheCall(InMemoryTaskStore):
    """commit_tasks judges every item's unique id against the holders before the call: two
    creates of one unique id in one call are both written."""

    _before: dict[str, Row] | None = None

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        self._before = dict(self._tasks)
        try:
            return super().commit_tasks(items)
        finally:
            self._before = None

    def _holder(self, unique: str) -> str | None:
        tasks = self._tasks if self._before is None else self._before
        return next((t for t, row in tasks.items()
                     if row.get("unique_id") == unique and not is_final(row)), None)  # fmt: skip


class UniqueTakenNamesTheNewTask(InMemoryTaskStore):
    """UniqueTaken names the refused task as the holder."""

    def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None:
        error = super()._unique_error(row, previous)
        return None if error is None else UniqueTaken(error.unique, str(row["task_id"]))


class RefusedCreateStillWritesTheTask(InMemoryTaskStore):
    """create raises UniqueTaken after writing the task (the check comes after the INSERT)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except UniqueTaken:
            with self._open():
                self._tasks[snapshot.task_id] = snapshot_to_row(snapshot)
                self._feed.move(snapshot.task_id)
            raise


class UniqueMatchedCaseInsensitively(InMemoryTaskStore):
    """unique ids compare case-insensitively (a case-insensitive collation)."""

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            held = row.get("unique_id")
            if held is not None and str(held).casefold() == unique.casefold() and not is_final(row):
                return task_id
        return None


class UniqueMatchedAsAGlob(InMemoryTaskStore):
    """A unique id is looked up as a glob pattern (a SCAN MATCH on the keys): ``*`` is held
    by whichever task holds anything."""

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            held = row.get("unique_id")
            if held is not None and fnmatchcase(str(held), unique) and not is_final(row):
                return task_id
        return None


class CommitUniqueTakenAbortsTheBatch(InMemoryTaskStore):
    """One item refused with UniqueTaken and commit_tasks writes no item at all (the others
    report None)."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        checked = check.check_commit_items(items)
        with self._open():
            rows = [(snapshot_to_row(s), e) for s, e, _ in checked]
            errors = [self._commit_error(row, e) or self._unique_error(row, self._tasks.get(
                str(row["task_id"]))) for row, e in rows]  # fmt: skip
        if any(isinstance(error, UniqueTaken) for error in errors):
            return errors
        return super().commit_tasks(items)


class LetsGoOnlyWhenSucceeded(InMemoryTaskStore):
    """Only SUCCEEDED lets the unique id go: a failed, stopped or lost task keeps it."""

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            if row.get("unique_id") == unique and row["status"] != OK.value:
                return task_id
        return None


class LetsGoWhenPaused(InMemoryTaskStore):
    """A paused task lets its unique id go (PAUSED taken for a final status)."""

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            if (row.get("unique_id") == unique and not is_final(row)
                    and row["status"] != PAUSED.value):  # fmt: skip
                return task_id
        return None


class RetryByHandSkipsTheUniqueCheck(InMemoryTaskStore):
    """A save (or batched save) that reopens a finished task never checks its unique id: two
    unfinished holders."""

    def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None:
        return None if previous is not None else super()._unique_error(row, previous)


class CommitRetrySkipsTheUniqueCheck(InMemoryTaskStore):
    """commit_tasks never checks the unique id of the tasks it reopens (save does)."""

    def _commit_unique_error(self, row: Row, current: Row | None) -> StoreError | None:
        return None if current is not None else super()._commit_unique_error(row, current)


class ResavingAFinishedTaskChecksTheUnique(InMemoryTaskStore):
    """A save that keeps a task finished is refused when another task holds its unique id."""

    def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None:
        unique = row.get("unique_id")
        if previous is not None and is_final(previous) and is_final(row) and unique is not None:
            holder = self._holder(str(unique))
            if holder is not None and holder != row["task_id"]:
                return UniqueTaken(str(unique), holder)
        return super()._unique_error(row, previous)


class UniqueHolderNamesFinishedTasks(InMemoryTaskStore):
    """A finished task keeps holding its unique id (the holder is any task naming it)."""

    def _holder(self, unique: str) -> str | None:
        for task_id, row in self._tasks.items():
            if row.get("unique_id") == unique:
                return task_id
        return None


class UniqueHolderWorksAfterClose(InMemoryTaskStore):
    def unique_holder(self, unique: str) -> str | None:
        self._closed, closed = False, self._closed
        try:
            return super().unique_holder(unique)
        finally:
            self._closed = closed


class UniqueHolderChecksNothing(InMemoryTaskStore):
    """unique_holder looks anything up: an empty or oversized id is simply held by nobody."""

    def unique_holder(self, unique: str) -> str | None:
        with self._open():
            return self._holder(unique)


# -- unique ids and expiries in indexes ----------------------------------------------------------


class _Indexed(InMemoryTaskStore):
    """Unique ids and expiries in explicit indexes, written after each write (``wrote``) from
    the row before and the row after; ``via`` names the write (create, save, commit, start,
    prune, expire)."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[str, str] = {}
        self.expiries: dict[str, int] = {}
        self.via = ""

    # -- the reads, from the indexes

    def _holder(self, unique: str) -> str | None:
        return self.holders.get(unique)

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        moment, size = check.check_expire(now, limit)
        cutoff = encode_dt(moment)
        with self._open():
            due = sorted((w, t) for t, w in self.expiries.items()
                         if w <= cutoff and not self._pinned(t))[:size]  # fmt: skip
            self.via = "expire"
            for _, task_id in due:
                self._remove(task_id, moment)
            return [task_id for _, task_id in due]

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        cutoff = encode_dt(check_dt(now, "now"))
        with self._open():
            expiries = [w for t, w in self.expiries.items() if not self._pinned(t)]
        later = [w for w in expiries if w > cutoff]
        return len(expiries) - len(later), (decode_dt(min(later)) if later else None)

    # -- the writes, each followed by the indexes

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        self.wrote("create", None, snapshot.task_id)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        before = self._tasks.get(snapshot.task_id) if isinstance(snapshot, TaskSnapshot) else None
        super().save(snapshot, expect_version=expect_version)  # replaces the row: before stays
        self.wrote("save", before, snapshot.task_id)

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        """Item after item, the indexes following each (items name distinct tasks, so this
        is the batch: versions judged on the state before the call, unique ids in order)."""
        checked = check.check_commit_items(items)
        if not checked:  # still refused once closed
            return super().commit_tasks(items)
        results: list[StoreError | None] = []
        for item in checked:
            before = self._tasks.get(item[0].task_id)
            (error,) = super().commit_tasks([item])
            if error is None:
                self.wrote("commit", before, item[0].task_id)
            results.append(error)
        return results

    def start_tasks(self, *, owner: str, now: datetime, lease_until: datetime,
                    buckets: Sequence[int], limit: int = 50,
                    names: Sequence[str] = ()) -> list[TaskSnapshot]:  # fmt: skip
        before = {t: dict(row) for t, row in self._tasks.items()}  # a start writes in place
        started = super().start_tasks(owner=owner, now=now, lease_until=lease_until,
                                      buckets=buckets, limit=limit, names=names)  # fmt: skip
        for s in started:
            self.wrote("start", before[s.task_id], s.task_id)
        return started

    def prune(self, *, keep_terminal: int) -> int:
        self.via = "prune"
        return super().prune(keep_terminal=keep_terminal)

    def _remove(self, task_id: str, removed_at: datetime) -> None:
        row = self._tasks[task_id]
        super()._remove(task_id, removed_at)
        self.removed(row)

    def wrote(self, via: str, before: Row | None, task_id: str) -> None:
        self.via = via
        after = self._tasks[task_id]
        was_open = before is not None and not is_final(before)
        if not is_final(after) and not was_open and after.get("unique_id") is not None:
            self.take(str(after["unique_id"]), task_id, before)
        if before is not None and was_open and is_final(after) and before.get("unique_id"):
            self.let_go(str(before["unique_id"]), task_id)
        self.set_expiry(task_id, expiry_us(after))

    # -- the hooks

    def take(self, unique: str, task_id: str, before: Row | None) -> None:
        self.holders[unique] = task_id

    def let_go(self, unique: str, task_id: str) -> None:
        if self.holders.get(unique) == task_id:
            del self.holders[unique]

    def removed(self, row: Row) -> None:
        task_id = str(row["task_id"])
        if row.get("unique_id") is not None:
            self.let_go(str(row["unique_id"]), task_id)
        self.expiries.pop(task_id, None)

    def set_expiry(self, task_id: str, when: int | None) -> None:
        if when is None:
            self.expiries.pop(task_id, None)
        else:
            self.expiries[task_id] = when


class NeverLetsTheUniqueGo(_Indexed):
    """A finished task keeps its unique id in the index: it is taken forever."""

    def let_go(self, unique: str, task_id: str) -> None:
        pass


class CommitNeverLetsTheUniqueGo(_Indexed):
    """A batched write that finishes a task leaves its unique id taken (save lets it go)."""

    def let_go(self, unique: str, task_id: str) -> None:
        if self.via != "commit":
            super().let_go(unique, task_id)


class RetryByHandTakesNothing(_Indexed):
    """Only a create takes a unique id: a retried task runs without holding it."""

    def take(self, unique: str, task_id: str, before: Row | None) -> None:
        if before is None:
            super().take(unique, task_id, before)


class _LazyUnique(_Indexed):
    """The index keeps a finished holder (a read skips it: the holder must exist and be
    unfinished); a removal drops the entry."""

    def _holder(self, unique: str) -> str | None:
        holder = self.holders.get(unique)
        row = None if holder is None else self._tasks.get(holder)
        return holder if row is not None and not is_final(row) else None

    def let_go(self, unique: str, task_id: str) -> None:
        pass

    def removed(self, row: Row) -> None:
        unique, task_id = row.get("unique_id"), str(row["task_id"])
        if unique is not None and self.holders.get(str(unique)) == task_id and self.forgets():
            del self.holders[str(unique)]
        self.expiries.pop(task_id, None)

    def forgets(self) -> bool:
        return True


class PruneLeavesTheUnique(_LazyUnique):
    """prune and expire_finished leave the removed task's unique id in the index: the same id
    created again holds it once more."""

    def forgets(self) -> bool:
        return False


class ExpireLeavesTheUnique(_LazyUnique):
    """expire_finished leaves the expired task's unique id in the index (prune drops it)."""

    def forgets(self) -> bool:
        return self.via != "expire"


class ExpiryKeptOnReopen(_Indexed):
    """A retry by hand leaves the task's expiry in the index: an unfinished task expires."""

    def set_expiry(self, task_id: str, when: int | None) -> None:
        if when is not None:
            super().set_expiry(task_id, when)


class ExpiryFixedAtTheFirstFinish(_Indexed):
    """The expiry is written by the first write that finishes a task, never moved after."""

    def set_expiry(self, task_id: str, when: int | None) -> None:
        if when is None or task_id not in self.expiries:
            super().set_expiry(task_id, when)


class CommitWritesNoExpiry(_Indexed):
    """A batched write never updates the expiry index (save does)."""

    def set_expiry(self, task_id: str, when: int | None) -> None:
        if self.via != "commit":
            super().set_expiry(task_id, when)


# -- expire_finished -------------------------------------------------------------------------


class _Expiring(InMemoryTaskStore):
    """expire_finished as a query, one hook per rule."""

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        moment, size = check.check_expire(now, limit)
        cutoff = encode_dt(moment)
        with self._open():
            due = [(when, task_id) for task_id, row in self._tasks.items()
                   if (when := self.expiry(row)) is not None and self.due(when, cutoff)
                   and not self._pinned(task_id)]  # fmt: skip
            ranked = sorted(due, key=lambda d: self.rank(d[0], self._tasks[d[1]]))
            picked = [task_id for _, task_id in self.cut(ranked, size)]
            for task_id in picked:
                self.remove(task_id, moment)
            return self.report(picked)

    def expiry(self, row: Row) -> int | None:
        return expiry_us(row)

    def due(self, when: int, cutoff: int) -> bool:
        return when <= cutoff

    def rank(self, when: int, row: Row) -> tuple[object, ...]:
        return (when, str(row["task_id"]))

    def cut(self, ranked: list[tuple[int, str]], size: int) -> list[tuple[int, str]]:
        return ranked[:size]

    def remove(self, task_id: str, moment: datetime) -> None:
        self._remove(task_id, moment)

    def report(self, removed: list[str]) -> list[str]:
        return removed


class ExpireFromCreatedAt(_Expiring):
    """A task expires retention seconds after it was created, not after it finished."""

    def expiry(self, row: Row) -> int | None:
        if expiry_us(row) is None:
            return None
        return int(row["created_at"]) + _us(float(row["retention_s"]))  # type: ignore[arg-type]


class ExpireOnlyBeforeNow(_Expiring):
    """A task expiring exactly now is kept (strictly before now only)."""

    def due(self, when: int, cutoff: int) -> bool:
        return when < cutoff


class ExpireUnfinishedTasksToo(_Expiring):
    """Any task with a retention expires, finished or not."""

    def expiry(self, row: Row) -> int | None:
        retention = row.get("retention_s")
        if retention is None:
            return None
        return int(row["updated_at"]) + _us(float(retention))  # type: ignore[arg-type]


class ExpireWithTheDefaultRetention(_Expiring):
    """A finished task without a retention expires after the default one (7 days)."""

    def expiry(self, row: Row) -> int | None:
        if row.get("retention_s") is None and is_final(row):
            return int(row["updated_at"]) + _us(DEFAULT_RETENTION)  # type: ignore[arg-type]
        return expiry_us(row)


class ExpireIgnoresNow(_Expiring):
    """Every finished task with a retention goes, expired or not."""

    def due(self, when: int, cutoff: int) -> bool:
        return True


class ExpireRoundsNowUpToTheMillisecond(_Expiring):
    """now is taken in milliseconds, rounded up: a task expiring a microsecond later goes."""

    def due(self, when: int, cutoff: int) -> bool:
        return when <= -(-cutoff // 1000) * 1000


class ExpireIgnoresTheLimit(_Expiring):
    def cut(self, ranked: list[tuple[int, str]], size: int) -> list[tuple[int, str]]:
        return ranked


class ExpireOneMoreThanTheLimit(_Expiring):
    def cut(self, ranked: list[tuple[int, str]], size: int) -> list[tuple[int, str]]:
        return ranked[: size + 1]


class ExpireInCreatedOrder(_Expiring):
    """The oldest created go first, not the earliest expired."""

    def rank(self, when: int, row: Row) -> tuple[object, ...]:
        return (row["created_at"], str(row["task_id"]))


class ExpireInUpdatedOrder(_Expiring):
    """The earliest finished go first, whatever their retention."""

    def rank(self, when: int, row: Row) -> tuple[object, ...]:
        return (row["updated_at"], str(row["task_id"]))


class ExpireShortestRetentionFirst(_Expiring):
    def rank(self, when: int, row: Row) -> tuple[object, ...]:
        return (row["retention_s"], str(row["task_id"]))


class ExpireLatestExpiryFirst(_Expiring):
    def rank(self, when: int, row: Row) -> tuple[object, ...]:
        return (-when, str(row["task_id"]))


class ExpireReportsNothing(_Expiring):
    """The expired tasks are removed, but the call returns []."""

    def report(self, removed: list[str]) -> list[str]:
        return []


class ExpireKeepsTheHistory(_Expiring):
    """An expired task's history stays behind (an id created again inherits it)."""

    def remove(self, task_id: str, moment: datetime) -> None:
        kept = self._history.get(task_id)
        super().remove(task_id, moment)
        if kept is not None:
            self._history[task_id] = kept


class ExpireLeavesNoTombstone(_Expiring):
    """An expired task vanishes from the change feed: a reader never learns it is gone."""

    def remove(self, task_id: str, moment: datetime) -> None:
        del self._tasks[task_id]
        self._feed._drop(task_id)
        self._history.pop(task_id, None)
        self._task_commands.pop(task_id, None)


class ExpireKeepsTheCommandListing(_Expiring):
    """An expired task's commands stay listed under its id."""

    def remove(self, task_id: str, moment: datetime) -> None:
        kept = self._task_commands.get(task_id)
        super().remove(task_id, moment)
        if kept is not None:
            self._task_commands[task_id] = kept


class ExpireClampsTheLimit(InMemoryTaskStore):
    """A limit out of 1..1000 is clamped into it instead of refused."""

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        if type(limit) is int:
            limit = min(max(limit, 1), 1000)
        return super().expire_finished(now=now, limit=limit)


class ExpireTakesANaiveNowAsUtc(InMemoryTaskStore):
    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        if isinstance(now, datetime) and now.tzinfo is None:
            now = now.replace(tzinfo=timezone.utc)
        return super().expire_finished(now=now, limit=limit)


# -- expiry_backlog --------------------------------------------------------------------------


class _ExpiryBacklog(InMemoryTaskStore):
    """expiry_backlog as a scan, one hook per rule."""

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        cutoff = encode_dt(check_dt(now, "now"))
        with self._open():
            expiries = [w for t, row in self._tasks.items()
                        if (w := self.expiry(row)) is not None and not self._pinned(t)]  # fmt: skip
        due = [w for w in expiries if self.due(w, cutoff)]
        return len(due), self.next([w for w in expiries if w > cutoff], expiries)

    def expiry(self, row: Row) -> int | None:
        return expiry_us(row)

    def due(self, when: int, cutoff: int) -> bool:
        return when <= cutoff

    def next(self, later: list[int], every: list[int]) -> datetime | None:
        return decode_dt(min(later)) if later else None


class BacklogCountsUnfinishedTasks(_ExpiryBacklog):
    def expiry(self, row: Row) -> int | None:
        retention = row.get("retention_s")
        if retention is None:
            return None
        return int(row["updated_at"]) + _us(float(retention))  # type: ignore[arg-type]


class BacklogNextIsTheEarliestOfAll(_ExpiryBacklog):
    """The "next" expiry is the earliest of all, the expired ones included."""

    def next(self, later: list[int], every: list[int]) -> datetime | None:
        return decode_dt(min(every)) if every else None


class BacklogNextInMilliseconds(_ExpiryBacklog):
    def next(self, later: list[int], every: list[int]) -> datetime | None:
        return decode_dt(min(later) // 1000 * 1000) if later else None


class BacklogLeavesOutTheBoundary(_ExpiryBacklog):
    """A task expiring exactly now is not counted as expired yet."""

    def due(self, when: int, cutoff: int) -> bool:
        return when < cutoff


class BacklogWorksAfterClose(InMemoryTaskStore):
    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        self._closed, closed = False, self._closed
        try:
            return super().expiry_backlog(now=now)
        finally:
            self._closed = closed


class LostTheExpiryBacklog(InMemoryTaskStore):
    """expiry_backlog was renamed away: the store silently stops being a TaskPoliciesStore."""

    expiry_backlog = None  # type: ignore[assignment]


SOUND: dict[str, type[InMemoryTaskStore]] = {
    "_Deadlines": _Deadlines,
    "_Indexed": _Indexed,
    "_LazyUnique": _LazyUnique,
    "_Expiring": _Expiring,
    "_ExpiryBacklog": _ExpiryBacklog,
}

ROUND_TRIP = "test_the_policy_fields_round_trip_through_every_write_and_read"
DEADLINE = "test_start_sets_the_deadline_from_the_timeout_and_keeps_it_without_one"
CREATE = "test_a_create_with_a_held_unique_is_unique_taken_and_writes_nothing"
COMMIT = "test_commit_tasks_refuses_a_held_unique_per_item_and_applies_the_others"
FINISH = "test_the_write_that_finishes_the_holder_lets_its_unique_go"
RETRY = "test_a_retry_by_hand_takes_the_unique_again_or_is_refused_while_another_holds_it"
HOLDER = "test_unique_holder_names_only_an_unfinished_holder_exactly"
REMOVED = "test_a_removed_task_takes_its_unique_along_and_its_id_starts_afresh"
EXACTLY = "test_expire_finished_removes_exactly_the_expired_finished_tasks"
ORDER = "test_expire_finished_goes_earliest_expiry_first_within_its_limit"
TRACES = "test_expire_finished_removes_history_and_commands_and_leaves_tombstones"
ARGS = "test_expire_finished_refuses_bad_arguments_before_any_write"
BACKLOG = "test_expiry_backlog_counts_the_expired_and_names_the_next_expiry"
FOLLOWS = "test_the_expiry_follows_every_write_that_finishes_reopens_or_refinishes_a_task"

#: Broken store -> the ExtensionsContract test that pins the rule it breaks.
CAUGHT_BY: dict[str, str] = {
    "SaveDropsTheRetryPolicy": ROUND_TRIP,
    "CreateRoundsTheTimeoutToMilliseconds": ROUND_TRIP,
    "CommitCreateDropsTheRetention": ROUND_TRIP,
    "QueryDropsTheUnique": ROUND_TRIP,
    "StartDropsTheRetryPolicy": ROUND_TRIP,
    "StartWritesNoDeadline": DEADLINE,
    "StartDeadlineIsTheLease": DEADLINE,
    "StartClearsTheDeadlineWithoutATimeout": DEADLINE,
    "StartKeepsAnEarlierDeadline": DEADLINE,
    "StartDeadlineInWholeSeconds": DEADLINE,
    "CreateIgnoresTheUnique": CREATE,
    "UniqueTakenNamesTheNewTask": CREATE,
    "RefusedCreateStillWritesTheTask": CREATE,
    "UniqueMatchedCaseInsensitively": CREATE,
    "CommitCreateIgnoresTheUnique": COMMIT,
    "CommitJudgesUniqueBeforeTheCall": (
        "test_two_creates_of_one_unique_in_one_call_create_only_the_first"
    ),
    "CommitUniqueTakenAbortsTheBatch": COMMIT,
    "NeverLetsTheUniqueGo": FINISH,
    "CommitNeverLetsTheUniqueGo": FINISH,
    "LetsGoOnlyWhenSucceeded": FINISH,
    "LetsGoWhenPaused": FINISH,
    "RetryByHandSkipsTheUniqueCheck": RETRY,
    "CommitRetrySkipsTheUniqueCheck": RETRY,
    "RetryByHandTakesNothing": RETRY,
    "ResavingAFinishedTaskChecksTheUnique": RETRY,
    "UniqueMatchedAsAGlob": HOLDER,
    "UniqueHolderNamesFinishedTasks": HOLDER,
    "UniqueHolderWorksAfterClose": HOLDER,
    "UniqueHolderChecksNothing": HOLDER,
    "PruneLeavesTheUnique": REMOVED,
    "ExpireLeavesTheUnique": REMOVED,
    "ExpireFromCreatedAt": EXACTLY,
    "ExpireOnlyBeforeNow": EXACTLY,
    "ExpireUnfinishedTasksToo": EXACTLY,
    "ExpireWithTheDefaultRetention": EXACTLY,
    "ExpireIgnoresNow": EXACTLY,
    "ExpireRoundsNowUpToTheMillisecond": EXACTLY,
    "ExpireReportsNothing": EXACTLY,
    "ExpireIgnoresTheLimit": ORDER,
    "ExpireOneMoreThanTheLimit": ORDER,
    "ExpireInCreatedOrder": ORDER,
    "ExpireInUpdatedOrder": ORDER,
    "ExpireShortestRetentionFirst": ORDER,
    "ExpireLatestExpiryFirst": ORDER,
    "ExpireKeepsTheHistory": TRACES,
    "ExpireLeavesNoTombstone": TRACES,
    "ExpireKeepsTheCommandListing": TRACES,
    "ExpireClampsTheLimit": ARGS,
    "ExpireTakesANaiveNowAsUtc": ARGS,
    "BacklogCountsUnfinishedTasks": BACKLOG,
    "BacklogNextIsTheEarliestOfAll": BACKLOG,
    "BacklogNextInMilliseconds": BACKLOG,
    "BacklogLeavesOutTheBoundary": BACKLOG,
    "BacklogWorksAfterClose": BACKLOG,
    "ExpiryKeptOnReopen": FOLLOWS,
    "ExpiryFixedAtTheFirstFinish": FOLLOWS,
    "CommitWritesNoExpiry": FOLLOWS,
    "LostTheExpiryBacklog": "test_the_store_implements_exactly_the_declared_extensions",
}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
