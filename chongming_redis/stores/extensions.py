"""Optional store extensions: what the runtime uses when a store offers more than ``TaskStore``.

Each is a small structural protocol beside ``TaskStore`` (``stores/protocol.py``). A store
implements any subset; the runtime resolves them once, by ``isinstance``, when a
``Controller`` is built (``runtime/store_adapter.py``) and falls back to the 14 protocol methods
for the ones missing. ``docs/store-extensions.md`` says what each one buys and what the runtime
does without it; ``ExtensionsContract`` (``chongming_redis.testing.extensions_contract``) checks
the semantics below.

Like the protocol methods, every extension method refuses bad arguments with
``TypeError``/``ValueError`` before touching the backend, raises ``StoreClosed`` after
``close()`` and reports backend failures as ``StoreError``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from chongming_redis.errors import StoreError
from chongming_redis.limits import LimitUsage
from chongming_redis.model import (
    Command,
    CommandBacklog,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.commit_start import COMMIT_START_METHODS, CommitStartStore
from chongming_redis.stores.dependency_store import DEPENDENCY_METHODS, DependenciesStore
from chongming_redis.stores.schedule_store import SCHEDULE_METHODS, SchedulesStore
from chongming_redis.stores.task_schema_store import TASK_SCHEMA_METHODS, TaskSchemasStore

if TYPE_CHECKING:
    import redis

#: One ``commit_tasks`` item: the snapshot to write, the version the store must hold (``None``:
#: create the task instead) and the history entries of the transitions it makes.
CommitItem = tuple[TaskSnapshot, int | None, Sequence[Transition]]


@runtime_checkable
class BatchingStore(Protocol):
    """Writes a task's state and its history in one atomic step, many tasks per round trip."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        """For each item ``(snapshot, expect, transitions)``, atomically per item:

        * ``expect is None``: ``create`` the snapshot (lease columns included); an existing
          ``task_id`` is ``TaskAlreadyExists`` and the stored task is never overwritten;
        * otherwise ``save`` it: compare-and-set on ``status_version == expect``, never writing
          ``lease_owner``/``lease_until`` (the stored lease is kept); a different or missing
          version is ``ConcurrencyConflict`` (``actual=None`` when missing);

        and, when written, ``append`` each of ``transitions`` (idempotent on
        ``(task_id, version)``: an entry already there is kept). An item that fails writes
        nothing, neither its snapshot nor its history; the other items still apply.

        Returns one entry per item, in order: ``None`` when written (or already written by a
        retry of this very call), else the ``ConcurrencyConflict`` / ``TaskAlreadyExists`` it
        met. Items name distinct tasks, each checked against the state before the call, and
        every transition names its item's task (``ValueError`` otherwise). An empty list
        returns ``[]``. Other failures raise ``StoreError`` for the whole call."""
        ...

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
        """Start up to ``limit`` (1..100) ``PENDING`` tasks of ``buckets`` whose ``not_before``
        is unset or ``<= now``, in start order (``model.start_rank``: higher ``priority``
        first, then the one due earliest, ``max(created_at, not_before)`` to the millisecond,
        then ``task_id``); a task not yet due never keeps a due one from starting, however
        many there are; ``names``: only tasks of these types (empty: any). Atomically for
        each: ``status = RUNNING``, ``status_version + 1``, ``updated_at = heartbeat_at =
        now``, ``lease_owner = owner``, ``lease_until = lease_until``, and the history entry
        ``(version + 1, PENDING, RUNNING, now, "started by <owner> (attempt <attempt>)")``.
        Every other field is kept.
        Two callers never start the same task. Returns the started tasks as stored (``[]``
        when none is eligible)."""
        ...


@runtime_checkable
class FencedTouchStore(Protocol):
    """A ``touch`` fenced by the task's version: the guard against paused zombie holders."""

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
        """``touch`` that applies only while the task's ``status_version`` equals
        ``expect_version``; returns whether it applied. Writes only the given fields, never
        checks or bumps anything else and never bumps the version. A missing task or another
        version returns ``False`` and writes nothing."""
        ...


@runtime_checkable
class ServerClockStore(Protocol):
    """A clock every worker of the store agrees on."""

    def server_time(self) -> datetime:
        """The store's current time, timezone-aware, in UTC."""
        ...


