"""What a running task sees: ``TaskContext.checkpoint`` (``acheckpoint`` in an ``async def``
task) and the exceptions they may raise."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from chongming_redis.model import Progress, TaskSnapshot, TaskStatus
from chongming_redis.outcomes import TaskInterrupted, TaskLost, TaskStopped
from chongming_redis.policy import TaskTimeout

__all__ = ["TaskContext", "TaskInterrupted", "TaskLost", "TaskStopped"]


class TaskContext:
    """Handed to every task function as its first argument.

    ``checkpoint()`` is cheap: it records the heartbeat (and progress) in memory, and the
    controller writes them to the store with ``touch``, coalesced, from its own thread. It raises
    ``TaskStopped`` when a stop was requested, raises ``TaskLost`` when this process lost the
    task, and blocks while the task is paused. An ``async def`` task calls
    ``await ctx.acheckpoint()`` instead: the same, but a pause is awaited, so the event loop
    keeps running the other tasks.
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
        self._timeout_at = float("inf")  # monotonic: when this attempt's timeout passes
        self._timeout = 0.0
        self.progress: Progress | None = None
        self.progress_dirty = False
        self.beats = 0
        #: Called (from the controlling thread) after every stop, pause, resume or loss.
        self._watchers: list[Callable[[], None]] = []
        #: The task's parents (``submit(after=...)``) and how to read one (the runner sets
        #: both; a context made by hand has none).
        self.parents: tuple[str, ...] = ()
        self.read_task: Callable[[str], TaskSnapshot | None] | None = None
        self._parent_results: dict[str, Any] | None = None

    # -- called by the task ----------------------------------------------------------------

    def parent_results(self) -> dict[str, Any]:
        """Task id -> result of each parent (``submit(..., after=...)``), in the order they
        were given: read from the store at the first call, then kept. ``None`` for a parent
        that did not succeed (a child runs after one only under ``on_parent_failure="run"``)
        or no longer exists; ``{}`` for a task without parents."""
        if self._parent_results is None:
            read = self.read_task
            found = {p: None if read is None else read(p) for p in self.parents}
            self._parent_results = {
                p: s.result if s is not None and s.status is TaskStatus.SUCCEEDED else None
                for p, s in found.items()
            }
        return dict(self._parent_results)

    def checkpoint(
        self,
        progress: Progress | None = None,
        *,
        current: int | float | None = None,
        total: int | float | None = None,
        message: str | None = None,
    ) -> None:
        if asyncio._get_running_loop() is not None:
            # It would block the whole event loop during a pause (every task on it): refused on
            # every call, not only during a pause, so the mistake shows on the first run.
            raise RuntimeError(
                "ctx.checkpoint() blocks while the task is paused and would block the event "
                "loop: in an async task use `await ctx.acheckpoint()`"
            )
        if progress is None and current is not None:
            progress = Progress(current, total, message)
        with self._cond:
            self.beats += 1
            if progress is not None:
                self.progress = progress
                self.progress_dirty = True
            self._gate()

    async def acheckpoint(
        self,
        progress: Progress | None = None,
        *,
        current: int | float | None = None,
        total: int | float | None = None,
        message: str | None = None,
    ) -> None:
        """``checkpoint`` for an ``async def`` task (same arguments): records the heartbeat and
        progress, raises ``TaskStopped`` / ``TaskLost``, and while the task is paused awaits
        the resume (other tasks on the loop keep running)."""
        if progress is None and current is not None:
            progress = Progress(current, total, message)
        self.record(progress)
        await self.agate()

    async def agate(self) -> None:
        """``gate`` for an ``async def`` task: raise on a stop or a loss, await while paused."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                self._raise_if_interrupted()
                if not self._paused:
                    return
                woken: asyncio.Future[None] = loop.create_future()
                wake = _waker(loop, woken)
                self._watchers.append(wake)  # under the lock: no change is missed
            try:
                # The timeout: a lease deadline passes without anyone calling ``lose``.
                await asyncio.wait({woken}, timeout=0.2)
            finally:
                self.unwatch(wake)

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

    @property
    def interrupted(self) -> bool:
        """A stop was requested, the task was lost or its timeout passed: it must end."""
        return self._stop or self.lost_reason is not None or self.timed_out

    @property
    def timed_out(self) -> bool:
        """This attempt has run past its task type's ``timeout``."""
        return time.monotonic() >= self._timeout_at

    def overdue(self, grace: float) -> bool:
        """Past its timeout by more than ``grace`` seconds: it did not end at a checkpoint."""
        return time.monotonic() >= self._timeout_at + grace

    def raise_if_interrupted(self) -> None:
        """Raise ``TaskLost`` or ``TaskStopped`` if either applies (no heartbeat, no wait)."""
        with self._cond:
            self._raise_if_interrupted()

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
        self._notify()

    def set_paused(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify_all()
        self._notify()

    def lose(self, reason: str) -> None:
        with self._cond:
            if self._lost_reason is None:
                self._lost_reason = reason
            self._cond.notify_all()
        self._notify()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every stop, pause, resume or loss, in the thread that made
        it (the event loop uses it to wake or cancel an ``async def`` task). It must not
        block or take this context's lock."""
        with self._cond:
            self._watchers.append(callback)

    def unwatch(self, callback: Callable[[], None]) -> None:
        with self._cond:
            if callback in self._watchers:
                self._watchers.remove(callback)

    def _notify(self) -> None:
        with self._cond:
            watchers = list(self._watchers)
        for callback in watchers:
            callback()

    def take_progress(self) -> tuple[int, Progress | None]:
        """The beat count and the progress not yet written (``None`` if unchanged), read and
        marked written in one step, so a checkpoint in between is not lost."""
        with self._cond:
            progress = self.progress if self.progress_dirty else None
            self.progress_dirty = False
            return self.beats, progress

    def extend_lease(self, deadline: float) -> None:
        self._lease_deadline = deadline

    def set_timeout(self, seconds: float, started: float) -> None:
        """This attempt may run ``seconds`` from ``started`` (monotonic): ``checkpoint()``
        raises ``TaskTimeout`` after that."""
        self._timeout, self._timeout_at = seconds, started + seconds

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
            raise TaskLost(self.task_id, f"task {self.task_id!r}: {reason}")
        if self._stop:
            raise TaskStopped(self.task_id, f"task {self.task_id!r}: stop requested")
        if self.timed_out:
            raise self.timeout_error()

    def timeout_error(self) -> TaskTimeout:
        return TaskTimeout(f"task {self.task_id!r}: attempt {self.attempt} ran past its "
                           f"timeout of {self._timeout:g}s")  # fmt: skip

    def __repr__(self) -> str:
        state: dict[str, Any] = {"stop": self._stop, "paused": self._paused}
        return f"TaskContext({self.task_id!r}, attempt={self.attempt}, {state})"


def _waker(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> Callable[[], None]:
    """A watcher that resolves ``woken`` on its loop, from any thread."""

    def resolve() -> None:
        if not woken.done():
            woken.set_result(None)

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits any more
            loop.call_soon_threadsafe(resolve)

    return wake
