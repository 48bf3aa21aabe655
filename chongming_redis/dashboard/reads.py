"""What the dashboard's pages show, read from the store.

Synchronous and backend-neutral: the web app runs these in a worker thread. Each page costs a
bounded number of store calls whatever the number of tasks: the overview reads counters (never
tasks), a list page reads one page through keyset paging (``PagedQueryStore``), a task page reads
one task, its history and its commands, the schedules page every schedule's record (one
call; a namespace keeps few). An extension a store lacks hides that part of a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from chongming_redis.dashboard.listing import ListRequest, Mark, mark_of, reversed_query
from chongming_redis.model import (
    Command,
    CommandBacklog,
    FeedStats,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.runtime.limit_defs import LimitRow, RefState, limit_rows, ref_states
from chongming_redis.runtime.scheduling import StoredSchedule, read_all
from chongming_redis.runtime.stranded import Stranded, stranded_types
from chongming_redis.stores.extensions import (
    BucketCountingStore,
    BucketPoolStore,
    CommandInspectingStore,
    LimitsStore,
    PagedQueryStore,
    ServerClockStore,
    WorkerBeatsStore,
)
from chongming_redis.stores.protocol import ChangeFeed, TaskStore
from chongming_redis.stores.schedule_store import SchedulesStore

#: The page's newest commands shown for a task.
TASK_COMMANDS = 50
#: The busiest refs a page reads (``limit_usage``): the sums and a task's refs are among them.
LIMIT_USAGE = 1000
#: The busiest keys the overview shows per limit.
LIMIT_KEYS = 3
#: Beyond this a walk through ``query`` for a store without keyset paging gives up.
UNPAGED_LIMIT = 10_000
#: A task page reads the status of this many of its parents (the others are counted).
TASK_PARENTS = 20


@dataclass(frozen=True)
class WorkerRow:
    name: str
    beat_age: float | None  # seconds since its last heartbeat (``WorkerBeatsStore``)
    expires_in: float  # seconds until the pool drops it
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class BucketRow:
    bucket: int
    owner: str | None
    counts: dict[TaskStatus, int]


@dataclass(frozen=True)
class Overview:
    now: datetime
    counts: dict[TaskStatus, int]
    buckets: tuple[BucketRow, ...]
    workers: tuple[WorkerRow, ...]
    feed: FeedStats | None
    backlog: CommandBacklog | None
    #: Task types whose due tasks wait with nobody to run them (``runtime/stranded.py``).
    stranded: tuple[Stranded, ...] = ()
    #: Each recorded limit with its held/waiting (``None``: the store is no ``LimitsStore``).
    limits: tuple[LimitRow, ...] | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def oldest_unclaimed_age(self) -> float | None:
        if self.backlog is None or self.backlog.oldest_unclaimed_at is None:
            return None
        return max(0.0, (self.now - self.backlog.oldest_unclaimed_at).total_seconds())


def store_now(store: TaskStore) -> datetime:
    """The store's clock when it has one (the pool's heartbeats are on it), else ours."""
    if isinstance(store, ServerClockStore):
        return store.server_time()
    return datetime.now(timezone.utc)


def read_overview(store: TaskStore) -> Overview:
    now = store_now(store)
    counts = store.counts()
    per_bucket = store.bucket_counts() if isinstance(store, BucketCountingStore) else {}
    workers: dict[str, datetime] = {}
    owners: dict[int, str] = {}
    if isinstance(store, BucketPoolStore):
        workers, owners = store.pool_state()
    beats = store.worker_beats() if isinstance(store, WorkerBeatsStore) else {}
    live = {name: until for name, until in workers.items() if until > now}
    held: dict[str, list[int]] = {}
    for bucket, owner in owners.items():
        held.setdefault(owner, []).append(bucket)
    worker_rows = tuple(
        WorkerRow(
            name=name,
            beat_age=None if name not in beats else max(0.0, (now - beats[name]).total_seconds()),
            expires_in=(until - now).total_seconds(),
            buckets=tuple(sorted(held.get(name, ()))),
        )
        for name, until in sorted(live.items())
    )
    zero = dict.fromkeys(TaskStatus, 0)
    bucket_rows = tuple(
        BucketRow(
            bucket,
            owners.get(bucket) if owners.get(bucket) in live else None,
            {**zero, **per_bucket.get(bucket, {})},
        )
        for bucket in sorted(set(per_bucket) | set(owners))
    )
    feed = store.feed_stats() if isinstance(store, ChangeFeed) else None
    backlog = store.command_backlog() if isinstance(store, CommandInspectingStore) else None
    stranded = (
        tuple(stranded_types(store, now, limit=200)) if counts.get(TaskStatus.PENDING) else ()
    )
    return Overview(now, counts, bucket_rows, worker_rows, feed, backlog, stranded,
                    read_limits(store))  # fmt: skip


def read_limits(store: TaskStore) -> tuple[LimitRow, ...] | None:
    """The limits and their use (two store calls), ``None`` without ``LimitsStore``."""
    if not isinstance(store, LimitsStore):
        return None
    definitions, _ = store.limit_definitions()
    usage = store.limit_usage(limit=LIMIT_USAGE)
    return tuple(limit_rows(definitions, usage, busiest=LIMIT_KEYS))


@dataclass(frozen=True)
class SchedulesPage:
    now: datetime
    #: Every schedule, by id (``None``: the store is no ``SchedulesStore``).
    schedules: tuple[StoredSchedule, ...] | None


def read_schedules(store: TaskStore) -> tuple[StoredSchedule, ...] | None:
    """Every schedule with its state (one store call), ``None`` without ``SchedulesStore``; a
    record that does not decode is logged and left out (``scheduling.read_all``)."""
    if not isinstance(store, SchedulesStore):
        return None
    return tuple(read_all(store))


def read_schedules_page(store: TaskStore) -> SchedulesPage:
    return SchedulesPage(store_now(store), read_schedules(store))


@dataclass(frozen=True)
class ListPage:
    request: ListRequest
    tasks: tuple[TaskSnapshot, ...]
    next_mark: Mark | None  # there are tasks after this page
    prev_mark: Mark | None  # there are tasks before this page
    total: int | None = None  # how many match, when counters can tell (a status filter alone)


def read_list(store: TaskStore, request: ListRequest) -> ListPage:
    """One page of the list, and whether there are pages on either side (one extra task
    read in each direction that needs it)."""
    query = request.query
    size = query.limit or 50
    next_mark: Mark | None
    prev_mark: Mark | None
    if request.before is not None:
        # The page that ends before the mark: read backwards, one extra to see if more lie there.
        back = _page(store, reversed_query(query, size + 1), request.before)
        tasks = list(reversed(back[:size]))
        prev_mark = mark_of(tasks[0]) if len(back) > size else None
        next_mark = mark_of(tasks[-1]) if tasks else request.before
    else:
        ahead = _page(store, replace(query, limit=size + 1), request.after)
        tasks = ahead[:size]
        next_mark = mark_of(tasks[-1]) if len(ahead) > size else None
        prev_mark = mark_of(tasks[0]) if request.after is not None and tasks else None
    return ListPage(request, tuple(tasks), next_mark, prev_mark, _total(store, query))


def _page(store: TaskStore, query: TaskQuery, after: Mark | None) -> list[TaskSnapshot]:
    if isinstance(store, PagedQueryStore):
        return store.query_page(query, after=after)
    if after is None:
        return store.query(query)
    # No keyset paging: walk from the start (bounded), keep what lies after the mark.
    walked = store.query(replace(query, limit=UNPAGED_LIMIT))
    sign = -1 if query.newest_first else 1
    rest = [t for t in walked if sign * _cmp(mark_of(t), after) > 0]
    return rest[: query.limit]


def _cmp(a: Mark, b: Mark) -> int:
    return (a > b) - (a < b)


def _total(store: TaskStore, query: TaskQuery) -> int | None:
    """The number of matching tasks when the status counters say it without a scan."""
    plain = TaskQuery(statuses=query.statuses, limit=query.limit, newest_first=query.newest_first)
    if query != plain:
        return None
    counts = store.counts()
    return sum(
        n for status, n in counts.items() if query.statuses is None or status in query.statuses
    )


@dataclass(frozen=True)
class TaskPage:
    task: TaskSnapshot
    history: tuple[Transition, ...]
    commands: tuple[Command, ...] | None  # None: the store cannot list a task's commands
    #: A PENDING task's limit refs as they stand (which one is full), else empty.
    limits: tuple[RefState, ...] = ()
    #: Its first ``TASK_PARENTS`` parents with their status (``None``: pruned since).
    parents: tuple[tuple[str, TaskStatus | None], ...] = ()
    now: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def more_parents(self) -> int:
        """The parents not read (past ``TASK_PARENTS``)."""
        return len(self.task.parents) - len(self.parents)


def read_task(store: TaskStore, task_id: str) -> TaskPage | None:
    task = store.get(task_id)
    if task is None:
        return None
    return TaskPage(task, tuple(store.history(task_id)), read_commands(store, task_id),
                    read_task_limits(store, task), read_parents(store, task))  # fmt: skip


def read_parents(store: TaskStore, task: TaskSnapshot) -> tuple[tuple[str, TaskStatus | None], ...]:
    """The task's first ``TASK_PARENTS`` parents and their status (one ``get`` each)."""
    found = []
    for parent in task.parents[:TASK_PARENTS]:
        snapshot = store.get(parent)
        found.append((parent, None if snapshot is None else snapshot.status))
    return tuple(found)


def read_task_limits(store: TaskStore, task: TaskSnapshot) -> tuple[RefState, ...]:
    """What holds a ``PENDING`` task with limit refs back: each ref with its held and
    waiting and whether it is full (two store calls); empty for any other task."""
    if task.status is not TaskStatus.PENDING or not task.limits:
        return ()
    if not isinstance(store, LimitsStore):
        return ()
    definitions, _ = store.limit_definitions()
    return tuple(ref_states(task.limits, store.limit_usage(limit=LIMIT_USAGE), definitions))


def read_commands(store: TaskStore, task_id: str) -> tuple[Command, ...] | None:
    if not isinstance(store, CommandInspectingStore):
        return None
    return tuple(store.task_commands(task_id, limit=TASK_COMMANDS))


def read_tasks(store: TaskStore, task_ids: Sequence[str]) -> dict[str, TaskSnapshot | None]:
    """The current state of a few tasks (a list page's running rows, for their progress)."""
    return {task_id: store.get(task_id) for task_id in task_ids}