@runtime_checkable
class BucketCountingStore(Protocol):
    """Per-bucket task counts without reading every task."""

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``{bucket: {status: n}}``: every status present (zeros included) for each bucket
        listed. Follows ``create``, ``save``, ``commit_tasks``, ``start_tasks`` and ``prune``.
        A bucket whose tasks are all gone may be missing or listed with zeros."""
        ...


@runtime_checkable
class BucketPoolStore(Protocol):
    """Worker heartbeats and bucket leases, shared by the workers of one store (``BucketPool``)."""

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
        """One worker's heartbeat and bucket leases in one atomic step: register ``worker`` as
        live until ``now + lease_seconds`` and drop workers whose heartbeat expired; renew the
        leases it holds on buckets of ``wanted``, release those it no longer wants, and take a
        wanted bucket that is free or whose lease expired (``leaving``: release everything and
        unregister). A bucket never has two owners with a valid lease. Returns ``(buckets this
        worker now holds, live workers)``. The first call records ``num_buckets``; a call with
        another value writes nothing and raises ``StoreError``."""
        ...

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        """``({worker: heartbeat expiry}, {bucket: owner})`` as the pool last wrote them."""
        ...


@runtime_checkable
class NudgeStore(Protocol):
    """A store whose connection also carries the runtime's pub/sub nudges
    (``runtime/notify.py``, channels ``{namespace}:nudge:<topic>``): Redis pub/sub, or
    PostgreSQL ``LISTEN``/``NOTIFY`` behind the same surface (``PostgresTaskStore``)."""

    @property
    def client(self) -> redis.Redis | Any:
        """The client the nudges are published and subscribed on: redis-py's, or one with its
        ``publish(channel, message)`` and ``pubsub()`` (``subscribe``, ``get_message``,
        ``close``)."""
        ...

    @property
    def namespace(self) -> str:
        """The namespace the channels are named after."""
        ...

    @property
    def publishes_work(self) -> bool:
        """True when the store's own writes that create tasks (``create``, ``commit_tasks``)
        publish ``{namespace}:nudge:work`` in the same step, so a submit is one round trip and
        the runtime does not publish it again."""
        ...


@runtime_checkable
class CommandReadingStore(Protocol):
    """Reading one command back, so a producer can wait for its outcome (``Client.stop``)
    without claiming it (claiming would take it from the task's holder)."""

    def get_command(self, command_id: str) -> Command | None:
        """The command as stored (``finished_at``/``outcome`` once completed), or ``None``."""
        ...


@runtime_checkable
class RecordedBucketsStore(Protocol):
    """The bucket count the namespace's workers recorded (``BucketPoolStore.pool_tick``
    records it), so a producer puts tasks in buckets that some worker serves."""

    def recorded_num_buckets(self) -> int | None:
        """The recorded ``num_buckets``, or ``None`` before any worker joined."""
        ...


@runtime_checkable
class TaskTypesStore(Protocol):
    """The task type names the namespace's workers run, so a producer without the app
    refuses a misspelt name instead of leaving a task no worker will ever start."""

    def record_task_types(self, names: Collection[str]) -> None:
        """Add ``names`` to the namespace's set (a union: workers of several apps may share a
        namespace); an empty collection writes nothing. Names are task type names
        (``ValueError``/``TypeError`` for anything else, before any write)."""
        ...

    def task_types(self) -> frozenset[str]:
        """Every name recorded so far (empty: no worker recorded any)."""
        ...


@runtime_checkable
class PagedQueryStore(Protocol):
    """Keyset paging over ``query``: a dashboard's "next page" costs one page at any depth."""

    def query_page(
        self, query: TaskQuery | None = None, *, after: tuple[datetime, str] | None = None
    ) -> list[TaskSnapshot]:
        """What ``query(query)`` returns, restricted to tasks strictly after the position
        ``after = (created_at, task_id)`` in the query's order (ascending ``(created_at,
        task_id)``; with ``newest_first`` strictly before it, i.e. after it in descending
        order), at most ``query.limit``. ``after`` need not be a stored task (a pruned one
        still works): the next page after the last task of a page is ``after=(last.created_at,
        last.task_id)``. ``after=None`` is exactly ``query``. A bad ``after`` (not a 2-tuple of
        an aware, storable datetime and an identifier ``str``) is ``TypeError``/``ValueError``
        before any backend call."""
        ...


@runtime_checkable
class CommandInspectingStore(Protocol):
    """The control commands as an operator sees them: per task, and the unfinished backlog."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        """The task's commands as stored (finished ones with their outcome), the newest
        ``limit`` of them (1..1000, ``ValueError`` otherwise), returned oldest first by
        ``(created_at, command_id)``. A task with no command, or an unknown one, gives ``[]``.
        Commands of a pruned task are no longer listed (a task created again with that id
        starts with none)."""
        ...

    def command_backlog(self) -> CommandBacklog:
        """The unfinished commands: ``unclaimed`` (no lease: never claimed, or released),
        ``leased`` (a lease, valid or expired, not finished) and ``oldest_unclaimed_at``
        (``created_at`` of the oldest unclaimed one, ``None`` if none), without reading every
        command."""
        ...


@runtime_checkable
class WorkerBeatsStore(Protocol):
    """When each pool worker last ticked (``BucketPoolStore.pool_tick``), so a dashboard shows
    the age of every heartbeat, not only its expiry."""

    def worker_beats(self) -> dict[str, datetime]:
        """``{worker: the now of its last pool_tick}`` for every worker ``pool_state`` lists
        as live. A worker that left (``leaving``) or was dropped as expired is gone from it in
        the same step."""
        ...


@runtime_checkable
class TaskPoliciesStore(Protocol):
    """The store's duties for the task policies (``chongming_redis.policy``): unique ids that
    live and die with their task, the start's deadline and retention.

    A store with this extension, on top of round-tripping ``retry``, ``timeout``, ``deadline``,
    ``retention`` and ``unique`` as every store does:

    * **unique**: ``create`` (and a ``commit_tasks`` create) of a snapshot whose ``unique`` an
      unfinished task with another id holds raises (returns) ``UniqueTaken`` and writes
      nothing; otherwise the task holds its unique id from that write on. Within one
      ``commit_tasks`` call, the items are applied in order for this: of two creates with one
      unique id, the first holds it and the second is ``UniqueTaken``. The id is let go by
      the very write that moves the task to a final status (``save``, ``commit_tasks``, a
      reconcile's ``LOST``) and by ``prune``/``expire_finished`` removing it; a write that
      moves a finished task back to an unfinished status (a retry by hand) takes it again,
      or is refused with ``UniqueTaken`` if another unfinished task holds it meanwhile. No
      reaper, no lock that outlives its task. A task's unique id is fixed at its create: a
      save that changes it is not defined (the runtime never writes one);
    * **deadline**: ``start_tasks`` sets ``deadline = now + timeout`` on each task it starts
      whose ``timeout`` is set (and keeps it otherwise);
    * **retention**: a task whose status is final and whose ``retention`` is set expires at
      ``updated_at + retention``; ``expire_finished`` removes expired tasks."""

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        """Remove up to ``limit`` (1..1000) finished tasks whose ``updated_at + retention <=
        now``, earliest expiry first, each with its history, its commands and its unique id,
        leaving the feed tombstones ``prune`` leaves. Never a task that is unfinished, has no
        ``retention`` or has not expired. Returns the removed ids (``[]``: none expired)."""
        ...

    def unique_holder(self, unique: str) -> str | None:
        """The id of the unfinished task that holds ``unique``, or ``None``."""
        ...

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        """``(finished tasks expired by now, not yet removed; the earliest expiry of those
        still kept, or None)`` without reading every task."""
        ...


@runtime_checkable
class LimitsStore(Protocol):
    """The store enforces the limits (``chongming_redis.limits``) where tasks start, in the
    same atomic step as the start.

    * **definitions**: ``record_limits`` records each limit's definition (id -> ``to_json``
      text, compared canonically) and each task type's limit ids, all or nothing: an id
      recorded with another definition is ``LimitConflict`` and nothing is written, unless
      ``replace``. A ref (``TaskSnapshot.limits``) whose limit id is not recorded limits
      nothing.
    * **concurrency**: ``start_tasks`` starts a task only while fewer than ``max`` tasks
      ``RUNNING`` or ``PAUSED`` name each of its concurrency refs. The holders are the tasks
      themselves: every write that moves a task out of ``RUNNING``/``PAUSED`` (an end, a stop,
      a hand-back, a ``LOST`` found by a reconcile, a retry, a prune) frees its slot in that
      write, and one that moves a task into them (a ``save``, a ``create``) takes one, never
      refused; no reaper, no lock timeout.
    * **rate**: each rate ref is a token bucket of ``burst`` tokens refilled at ``rate / per``
      a second on the store's clock (the earlier of the caller's ``now`` and the store's own,
      never counted back), and a start spends one token of each.
    * **order**: a task a ref refuses stays ``PENDING`` as it was (version, attempt, history)
      and is passed over; in the same call, later tasks (start order) naming a refused ref are
      refused too (first come, first served within a ref), while those naming none are
      started: a full ref holds back no task outside it, whatever the backlog behind it, and
      the work of a call stays bounded by its ``limit``, not by that backlog."""

    def record_limits(
        self,
        definitions: Mapping[str, str],
        task_limits: Mapping[str, Sequence[str]],
        *,
        replace: bool = False,
    ) -> None:
        """Record the definitions (limit id -> ``limits.to_json`` text) and each task type's
        limit ids (every id among the definitions); ``LimitConflict`` unless ``replace`` when a
        recorded id has another definition; ``ValueError``/``TypeError`` for bad input. All or
        nothing."""
        ...

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``(limit id -> definition JSON, task type -> its limit ids)`` as recorded."""
        ...

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        """The refs with a holder or a waiter, at most ``limit`` (1..10000), busiest first
        (``held + waiting`` descending, then ref). Waiters are counted once a start passed
        them over; a task that started or left ``PENDING`` since is not one."""
        ...


