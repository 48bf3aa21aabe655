"""What a running task sees: ``TaskContext.checkpoint`` and the exceptions it may raise."""

from __future__ import annotations

import threading
import time
from typing import Any

from chongming_redis.model import Progress


class TaskInterrupted(Exception):
    """Base of the exceptions ``checkpoint`` raises to end a task early."""


class TaskStopped(TaskInterrupted):
    """A stop was requested: let it propagate; the task is recorded ``STOPPED``."""


class TaskLost(TaskInterrupted):
    """This process no longer holds the task (its lease lapsed or another writer moved it on).
    Nothing the task does from now on is written; do no more work."""


class TaskContext:
    """Handed to every task function as its first argument.

    ``checkpoint()`` is cheap: it records the heartbeat (and progress) in memory, and the
    controller writes them to the store with ``touch``, coalesced, from its own thread. It raises
    ``TaskStopped`` when a stop was requested, raises ``TaskLost`` when this process lost the
    task, and blocks while the task is paused.
    """

    def __init__(self, task_id: str, attempt: int, owner: str) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.owner = owner
        self._cond = threading.Condition()
        self._stop = False
        self._paused = False
        self._lost_reason: str | None = None
        self._lease_deadline = float("inf")  # monotonic: our lease is known valid until then
        self.progress: Progress | None = None
        self.progress_dirty = False
        self.beats = 0

    # -- called by the task ----------------------------------------------------------------

    def checkpoint(
        self,
        progress: Progress | None = None,
        *,
        current: int | float | None = None,
        total: int | float | None = None,
        message: str | None = None,
    ) -> None:
        if progress is None and current is not None:
            progress = Progress(current, total, message)
        with self._cond:
            self.beats += 1
            if progress is not None:
                self.progress = progress
                self.progress_dirty = True
            self._gate()

    def gate(self) -> None:
        """What a checkpoint does besides the heartbeat: raise on a stop or a loss, block while
        paused. The runner calls it before the task function starts, so a task stopped or
        paused while it waited for a free slot never begins its work."""
        with self._cond:
            self._gate()

    def _gate(self) -> None:
        while True:
            self._raise_if_interrupted()
            if not self._paused:
                return
            self._cond.wait(timeout=0.2)

    @property
    def stop_requested(self) -> bool:
        return self._stop

    def record(self, progress: Progress | None) -> None:
        """A heartbeat (and progress) from a task running in a child process: recorded, never
        blocking or raising (the parent controls the child with signals instead)."""
        with self._cond:
            self.beats += 1
            if progress is not None:
                self.progress = progress
                self.progress_dirty = True

    # -- called by the controller ----------------------------------------------------------

    def request_stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def set_paused(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def lose(self, reason: str) -> None:
        with self._cond:
            if self._lost_reason is None:
                self._lost_reason = reason
            self._cond.notify_all()

    def take_progress(self) -> tuple[int, Progress | None]:
        """The beat count and the progress not yet written (``None`` if unchanged), read and
        marked written in one step, so a checkpoint in between is not lost."""
        with self._cond:
            progress = self.progress if self.progress_dirty else None
            self.progress_dirty = False
            return self.beats, progress

    def extend_lease(self, deadline: float) -> None:
        self._lease_deadline = deadline

    @property
    def lost_reason(self) -> str | None:
        if self._lost_reason is None and time.monotonic() > self._lease_deadline:
            self._lost_reason = "lease could not be renewed before it expired"
        return self._lost_reason

    @property
    def paused(self) -> bool:
        return self._paused

    def _raise_if_interrupted(self) -> None:
        reason = self.lost_reason
        if reason is not None:
            raise TaskLost(f"task {self.task_id!r}: {reason}")
        if self._stop:
            raise TaskStopped(f"task {self.task_id!r}: stop requested")

    def __repr__(self) -> str:
        state: dict[str, Any] = {"stop": self._stop, "paused": self._paused}
        return f"TaskContext({self.task_id!r}, attempt={self.attempt}, {state})"
