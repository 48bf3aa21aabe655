"""How the end of a task function is read: whether a stop or loss it raised is its own, and
the failure an exception is stored as (the runner's rules, kept apart so they read as rules)."""

from __future__ import annotations

import traceback
from datetime import datetime, timedelta

from chongming_redis.model import Failure, TaskSnapshot, TaskStatus
from chongming_redis.runtime.context import TaskContext, TaskInterrupted


def is_own(exc: TaskInterrupted, ctx: TaskContext, known: bool) -> bool:
    """Whether a stop or loss that ended a task function is its own (``known``: the context
    saw it): one raised by ``wait`` on another task, passing through, is a failure."""
    return known and exc.task_id == ctx.task_id


def failure_of(exc: BaseException) -> Failure:
    """The stored failure of an exception (its traceback, bounded)."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failure(type(exc).__name__, str(exc)[:4000], trace[-16000:])


def overdue_in_store(snapshot: TaskSnapshot, now: datetime, grace: float) -> bool:
    """A ``RUNNING`` task past the deadline its start recorded, plus ``grace`` seconds."""
    return (
        snapshot.status is TaskStatus.RUNNING
        and snapshot.deadline is not None
        and snapshot.deadline + timedelta(seconds=grace) <= now
    )


def timed_out_failure(snapshot: TaskSnapshot, by: str) -> Failure:
    return Failure("TaskTimeout", f"task {snapshot.task_id!r}: attempt {snapshot.attempt} was "
                   f"still RUNNING past its deadline {snapshot.deadline} (timeout "
                   f"{snapshot.timeout:g}s); ended by {by}")  # fmt: skip
