"""How a task ended, as an exception: ``TaskFailed``, ``TaskStopped``, ``TaskLost``.

One class per outcome, raised on both sides of the store:

* **inside a task**, ``ctx.checkpoint()`` raises ``TaskStopped`` when a stop was requested and
  ``TaskLost`` when this process no longer holds the task (let them propagate);
* **in a producer**, ``handle.wait()`` raises ``TaskFailed`` / ``TaskStopped`` / ``TaskLost``
  when the awaited task ended that way, with its stored snapshot.

So ``except TaskStopped`` means "that task was stopped" wherever it is written. The runner
tells its own task's stop apart from one that merely passes through a task (a task that waits
for another task which was stopped): only an exception naming the running task, while a stop
or a loss of it is known, ends it ``STOPPED`` or discarded; any other is an ordinary failure.
"""

from __future__ import annotations

from chongming_redis.model import Failure, TaskSnapshot


class TaskOutcome(Exception):
    """Base of the three: the task ``task_id`` ended (or must end) without a result.
    ``snapshot``: the task as stored, when the exception comes from the store (``wait``)."""

    def __init__(
        self, task_id: str, message: str | None = None, *, snapshot: TaskSnapshot | None = None
    ) -> None:
        self.task_id = task_id
        self.snapshot = snapshot
        super().__init__(message or self._default_message())

    def _default_message(self) -> str:
        return f"task {self.task_id!r} ended"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.task_id, str(self), self.snapshot))


def _rebuild(
    cls: type[TaskOutcome], task_id: str, message: str, snapshot: TaskSnapshot | None
) -> TaskOutcome:
    return cls(task_id, message, snapshot=snapshot)


class TaskInterrupted(TaskOutcome):
    """Base of what ``checkpoint`` raises to end a task early (``TaskStopped``, ``TaskLost``)."""


class TaskStopped(TaskInterrupted):
    """The task was stopped: inside it, a stop was requested (let it propagate; the task is
    recorded ``STOPPED``); from ``wait``, it ended ``STOPPED``."""

    def _default_message(self) -> str:
        return f"task {self.task_id!r} was stopped"


class TaskLost(TaskInterrupted):
    """The task was lost: inside it, this process no longer holds it (its lease lapsed or
    another writer moved it on; nothing it does from now on is written, do no more work);
    from ``wait``, it ended ``LOST`` with no attempt left."""

    def _default_message(self) -> str:
        return f"task {self.task_id!r} was lost"


class TaskFailed(TaskOutcome):
    """The task raised: ``failure`` is what was stored (type, message, traceback)."""

    def __init__(
        self,
        task_id: str,
        message: str | None = None,
        *,
        snapshot: TaskSnapshot | None = None,
    ) -> None:
        self.failure: Failure | None = None if snapshot is None else snapshot.failure
        super().__init__(task_id, message, snapshot=snapshot)

    def _default_message(self) -> str:
        if self.failure is None:
            return f"task {self.task_id!r} failed"
        return f"task {self.task_id!r} failed: {self.failure.error_type}: {self.failure.message}"
