"""What every producer writes, planned without I/O: a new task, a new attempt of a finished
one, a stop/pause/resume of a task nobody holds, and how a finished task's state reads to a
waiting caller. ``Controller``, ``Client`` and ``AsyncClient`` share it, so a task submitted
by any of them is the same record with the same first history entry."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.limits import BoundLimit, refs_for
from chongming_redis.model import CommandKind, TaskSnapshot, TaskStatus, Transition
from chongming_redis.outcomes import TaskFailed, TaskLost, TaskOutcome, TaskStopped
from chongming_redis.parents import check_parent_failure, check_parents
from chongming_redis.policy import (
    MAX_RETENTION,
    MAX_TIMEOUT,
    RetryPolicy,
    check_duration,
)
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.held import advance, holder
from chongming_redis.stores.codec import encode_payload
from chongming_redis.stores.extensions import keeps_dependencies
from chongming_redis.validation import check_optional_identifier, check_priority

#: Statuses a task can be retried from by hand (``Client.retry``, ``chongming-redis retry``).
RETRYABLE = frozenset({TaskStatus.FAILED, TaskStatus.STOPPED, TaskStatus.LOST})


@dataclass(frozen=True)
class NewTask:
    """What to submit: a task type (validated when an ``App`` knows it) and its options."""

    name: str
    params: Any = None
    key: str | None = None
    tags: Iterable[str] = ()
    task_id: str | None = None
    pipeline_run_id: str | None = None
    not_before: datetime | None = None
    #: None: the task type's priority (0 when no app knows the type).
    priority: int | None = None
    #: None: the task type's (``policy``); ``retention`` then the app's, else the default.
    retry: RetryPolicy | None = None
    timeout: float | timedelta | None = None
    retention: float | timedelta | None = None
    #: Created only while no unfinished task holds this id (``Client.submit(unique=...)``).
    unique: str | None = None
    #: The parents' task ids (``Client.submit(after=...)``): created ``WAITING`` for them.
    after: tuple[str, ...] = ()
    on_parent_failure: str = "stop"


def resolve(app: App | None, task: str | TaskType) -> tuple[str, TaskType | None]:
    """The task's name and type: a ``TaskType`` as given; a name through ``app`` (which
    raises ``UnknownTask`` for a misspelt one); a bare name when no app is known (its
    parameters are then stored unvalidated)."""
    if isinstance(task, TaskType):
        return task.name, task
    if not isinstance(task, str):
        raise TypeError(f"task must be a task name or a registered task, not {type(task).__name__}")
    if app is not None:  # an app with no tasks knows no name: refused, not unchecked
        return task, app.get(task)
    return task, None


def new_task(
    spec: NewTask,
    task_type: TaskType | None,
    *,
    now: datetime,
    buckets: BucketPolicy,
    submitted_by: str,
    recorded_limits: tuple[BoundLimit, ...] = (),
) -> tuple[TaskSnapshot, Transition]:
    """A ``PENDING`` task and its first history entry; validates everything before anything
    is written (``InvalidParams``, ``TypeError``, ``ValueError``, ``LimitKeyError``). Its limit
    refs are resolved from its stored params under its type's limits, else (a producer without
    the type's code) under ``recorded_limits``, the definitions its workers recorded."""
    stored = spec.params if task_type is None else task_type.validate(spec.params)
    bound = recorded_limits if task_type is None else task_type.limits
    refs = refs_for(bound, stored) if bound else ()
    priority = spec.priority if spec.priority is not None else (
        0 if task_type is None else task_type.priority)  # fmt: skip
    task_id = spec.task_id or secrets.token_hex(10)
    unique = check_optional_identifier(spec.unique, "unique")
    parents = check_parents(spec.after)
    status = TaskStatus.WAITING if parents else TaskStatus.PENDING
    if task_id in parents:
        raise ValueError(f"task {task_id!r} cannot wait for itself")
    snapshot = TaskSnapshot(
        task_id=task_id, name=spec.name, status=status, status_version=1,
        created_at=now, updated_at=now, tags=frozenset(spec.tags),
        # A unique id routes like a key: its tasks share one bucket (and one owner).
        bucket=buckets.bucket_for(spec.key or unique or task_id), key=spec.key,
        pipeline_run_id=spec.pipeline_run_id, params=stored, not_before=spec.not_before,
        priority=check_priority(priority), unique=unique, limits=refs, parents=parents,
        on_parent_failure=check_parent_failure(spec.on_parent_failure),
        **frozen_policies(spec, task_type),
    )  # fmt: skip
    encode_payload(stored, "params")  # refuse an oversized or unencodable payload now
    transition = Transition(task_id, 1, None, status, now, submitted_reason(submitted_by, parents))
    return snapshot, transition


def submitted_reason(submitted_by: str, parents: tuple[str, ...]) -> str:
    """The first history entry's reason; a waiting task's names its first parents."""
    if not parents:
        return f"submitted by {submitted_by}"
    named = ", ".join(parents[:3]) + (f" and {len(parents) - 3} more" if len(parents) > 3 else "")
    return f"submitted by {submitted_by}, after {named}"


def with_parents(store: object, policies: dict[str, Any]) -> dict[str, Any]:
    """``policies`` with ``after`` as task ids (``parent_ids``); ``TypeError`` when it names
    parents and ``store`` keeps no dependencies (nothing would ever release the task)."""
    after = policies.get("after")
    if after is None:
        return policies
    parents = parent_ids(after)
    if parents and not keeps_dependencies(store):
        raise TypeError(f"{type(store).__name__} keeps no dependencies (it is no "
                        "DependenciesStore): submit without after=")  # fmt: skip
    return {**policies, "after": parents}


