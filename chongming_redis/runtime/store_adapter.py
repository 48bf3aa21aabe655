"""``StoreAdapter``: the store as the runtime uses it, its extensions resolved once.

A ``Controller`` builds one from its store and calls the adapter wherever a store extension
(``stores/extensions.py``) would help; the adapter uses the extension when the store has it and
otherwise falls back to the 14 ``TaskStore`` methods. Which extensions a store has is decided
here, by ``isinstance`` against the protocols, once: nothing else in the runtime probes the
store. What each fallback costs is written in ``docs/store-extensions.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.errors import ConcurrencyConflict, StoreError, TaskAlreadyExists, UniqueTaken
from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
    start_rank,
)
from chongming_redis.runtime.limit_defs import LimitsNotEnforced
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.commit_start import CommitStartStore
from chongming_redis.stores.extensions import (
    BatchingStore,
    BucketCountingStore,
    BucketPoolStore,
    CommandReadingStore,
    CommitItem,
    FencedTouchStore,
    LimitsStore,
    NudgeStore,
    RecordedBucketsStore,
    ServerClockStore,
    TaskPoliciesStore,
    TaskTypesStore,
    extensions_of,
)
from chongming_redis.stores.protocol import TaskStore

log = logging.getLogger("chongming_redis.runtime")


@dataclass
class Started:
    """A task ``StoreAdapter.start`` moved to ``RUNNING``, as stored."""

    snapshot: TaskSnapshot
    #: Whether the start wrote the lease (``lease_until``); if not, the caller writes it.
    leased: bool = True
    #: History entries the start could not write (the store was unreachable): the caller
    #: keeps them and appends them later (appends are idempotent).
    unwritten: list[Transition] = field(default_factory=list)


class StoreAdapter:
    def __init__(self, store: TaskStore, *, owner: str = "runtime") -> None:
        self.store = store
        self.owner = owner  # for log lines
        self._batching = store if isinstance(store, BatchingStore) else None
        self._commit_start = store if isinstance(store, CommitStartStore) else None
        self._fenced = store if isinstance(store, FencedTouchStore) else None
        self._clock = store if isinstance(store, ServerClockStore) else None
        self._counting = store if isinstance(store, BucketCountingStore) else None
        self._commands = store if isinstance(store, CommandReadingStore) else None
        self._buckets = store if isinstance(store, RecordedBucketsStore) else None
        self._types = store if isinstance(store, TaskTypesStore) else None
        #: The store as a ``TaskPoliciesStore`` (unique ids, retention), or ``None``.
        self.policies: TaskPoliciesStore | None = (
            store if isinstance(store, TaskPoliciesStore) else None
        )
        #: The store as a ``BucketPoolStore``, or ``None``: ``join_pool`` needs one.
        self.pool: BucketPoolStore | None = store if isinstance(store, BucketPoolStore) else None
        #: The store as a ``NudgeStore`` (Redis pub/sub nudges), or ``None``: nudges stay local.
        self.nudge: NudgeStore | None = (
            store if isinstance(store, NudgeStore) and store.namespace else None
        )
        #: The store as a ``LimitsStore`` (limits checked at start), or ``None``.
        self.limits: LimitsStore | None = store if isinstance(store, LimitsStore) else None
        self.extensions = extensions_of(store)

    @property
    def batching(self) -> bool:
        """Whether a task's state and history are written in one atomic step (and many tasks
        per round trip): the store is a ``BatchingStore``."""
        return self._batching is not None

    # -- writes ----------------------------------------------------------------------------

    def commit(
        self, items: Sequence[CommitItem], *, best_effort_history: bool = False
    ) -> list[StoreError | None]:
        """``commit_tasks`` semantics per item: create (expected version ``None``) or
        compare-and-set save, then the item's history; ``None`` or the ``ConcurrencyConflict``
        / ``TaskAlreadyExists`` met, per item; a failed item writes nothing.

        Without batching: one ``create``/``save`` and one ``append`` per entry, item after
        item, so the snapshot and its history are not atomic: a ``StoreError`` may leave the
        earlier items written, or an item's snapshot written without its history. With
        ``best_effort_history``, a failed ``append`` is logged and skipped instead of raised
        (the snapshot is written; the history has a gap)."""
        if self._batching is not None:
            return self._batching.commit_tasks(items)
        results: list[StoreError | None] = []
        for snapshot, expect, transitions in check.check_commit_items(list(items)):
            try:
                if expect is None:
                    self.store.create(snapshot)
                else:
                    self.store.save(snapshot, expect_version=expect)
            except (ConcurrencyConflict, TaskAlreadyExists, UniqueTaken) as exc:
                results.append(exc)
                continue
            results.append(None)
            self.append_all(transitions, best_effort=best_effort_history)
        return results

    def commit_and_start(
        self,
        items: Sequence[CommitItem],
        *,
        now: datetime,
        lease_until: datetime,
        buckets: Collection[int] | None,
        num_buckets: int,
        limit: int,
        names: Collection[str],
    ) -> tuple[list[StoreError | None], list[Started] | StoreError]:
        """The group committer's call: ``commit(items)`` (the ends of tasks this worker's
        slots ran), then ``start`` of up to ``limit`` tasks, no more than the items written.
        One atomic call on a ``CommitStartStore``; else the two calls, in that order (the
        store never holds more ``RUNNING`` tasks of this worker either way). The start's
        ``StoreError`` is returned in place of its tasks: the commit stands."""
        if self._commit_start is not None:
            wanted = range(num_buckets) if buckets is None else sorted(buckets)
            results, started = self._commit_start.commit_and_start(
                items, owner=self.owner, now=now, lease_until=lease_until, buckets=list(wanted),
                limit=limit, names=sorted(names),
            )  # fmt: skip
            if isinstance(started, StoreError):
                return results, started
            return results, [Started(snapshot) for snapshot in started]
        results = self.commit(items)
        freed = min(limit, sum(1 for result in results if result is None))
        if not freed:
            return results, []
        start: dict[str, Any] = {"now": now, "lease_until": lease_until, "buckets": buckets,
                 "num_buckets": num_buckets, "names": names}  # fmt: skip
        try:
            return results, self.start(limit=freed, **start)
        except StoreError as exc:
            return results, exc

    def append_all(self, transitions: Sequence[Transition], *, best_effort: bool = False) -> None:
        """Append each entry (idempotent); ``best_effort``: log a failure instead of raising."""
        for transition in transitions:
            try:
                self.store.append(transition)
            except StoreError as exc:
                if not best_effort:
                    raise
                log.warning("%s: history entry %s v%d not written: %s",
                            self.owner, transition.task_id, transition.version, exc)  # fmt: skip

    def start(
        self,
        *,
        now: datetime,
        lease_until: datetime,
        buckets: Collection[int] | None,
        num_buckets: int,
        limit: int,
        names: Collection[str],
    ) -> list[Started]:
        """Start up to ``limit`` eligible ``PENDING`` tasks of ``buckets`` (``None``: every
        bucket below ``num_buckets``) and of ``names`` (empty: any), as ``start_tasks`` does.

        Without batching: a query of the oldest ``PENDING`` tasks (``_due``: due ones in start
        order), then per task a compare-and-set ``save`` to ``RUNNING``, a fenced ``touch``
        for the lease and an ``append``; a task another worker started first is skipped. A
        lease or history write that fails is reported in ``Started`` for the caller to retry,
        never lost."""
        if self._batching is not None:
            wanted = range(num_buckets) if buckets is None else sorted(buckets)
            started = self._batching.start_tasks(
                owner=self.owner, now=now, lease_until=lease_until, buckets=list(wanted),
                limit=limit, names=sorted(names),
            )  # fmt: skip
            return [Started(snapshot) for snapshot in started]
        result: list[Started] = []
        for snapshot in self._due(now, buckets, limit, names):
            if len(result) >= limit:
                break
            one = self._start_one(snapshot, now, lease_until)
            if one is not None:
                result.append(one)
        return result

    def _due(
        self, now: datetime, buckets: Collection[int] | None, limit: int, names: Collection[str]
    ) -> list[TaskSnapshot]:
        """The due ``PENDING`` tasks a fallback start tries, in start order (``start_rank``).
        A query lists ``PENDING`` tasks oldest first, delayed ones and every priority mixed,
        so the window grows (x4, up to ``FALLBACK_SCAN``) until it holds all of them: delayed
        tasks in front of due ones, or a newer task of a higher priority, cost a longer query,
        never a stall or an inversion (exact among the first ``FALLBACK_SCAN``)."""
        window = 4 * limit
        while True:
            query = TaskQuery(statuses=frozenset({TaskStatus.PENDING}), limit=window,
                              buckets=None if buckets is None else frozenset(buckets))  # fmt: skip
            listed = self.store.query(query)
            due = [s for s in listed
                   if (not names or s.name in names)
                   and (s.not_before is None or s.not_before <= now)]  # fmt: skip
            if len(listed) < window or window >= FALLBACK_SCAN:
                return sorted(due, key=_rank)
            window = min(4 * window, FALLBACK_SCAN)

    def _start_one(
        self, snapshot: TaskSnapshot, now: datetime, lease_until: datetime
    ) -> Started | None:
        deadline = (
            snapshot.deadline
            if snapshot.timeout is None
            else (now + timedelta(seconds=snapshot.timeout))
        )  # the start records it, as start_tasks
        running = dataclasses.replace(snapshot, status=TaskStatus.RUNNING, updated_at=now,
                                      status_version=snapshot.status_version + 1,
                                      heartbeat_at=now, deadline=deadline)  # fmt: skip
        try:
            self.store.save(running, expect_version=snapshot.status_version)
        except ConcurrencyConflict:
            return None  # another worker started it, or it was stopped: not ours
        except StoreError as exc:
            log.warning("%s: could not start %s: %s", self.owner, snapshot.task_id, exc)
            return None
        started = Started(running, leased=False)
        try:
            started.leased = self.touch_fenced(
                snapshot.task_id, expect_version=running.status_version,
                lease_owner=self.owner, lease_until=lease_until,
            )  # fmt: skip
        except StoreError as exc:
            log.warning("%s: lease of %s not written yet: %s", self.owner, snapshot.task_id, exc)
        if started.leased:
            started.snapshot = dataclasses.replace(
                running, lease_owner=self.owner, lease_until=lease_until
            )
        transition = Transition(
            snapshot.task_id, running.status_version, TaskStatus.PENDING, TaskStatus.RUNNING, now,
            f"started by {self.owner} (attempt {snapshot.attempt})",
        )  # fmt: skip
        try:
            self.store.append(transition)
        except StoreError:
            started.unwritten.append(transition)
        return started

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
        """``touch_fenced`` where the store has it. Otherwise a plain ``touch`` that always
        returns ``True``: best effort, a holder that lost its task is not fenced off (a paused
        zombie can overwrite the new holder's lease and progress)."""
        fields: dict[str, Any] = {
            "progress": progress,
            "heartbeat_at": heartbeat_at,
            "lease_owner": lease_owner,
            "lease_until": lease_until,
        }
        if self._fenced is not None:
            return self._fenced.touch_fenced(task_id, expect_version=expect_version, **fields)
        self.store.touch(task_id, **fields)
        return True

    # -- reads -----------------------------------------------------------------------------

    def server_time(self) -> datetime | None:
        """The store's clock, or ``None`` when it has none (the runtime then uses this
        process's clock)."""
        return None if self._clock is None else self._clock.server_time()

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``{bucket: {status: n}}``; without the extension, counted from ``query()`` (every
        task read; only buckets that have tasks are listed)."""
        if self._counting is not None:
            return self._counting.bucket_counts()
        result: dict[int, dict[TaskStatus, int]] = {}
        for snapshot in self.store.query():
            per = result.setdefault(snapshot.bucket, dict.fromkeys(TaskStatus, 0))
            per[snapshot.status] += 1
        return result

    def get_command(self, command_id: str) -> Command | None:
        """The command as stored; ``TypeError`` when the store cannot read one back (a
        producer then cannot wait for the outcome, only send)."""
        if self._commands is None:
            raise TypeError(f"{type(self.store).__name__} cannot read commands back")
        return self._commands.get_command(command_id)

    @property
    def reads_commands(self) -> bool:
        return self._commands is not None

    def recorded_num_buckets(self) -> int | None:
        """The bucket count the namespace's workers recorded (``None``: none recorded, or
        the store does not record it)."""
        return None if self._buckets is None else self._buckets.recorded_num_buckets()

    def record_task_types(self, names: Collection[str]) -> None:
        """Tell producers which task types this worker runs (best effort: a producer that
        cannot check a name only loses that check)."""
        if self._types is None or not names:
            return
        try:
            self._types.record_task_types(names)
        except StoreError as exc:
            log.warning("%s: task types not recorded: %s", self.owner, exc)

    def record_limits(
        self,
        definitions: Mapping[str, str],
        task_limits: Mapping[str, Sequence[str]],
        *,
        replace: bool = False,
    ) -> None:
        """Record a worker's limit definitions before it starts anything: ``LimitConflict``
        (nothing recorded) when one differs and not ``replace``; ``LimitsNotEnforced`` when
        there are some and the store is no ``LimitsStore``. Not best effort: a limit whose
        definition is not recorded would not hold."""
        if not definitions:
            return
        if self.limits is None:
            raise LimitsNotEnforced(self.store, definitions)
        self.limits.record_limits(definitions, task_limits, replace=replace)

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]] | None:
        """The recorded definitions; ``None`` without the extension."""
        return None if self.limits is None else self.limits.limit_definitions()

    def task_types(self) -> frozenset[str] | None:
        """The names the namespace's workers recorded; ``None`` without the extension."""
        return None if self._types is None else self._types.task_types()


#: The most PENDING tasks one fallback start lists (``StoreAdapter._due``): a store with only
#: the 14 methods cannot ask for due tasks alone; beyond this many delayed tasks in front, due
#: ones wait until enough of those come due (a batching store has no such bound).
FALLBACK_SCAN = 10_000


def _rank(snapshot: TaskSnapshot) -> tuple[int, int, str]:
    return start_rank(
        snapshot.priority,
        encode_dt(snapshot.created_at),
        None if snapshot.not_before is None else encode_dt(snapshot.not_before),
        snapshot.task_id,
    )