#: Protocol name -> the members a store needs for it (what ``isinstance`` checks).
EXTENSION_METHODS: dict[str, tuple[str, ...]] = {
    "BatchingStore": ("commit_tasks", "start_tasks"),
    "FencedTouchStore": ("touch_fenced",),
    "ServerClockStore": ("server_time",),
    "BucketCountingStore": ("bucket_counts",),
    "BucketPoolStore": ("pool_tick", "pool_state"),
    "NudgeStore": ("client", "namespace", "publishes_work"),
    "CommandReadingStore": ("get_command",),
    "RecordedBucketsStore": ("recorded_num_buckets",),
    "TaskTypesStore": ("record_task_types", "task_types"),
    "PagedQueryStore": ("query_page",),
    "CommandInspectingStore": ("task_commands", "command_backlog"),
    "WorkerBeatsStore": ("worker_beats",),
    "TaskPoliciesStore": ("expire_finished", "unique_holder", "expiry_backlog"),
    "LimitsStore": ("record_limits", "limit_definitions", "limit_usage"),
    "SchedulesStore": SCHEDULE_METHODS,
    "DependenciesStore": DEPENDENCY_METHODS,
    "TaskSchemasStore": TASK_SCHEMA_METHODS,
    "CommitStartStore": COMMIT_START_METHODS,
}

