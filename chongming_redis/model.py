"""The task model: frozen records that every store reads and writes.

Every record validates itself at construction: a naive datetime, a ``bool`` where an ``int`` is
meant, a negative version or an unusable id raises ``TypeError``/``ValueError`` here, long before
a store sees it. Datetimes are converted to UTC on the way in, so a record equals its round trip
through any store, timezone included. ``dataclasses.replace`` works (it re-runs the checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from chongming_redis.limits import check_refs
from chongming_redis.parents import check_parent_failure, check_parents
from chongming_redis.policy import MAX_RETENTION, MAX_TIMEOUT, RetryPolicy, check_duration
from chongming_redis.validation import (
    check_bool,
    check_dt,
    check_identifier,
    check_int,
    check_number,
    check_optional_dt,
    check_optional_identifier,
    check_optional_text,
    check_priority,
    check_text,
)


class TaskStatus(str, Enum):
    """Where a task is in its life. The last four are terminal: the runtime never moves a task
    out of one (only a retry by hand, ``Client.retry``, does). ``WAITING``: created with
    parents (``submit(..., after=...)``) that have not all ended; the store moves it to
    ``PENDING`` or ``STOPPED`` itself (``DependenciesStore``), never a worker."""

    WAITING = "waiting"
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED, TaskStatus.LOST}
)


class CommandKind(str, Enum):
    """What a control command asks the holder of a task to do."""

    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"

    def __str__(self) -> str:
        return self.value


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _status(value: object, what: str) -> TaskStatus:
    if isinstance(value, TaskStatus):
        return value
    raise TypeError(f"{what} must be a TaskStatus, not {type(value).__name__}")


@dataclass(frozen=True)
class Progress:
    """How far a task has come: ``current`` of ``total`` (if known), with an optional note."""

    current: int | float
    total: int | float | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        check_number(self.current, "Progress.current")
        if self.total is not None:
            check_number(self.total, "Progress.total")
        check_optional_text(self.message, "Progress.message", max_bytes=4096)


@dataclass(frozen=True)
class Failure:
    """Why a task failed: the exception type, its message and (optionally) the traceback."""

    error_type: str
    message: str
    traceback: str | None = None

    def __post_init__(self) -> None:
        check_text(self.error_type, "Failure.error_type", max_bytes=1024)
        check_text(self.message, "Failure.message")
        check_optional_text(self.traceback, "Failure.traceback", max_bytes=256 * 1024)


def _tags(value: object) -> frozenset[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"tags must be a frozenset of str, not {type(value).__name__}")
    tags = frozenset(value)
    for tag in tags:
        check_identifier(tag, "tag")
    return tags


@dataclass(frozen=True)
class TaskSnapshot:
    """One task as the store holds it.

    ``status_version`` is the compare-and-set token: every ``save`` names the version it read.
    ``heartbeat_at`` (is the task moving?) and ``lease_owner``/``lease_until`` (is anyone
    supervising it?) are two separate signals, each stored as given. ``create`` stores the
    snapshot as given, lease included; afterwards ``touch`` writes the heartbeat and the lease,
    ``save`` writes the heartbeat the snapshot carries and never the lease columns.
    ``priority`` (-100..100, 0 by default) orders the start among due ``PENDING`` tasks: higher
    first, then the one due earliest (``max(created_at, not_before)``, to the millisecond),
    then by ``task_id``.
    ``params`` and ``result`` hold msgpack-able values (None, bool, int, float, str, bytes, list,
    dict); tuples come back as lists.
    """

    task_id: str
    name: str
    status: TaskStatus
    status_version: int
    created_at: datetime
    updated_at: datetime
    tags: frozenset[str] = field(default_factory=frozenset)
    bucket: int = 0
    key: str | None = None
    pipeline_run_id: str | None = None
    params: Any = None
    result: Any = None
    progress: Progress | None = None
    failure: Failure | None = None
    heartbeat_at: datetime | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None
    attempt: int = 1
    not_before: datetime | None = None
    priority: int = 0
    #: The task's frozen policies (``chongming_redis.policy``): its retry policy (``None``:
    #: the worker's default), the seconds one attempt may run and a finished task is kept
    #: (``None``: no limit), the deadline of the attempt running now (written by the start:
    #: start time + ``timeout``) and the unique id it holds while unfinished.
    retry: RetryPolicy | None = None
    timeout: float | None = None
    deadline: datetime | None = None
    retention: float | None = None
    unique: str | None = None
    #: The limits the task starts under (``chongming_redis.limits``): its refs, ``"<id>"`` or
    #: ``"<id>=<key>"``, resolved from its params when it was submitted.
    limits: tuple[str, ...] = ()
    #: The tasks this one waits for (``submit(..., after=...)``; ``chongming_redis.workflows``)
    #: and what a parent that ends other than ``SUCCEEDED`` does to it: ``"stop"`` ends it
    #: ``STOPPED``, ``"run"`` lets it run once every parent has ended. Fixed at creation.
    parents: tuple[str, ...] = ()
    on_parent_failure: str = "stop"

    def __post_init__(self) -> None:
        fields = self.__dict__
        for name, check in _SNAPSHOT_CHECKS.items():
            value = fields[name]
            if value is None and name in _NONE_IS_VALID:
                continue  # most optional fields are unset: nothing to check or convert
            _set(self, name, check(value))
        _check_waiting(self.status, self.parents)

    def evolve(self, **changes: Any) -> TaskSnapshot:
        """``dataclasses.replace`` that checks only the fields it changes (the others were
        checked when this snapshot was made): the runtime's every state change goes through
        it. Same errors as the constructor; an unknown field is a ``TypeError``."""
        fields = dict(self.__dict__)
        for name, value in changes.items():
            check = _SNAPSHOT_CHECKS.get(name)
            if check is None:
                raise TypeError(f"TaskSnapshot has no field {name!r}")
            fields[name] = check(value)
        if "status" in changes or "parents" in changes:
            _check_waiting(fields["status"], fields["parents"])
        new = object.__new__(TaskSnapshot)
        new.__dict__.update(fields)
        return new


def _check_waiting(status: TaskStatus, parents: tuple[str, ...]) -> None:
    if status is TaskStatus.WAITING and not parents:
        raise ValueError("a WAITING task waits for parents: give it at least one")


def _optional_instance(kind: type, what: str) -> Callable[[object], Any]:
    def check(value: object) -> object:
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{what} must be a {kind.__name__}, not {type(value).__name__}")
        return value

    return check


#: Each field's check, in declaration order; returns the value as stored (datetimes in UTC,
#: tags as a frozenset).
_SNAPSHOT_CHECKS: dict[str, Callable[[Any], Any]] = {
    "task_id": lambda v: check_identifier(v, "task_id"),
    "name": lambda v: check_identifier(v, "name"),
    "status": lambda v: _status(v, "status"),
    "status_version": lambda v: check_int(v, "status_version"),
    "created_at": lambda v: check_dt(v, "created_at"),
    "updated_at": lambda v: check_dt(v, "updated_at"),
    "tags": _tags,
    "bucket": lambda v: check_int(v, "bucket", maximum=2**31 - 1),
    "key": lambda v: check_optional_identifier(v, "key"),
    "pipeline_run_id": lambda v: check_optional_identifier(v, "pipeline_run_id"),
    "params": lambda v: v,
    "result": lambda v: v,
    "progress": _optional_instance(Progress, "progress"),
    "failure": _optional_instance(Failure, "failure"),
    "heartbeat_at": lambda v: check_optional_dt(v, "heartbeat_at"),
    "lease_owner": lambda v: check_optional_identifier(v, "lease_owner"),
    "lease_until": lambda v: check_optional_dt(v, "lease_until"),
    "attempt": lambda v: check_int(v, "attempt"),
    "not_before": lambda v: check_optional_dt(v, "not_before"),
    "priority": check_priority,
    "retry": lambda v: _optional_instance(RetryPolicy, "retry")(v),
    "timeout": lambda v: check_duration(v, "timeout", maximum=MAX_TIMEOUT),
    "deadline": lambda v: check_optional_dt(v, "deadline"),
    "retention": lambda v: check_duration(v, "retention", maximum=MAX_RETENTION),
    "unique": lambda v: check_optional_identifier(v, "unique"),
    "limits": lambda v: () if v == () else check_refs(v),
    "parents": lambda v: () if v == () else check_parents(v),
    "on_parent_failure": check_parent_failure,
}

#: The fields whose check takes ``None`` and returns it: skipped when ``None`` (the common
#: case), the same result for less work on every snapshot the runtime and the stores make.
_NONE_IS_VALID = frozenset(
    {"key", "pipeline_run_id", "params", "result", "progress", "failure", "heartbeat_at",
     "lease_owner", "lease_until", "not_before", "retry", "timeout", "deadline", "retention",
     "unique"}
)  # fmt: skip


def start_rank(
    priority: int, created_us: int, not_before_us: int | None, task_id: str
) -> tuple[int, int, str]:
    """Where a due ``PENDING`` task stands in the start order (lowest starts first), the same
    on every store: higher ``priority`` first, then the time it became due,
    ``max(created_at, not_before)`` in whole milliseconds, then ``task_id`` (code-point order).
    Times are microseconds since the epoch, as the stores keep them."""
    ready = created_us if not_before_us is None else max(created_us, not_before_us)
    return (-priority, ready // 1000, task_id)


@dataclass(frozen=True)
class Transition:
    """One entry of a task's audit history: the move that produced ``version``.

    ``from_status`` is ``None`` for the entry that records the task's creation. ``version`` is
    at least 1: ``history`` returns the entries above ``since_version`` (0 by default), so an
    entry at version 0 could never be read back.
    """

    task_id: str
    version: int
    from_status: TaskStatus | None
    to_status: TaskStatus
    at: datetime
    reason: str | None = None

    def __post_init__(self) -> None:
        check_identifier(self.task_id, "task_id")
        check_int(self.version, "version", minimum=1)
        if self.from_status is not None:
            _status(self.from_status, "from_status")
        _status(self.to_status, "to_status")
        _set(self, "at", check_dt(self.at, "at"))
        check_optional_text(self.reason, "reason")


@dataclass(frozen=True)
class Command:
    """A control request for the process that holds a task. Stores pass it on, never act on it.

    ``lease_until`` is set by ``claim_commands``; ``finished_at``/``outcome`` by
    ``complete_command``.
    """

    command_id: str
    task_id: str
    kind: CommandKind
    created_at: datetime
    issued_by: str | None = None
    payload: Any = None
    lease_until: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None

    def __post_init__(self) -> None:
        check_identifier(self.command_id, "command_id")
        check_identifier(self.task_id, "task_id")
        if not isinstance(self.kind, CommandKind):
            raise TypeError(f"kind must be a CommandKind, not {type(self.kind).__name__}")
        _set(self, "created_at", check_dt(self.created_at, "created_at"))
        check_optional_identifier(self.issued_by, "issued_by")
        _set(self, "lease_until", check_optional_dt(self.lease_until, "lease_until"))
        _set(self, "finished_at", check_optional_dt(self.finished_at, "finished_at"))
        check_optional_text(self.outcome, "outcome", max_bytes=1024)


@dataclass(frozen=True)
class TaskQuery:
    """What ``TaskStore.query`` filters on. ``None`` means "no restriction".

    All given filters must hold (AND). ``statuses`` and ``buckets`` match any member (OR within
    the set). ``tag`` matches exactly (``io`` never matches ``ios``). Results are ordered by
    ``created_at`` (ties by ``task_id``), newest first with ``newest_first=True``.
    """

    statuses: frozenset[TaskStatus] | None = None
    name: str | None = None
    name_prefix: str | None = None
    tag: str | None = None
    buckets: frozenset[int] | None = None
    pipeline_run_id: str | None = None
    limit: int | None = None
    newest_first: bool = False

    def __post_init__(self) -> None:
        if self.statuses is not None:
            _set(self, "statuses", _frozen(self.statuses, "statuses"))
            for status in self.statuses:
                _status(status, "statuses member")
        check_optional_identifier(self.name, "name")
        check_optional_identifier(self.name_prefix, "name_prefix")
        check_optional_identifier(self.tag, "tag")
        if self.buckets is not None:
            _set(self, "buckets", _frozen(self.buckets, "buckets"))
            for bucket in self.buckets:
                check_int(bucket, "buckets member", maximum=2**31 - 1)
        check_optional_identifier(self.pipeline_run_id, "pipeline_run_id")
        if self.limit is not None:
            check_int(self.limit, "limit")
        check_bool(self.newest_first, "newest_first")


def _frozen(value: object, what: str) -> frozenset[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a set, not {type(value).__name__}")
    return frozenset(value)


# -- the change feed -----------------------------------------------------------------------


@dataclass(frozen=True)
class Tombstone:
    """A pruned task in the change feed: enough to find what a reader bound to it. It stays in
    the feed forever (cursors never expire); a task created again with the same id is a new
    item at a later position."""

    task_id: str
    removed_at: datetime
    name: str
    bucket: int
    status: str = "removed"

    def __post_init__(self) -> None:
        check_identifier(self.task_id, "task_id")
        _set(self, "removed_at", check_dt(self.removed_at, "removed_at"))
        check_identifier(self.name, "name")
        check_int(self.bucket, "bucket", maximum=2**31 - 1)
        if self.status != "removed":
            raise ValueError(f"a Tombstone's status is 'removed', not {self.status!r}")


@dataclass(frozen=True)
class ChangePage:
    """One page of the change feed: tasks (current state) and tombstones ordered by each one's
    latest change, and the cursor to read on from. An empty page means caught up and carries
    the cursor it was asked with; a non-empty page always advances it."""

    tasks: tuple[TaskSnapshot | Tombstone, ...]
    next_cursor: str

    def __post_init__(self) -> None:
        _set(self, "tasks", tuple(self.tasks))
        for item in self.tasks:
            if not isinstance(item, TaskSnapshot | Tombstone):
                raise TypeError(f"a page holds snapshots and tombstones, not {type(item).__name__}")
        check_text(self.next_cursor, "next_cursor", max_bytes=32)


@dataclass(frozen=True)
class FeedStats:
    """What the feed costs: ``head`` (the last position issued), ``items`` (one per live task
    plus every tombstone) and ``tombstones`` (kept forever: they only grow)."""

    head: int
    items: int
    tombstones: int


# -- what a dashboard reads ----------------------------------------------------------------


@dataclass(frozen=True)
class CommandBacklog:
    """The unfinished control commands (``CommandInspectingStore.command_backlog``):
    ``unclaimed`` (never claimed, or released), ``leased`` (a lease, valid or expired, not
    finished) and ``oldest_unclaimed_at`` (``created_at`` of the oldest unclaimed one, ``None``
    when there is none). A command whose lease expired counts as leased until it is claimed
    again or released: the stores keep it with its lease until then."""

    unclaimed: int
    leased: int
    oldest_unclaimed_at: datetime | None

    def __post_init__(self) -> None:
        check_int(self.unclaimed, "unclaimed")
        check_int(self.leased, "leased")
        oldest = check_optional_dt(self.oldest_unclaimed_at, "oldest_unclaimed_at")
        _set(self, "oldest_unclaimed_at", oldest)