def parent_ids(after: Iterable[object]) -> tuple[str, ...]:
    """Task ids from what ``after=`` takes: ids, handles (``.task_id``) or workflow nodes."""
    if isinstance(after, str | bytes):
        raise TypeError("after must be a list of tasks (ids or handles), not one string")
    ids: list[Any] = [getattr(item, "task_id", item) for item in after]
    return tuple(ids)  # check_parents (new_task) checks each is an id


def frozen_policies(spec: NewTask, task_type: TaskType | None) -> dict[str, Any]:
    """The policies frozen into a new task: the submit's, else its type's (retention: its
    type's, its app's, else ``DEFAULT_RETENTION``). Without the type (a producer that does not
    import the worker's code) only what the submit names: the worker that starts the task
    fills in its type's (``fill_policies``). ``TypeError``/``ValueError`` for a bad one."""
    if spec.retry is not None and not isinstance(spec.retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, not {type(spec.retry).__name__}")
    timeout = check_duration(spec.timeout, "timeout", maximum=MAX_TIMEOUT)
    retention = check_duration(spec.retention, "retention", maximum=MAX_RETENTION)
    if task_type is None:  # a producer without the type's code: the worker fills them in
        return {"retry": spec.retry, "timeout": timeout, "retention": retention}
    return {
        "retry": spec.retry or task_type.retry,
        "timeout": timeout if timeout is not None else task_type.timeout,
        "retention": retention if retention is not None else task_type.retention_or_default,
    }


def fill_policies(snapshot: TaskSnapshot, task_type: TaskType | None) -> TaskSnapshot:
    """A task its producer froze no policy into, with its type's as this worker knows them
    (kept in memory by its holder, written with its next save)."""
    if task_type is None:
        return snapshot
    changes: dict[str, Any] = {}
    if snapshot.retry is None and task_type.retry is not None:
        changes["retry"] = task_type.retry
    if snapshot.timeout is None and task_type.timeout is not None:
        changes["timeout"] = task_type.timeout
    if snapshot.retention is None:
        changes["retention"] = task_type.retention_or_default
    return snapshot.evolve(**changes) if changes else snapshot


def retried(snapshot: TaskSnapshot, now: datetime, by: str) -> tuple[TaskSnapshot, Transition]:
    """A new attempt of a ``FAILED``/``STOPPED``/``LOST`` task, ``PENDING`` at once
    (``ValueError`` for any other status)."""
    if snapshot.status not in RETRYABLE:
        allowed = ", ".join(sorted(s.value for s in RETRYABLE))
        raise ValueError(
            f"task {snapshot.task_id!r} is {snapshot.status.value}: only a task that is "
            f"{allowed} can be retried"
        )
    new = advance(snapshot, TaskStatus.PENDING, now, attempt=snapshot.attempt + 1,
                  not_before=None, progress=None)  # fmt: skip
    reason = f"retry {snapshot.attempt + 1} by {by}"
    return new, Transition(snapshot.task_id, new.status_version, snapshot.status,
                           TaskStatus.PENDING, now, reason)  # fmt: skip


def unheld_target(snapshot: TaskSnapshot, kind: CommandKind) -> TaskStatus | None:
    """Where a stop/pause/resume moves a task nobody holds (``PENDING``, or paused while
    nobody ran it): ``None`` when it changes nothing (a pause of a paused task, a resume of a
    pending one). Only for ``holder(snapshot) is None`` and a non-terminal status."""
    if kind is CommandKind.STOP:
        return TaskStatus.STOPPED
    if kind is CommandKind.PAUSE:
        return TaskStatus.PAUSED if snapshot.status is TaskStatus.PENDING else None
    return TaskStatus.PENDING if snapshot.status is TaskStatus.PAUSED else None


def unchanged(snapshot: TaskSnapshot, kind: CommandKind) -> str:
    """The outcome of a control that changes nothing (``unheld_target`` is ``None``): the
    same words a holder answers with (``already-paused``, ``not-paused``)."""
    if kind is CommandKind.PAUSE and snapshot.status is TaskStatus.PAUSED:
        return "already-paused"
    if snapshot.status is TaskStatus.WAITING:  # only a stop applies while it waits
        return "waiting"
    if kind is CommandKind.RESUME and snapshot.status is not TaskStatus.PAUSED:
        return "not-paused"
    return "no-change"


def is_unheld(snapshot: TaskSnapshot) -> bool:
    return not snapshot.status.is_terminal and holder(snapshot) is None


def outcome(snapshot: TaskSnapshot) -> Any:
    """A finished task's result, or the ``TaskOutcome`` for how it ended without one."""
    if snapshot.status is TaskStatus.SUCCEEDED:
        return snapshot.result
    raise outcome_error(snapshot)


def outcome_error(snapshot: TaskSnapshot) -> TaskOutcome:
    task_id = snapshot.task_id
    if snapshot.status is TaskStatus.FAILED:
        return TaskFailed(task_id, snapshot=snapshot)
    if snapshot.status is TaskStatus.STOPPED:
        return TaskStopped(task_id, snapshot=snapshot)
    if snapshot.status is TaskStatus.LOST:
        return TaskLost(task_id, snapshot=snapshot)
    raise ValueError(f"task {task_id!r} is {snapshot.status.value}, not finished")


def backoff(attempt: int, *, first: float = 0.005, most: float = 0.1) -> float:
    """Seconds before a waiter's ``attempt``-th look (from 5 ms, doubling, at most 100 ms):
    a short task's result is seen within milliseconds, a long one costs 10 reads a second."""
    return float(min(most, first * 2 ** min(attempt, 10)))