EXTENSIONS: dict[str, type] = {
    "BatchingStore": BatchingStore,
    "FencedTouchStore": FencedTouchStore,
    "ServerClockStore": ServerClockStore,
    "BucketCountingStore": BucketCountingStore,
    "BucketPoolStore": BucketPoolStore,
    "NudgeStore": NudgeStore,
    "CommandReadingStore": CommandReadingStore,
    "RecordedBucketsStore": RecordedBucketsStore,
    "TaskTypesStore": TaskTypesStore,
    "PagedQueryStore": PagedQueryStore,
    "CommandInspectingStore": CommandInspectingStore,
    "WorkerBeatsStore": WorkerBeatsStore,
    "TaskPoliciesStore": TaskPoliciesStore,
    "LimitsStore": LimitsStore,
    "SchedulesStore": SchedulesStore,
    "DependenciesStore": DependenciesStore,
    "TaskSchemasStore": TaskSchemasStore,
    "CommitStartStore": CommitStartStore,
}


def keeps_unique_ids(store: object) -> bool:
    """Whether ``store``'s creates refuse a unique id an unfinished task holds: a
    ``TaskPoliciesStore``, or a store that says so (``keeps_unique_ids = True``: the async Redis
    store, whose writes are the Redis store's)."""
    return isinstance(store, TaskPoliciesStore) or getattr(store, "keeps_unique_ids", False) is True


def keeps_dependencies(store: object) -> bool:
    """Whether ``store``'s writes keep dependencies (``submit(after=...)``): a
    ``DependenciesStore``, or a store that says so (``keeps_dependencies = True``: the async
    Redis store, whose writes are the Redis store's scripts)."""
    return (
        isinstance(store, DependenciesStore) or getattr(store, "keeps_dependencies", False) is True
    )


def extensions_of(store: object) -> frozenset[str]:
    """The names of the extensions ``store`` implements."""
    return frozenset(name for name, proto in EXTENSIONS.items() if isinstance(store, proto))
