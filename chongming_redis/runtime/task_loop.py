"""``TaskLoop``: the event loop that runs a controller's ``async def`` tasks.

One asyncio loop in one daemon thread per controller, started by the first ``async def`` task
(a worker of plain functions never starts it) and stopped by ``Runner.close``. The loop runs
task functions only: the runner gives a coroutine task its slot, submits it here, and records
how it ended in a pool thread (``Runner._finish_async``), so no store round trip ever blocks
the loop.

Control reaches a coroutine through its ``TaskContext``: ``await ctx.acheckpoint()`` raises on
a stop or a loss and awaits a pause; and a stop or a loss also **cancels** the task wherever it
awaits (``asyncio.sleep(60)``, a socket), so a task that rarely checkpoints still ends at once.
Such a cancellation is turned back into the context's ``TaskStopped`` / ``TaskLost`` here, and
the runner records it as any other stop or loss. A loss that nobody announces (our own lease
deadline passing while renewals fail) is found by a sweep every ``sweep_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from chongming_redis.runtime.context import TaskContext

log = logging.getLogger("chongming_redis.runtime")

TaskFn = Callable[[TaskContext, Any], Awaitable[Any]]


class TaskLoop:
    def __init__(self, name: str, *, sweep_interval: float = 0.25, grace: float = 2.0) -> None:
        self.name = name
        self.sweep_interval = sweep_interval
        self.grace = grace  # at close: how long cancelled tasks get to finish
        self._start_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Touched on the loop thread only: the running tasks, and those already cancelled.
        self._running: dict[asyncio.Task[Any], TaskContext] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._sweeping = False

    def submit(self, ctx: TaskContext, fn: TaskFn, params: Callable[[], Any]) -> Future[Any]:
        """Run ``fn(ctx, params())`` on the loop (started now if need be). The future ends with
        the result, the task's exception, the context's ``TaskStopped`` / ``TaskLost``, or
        cancelled (the task was cancelled by something else than a stop or a loss)."""
        return asyncio.run_coroutine_threadsafe(self._run(ctx, fn, params), self._started())

    def close(self) -> None:
        """Stop the loop: tasks still running are cancelled and get ``grace`` seconds."""
        with self._start_lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread, self._closed = None, None, True
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self.grace + 5)

    # -- the loop thread -------------------------------------------------------------------

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._closed:
                raise RuntimeError("the task loop is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=self._main, args=(loop,),
                                          name=f"{self.name}-loop", daemon=True)  # fmt: skip
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=self.grace))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    async def _run(self, ctx: TaskContext, fn: TaskFn, params: Callable[[], Any]) -> Any:
        task = asyncio.current_task()
        assert task is not None
        watcher = _canceller(asyncio.get_running_loop(), self._check, task)
        self._running[task] = ctx
        ctx.watch(watcher)
        self._sweep_soon()
        try:
            await ctx.agate()  # stopped or paused while it waited for its slot
            return await fn(ctx, params())
        except asyncio.CancelledError:
            if task in self._cancelled:  # our cancellation: the stop or loss that caused it
                ctx.raise_if_interrupted()
            raise
        finally:
            ctx.unwatch(watcher)
            del self._running[task]
            self._cancelled.discard(task)

    def _check(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` (once) if its context was stopped or lost."""
        ctx = self._running.get(task)
        if ctx is not None and task not in self._cancelled and ctx.interrupted:
            self._cancelled.add(task)
            task.cancel()

    def _sweep_soon(self) -> None:
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(self.sweep_interval, self._sweep)

    def _sweep(self) -> None:
        self._sweeping = False
        for task in list(self._running):
            self._check(task)
        if self._running:
            self._sweep_soon()


def _canceller(
    loop: asyncio.AbstractEventLoop, check: Callable[[asyncio.Task[Any]], None],
    task: asyncio.Task[Any],
) -> Callable[[], None]:  # fmt: skip
    """A context watcher: look at ``task`` on its loop after any control change."""

    def watcher() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the task ended with it
            loop.call_soon_threadsafe(check, task)

    return watcher
