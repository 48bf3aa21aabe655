"""``Runner``: starting tasks and running them.

Starts ``PENDING`` tasks of the served buckets into free slots (one batched start where the
store has it), runs each in a thread of the executor (or in a child process, or, an ``async
def`` task, on the event loop of ``task_loop.TaskLoop``), records how it ended, and hands finished
tasks to the group committer — one ``commit_tasks`` for every task that finished since the last
round trip — or writes them at once where the store cannot batch.

Slots: ``concurrency`` tasks run at once, whatever their kind; the tasks started beyond that
(the prefetch) wait in ``_waiting`` and ``_dispatch`` hands each to the next free slot, in the
order they were started. An ``async def`` task holds its slot without holding a thread (the
loop runs any number of them), so a worker of many I/O-bound coroutines needs no thread each.

Each task's start and end is one line on ``chongming_redis.runtime.tasks`` (INFO; WARNING for a
failure, ERROR for a loss), built only when that level is enabled.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

from chongming_redis.model import Failure, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped
from chongming_redis.runtime.endings import failure_of, is_own
from chongming_redis.runtime.held import Held, HeldTasks
from chongming_redis.runtime.isolation import ChildFailed, run_in_process
from chongming_redis.runtime.starting import Starting
from chongming_redis.runtime.submission import fill_policies
from chongming_redis.runtime.task_log import TaskLog
from chongming_redis.runtime.task_loop import TaskLoop
from chongming_redis.runtime.window import Window
from chongming_redis.runtime.writer import TaskWriter
from chongming_redis.stores.codec import encode_payload

__all__ = ["Runner", "Window"]

log = logging.getLogger("chongming_redis.runtime")


class Runner(Starting):
    def __init__(
        self,
        writer: TaskWriter,
        *,
        app: App,
        num_buckets: int,
        serving: Callable[[], frozenset[int] | None],
        look_elsewhere: Callable[[], bool] = lambda: False,
        accepting: threading.Event,
        wake_starter: threading.Event,
    ) -> None:
        self.writer = writer
        self.held: HeldTasks = writer.held
        self.config = writer.config
        self.app = app
        self.num_buckets = num_buckets
        self.serving = serving
        self.look_elsewhere = look_elsewhere  # in a bucket pool: other buckets when idle
        self.accepting = accepting
        self.wake_starter = wake_starter
        self.log = TaskLog(writer.events)  # the lines per task, and the metrics' events
        self.group_commit = False
        self.commits: queue.SimpleQueue[Held] = queue.SimpleQueue()
        self._executor: ThreadPoolExecutor | None = None
        self._loop: TaskLoop | None = None
        # The slot accounting, all under _lock (_hold, _dispatch and _free_slot change it):
        self._lock = threading.Lock()
        self._outstanding = 0  # started here, not yet ended: what the window bounds
        self._busy = 0  # of those, holding a slot (at most concurrency)
        self._waiting: deque[Held] = deque()  # started, waiting for a slot (prefetched)
        self._closed = False
        #: How a started task that will not begin is handed back once shutdown has begun.
        self.shutdown_policy = "requeue"
        self._window = Window(self.config.concurrency, self.config.prefetch)
        #: One start call at a time (the starter thread, the committer after a commit, a
        #: caller's ``start_available``): each counts the free slots before its call.
        self._starting = threading.Lock()
        self._look_elsewhere_at = 0.0  # monotonic: when the other buckets may be looked at

    def open(self, owner: str) -> None:
        self.group_commit = self.writer.adapter.batching
        # Never more work items than slots (_dispatch), so a submit never waits for a thread.
        self._executor = ThreadPoolExecutor(self.config.concurrency,
                                            thread_name_prefix=f"{owner}-task")  # fmt: skip
        self._loop = TaskLoop(owner)  # its thread starts with the first async task
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._waiting.clear()  # the controller handed them back (they never began)
        if self._loop is not None:
            self._loop.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _hold(
        self, running: TaskSnapshot, renewed_at: float | None, pending: list[Transition]
    ) -> Held:
        """Hold a task that was just stored ``RUNNING`` and hand it to the executor.
        ``renewed_at``: when its lease was written, if the start wrote it."""
        running = fill_policies(running, self.app.types.get(running.name))
        ctx = TaskContext(running.task_id, running.attempt, self.writer.owner)
        ctx.parents, ctx.read_task = running.parents, self.writer.store.get
        if running.timeout is not None:  # from the start call: at or after the store's start
            ctx.set_timeout(running.timeout, renewed_at or time.monotonic())
        held = Held(running, running.status_version, ctx, pending=list(pending))
        if renewed_at is not None:
            held.lease_renewed_at = renewed_at
            ctx.extend_lease(renewed_at + self.config.task_lease * 0.8)
        self.held.add(held)
        with self._lock:
            self._outstanding += 1
            held.outstanding = True
            self._waiting.append(held)
        self._dispatch()
        return held

    # -- slots -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Give free slots to waiting tasks, oldest first: a coroutine to the event loop, a
        function to a pool thread; a task released while it waited to a thread that settles
        it (it never begins)."""
        while True:
            with self._lock:
                if self._closed or not self._waiting or self._busy >= self.config.concurrency:
                    return
                held = self._waiting.popleft()
                self._busy += 1
                begun = self._begin(held)
            task_type = self.app.types[held.snapshot.name]
            try:
                if begun and task_type.is_async:
                    self._launch_async(held, task_type)
                else:
                    self._submit(self._run_slot, held, begun)
            except RuntimeError:  # closed meanwhile (shutdown): the controller hands it back
                self._free_slot(held)

    def _begin(self, held: Held) -> bool:
        """Claim a task for its function (under ``_lock``); False when it was released before
        its turn."""
        if held.done or not self.accepting.is_set():
            return False  # released (or shutting down: the controller hands it back)
        held.began = True
        return True

    def _free_slot(self, held: Held) -> None:
        """The slot's thread (or coroutine) is done with ``held``. The task stops counting
        against the slots here unless its end still waits for the group committer: then
        ``settle`` releases it once written, so the store never shows more tasks ``RUNNING``
        here than there are slots."""
        with self._lock:
            self._busy -= 1
        self._dispatch()
        # Queued: the committer frees its slot and starts the next tasks. Buffered (its last
        # move could not be written): it keeps its slot until the supervisor writes it.
        if not held.queued and not held.pending:
            self._release(held)
            self.wake_starter.set()

    def release_written(self, held: Held) -> None:
        """A finished task whose buffered end the supervisor has now written (or dropped: a
        conflict) lets its slot go (``settle`` kept it)."""
        self._release(held)
        self.wake_starter.set()

    def _release(self, held: Held) -> None:
        with self._lock:
            if held.outstanding:
                held.outstanding = False
                self._outstanding -= 1

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._executor is not None
        future: Future[None] = self._executor.submit(fn, *args)
        future.add_done_callback(_log_crash)

    # -- running ---------------------------------------------------------------------------

    def _run_slot(self, held: Held, begun: bool) -> None:
        """One slot's turn in a pool thread: run the task unless it was released while it
        waited (shutdown, a stop or a pause of a prefetched task), then free the slot."""
        started = time.monotonic()
        try:
            if begun:
                self._execute(held, started)
                self._window.ran(time.monotonic() - started)
            elif self.claim_unbegun(held):
                # Started while shutdown began (after its hand-back of the waiting tasks): it
                # never runs here, so it goes back now, as the others did.
                self.writer.hand_back(held, self.shutdown_policy)
                if not held.pending:
                    self.held.forget(held)
        finally:
            self._free_slot(held)

    def _launch_async(self, held: Held, task_type: TaskType) -> None:
        """An ``async def`` task: its function runs on the loop, holding its slot but no
        thread; how it ended is recorded in a pool thread (``_finish_async``), never on the
        loop. That thread is free at once: work items never outnumber held slots."""
        assert self._loop is not None
        started = time.monotonic()
        self.log.started(held)
        future = self._loop.submit(held.ctx, task_type.fn,
                                   lambda: task_type.load(held.snapshot.params))  # fmt: skip

        def finished(done: Future[Any]) -> None:
            try:
                self._submit(self._finish_async, held, done, started)
            except RuntimeError:  # closed (shutdown): the controller handed the task back
                self._free_slot(held)

        future.add_done_callback(finished)

    def _finish_async(self, held: Held, done: Future[Any], started: float) -> None:
        try:
            if done.cancelled():  # cancelled by something else than a stop or a loss
                self._ended(held, asyncio.CancelledError("the task was cancelled"), started)
            elif (exc := done.exception()) is not None:
                self._ended(held, exc, started)
            else:
                self._returned(held, done.result(), started)
            self._window.ran(time.monotonic() - started)
        finally:
            self._free_slot(held)

    def claim_unbegun(self, held: Held) -> bool:
        """Take a started task whose function has not begun (a prefetched task) away from its
        slot: it will never begin here, and the caller settles it. False once it has begun."""
        with self._lock:
            if held.began or held.done:
                return False
            held.done = True
            return True

    def stop_unbegun(self, held: Held) -> bool:
        """A stop for a task that waits for a slot: it ends ``STOPPED`` now (its stop commands
        answered), not when a slot frees up. False when its function has begun."""
        if not self.claim_unbegun(held):
            return False
        self.finish(held, TaskStatus.STOPPED, reason="stopped before it began", write_now=True)
        return True

    def release_unbegun(self, held: Held) -> bool:
        """A task that waits for a slot and was paused: hand it back paused now (a new attempt
        that nobody holds; a resume makes it ``PENDING`` for any worker) instead of letting it
        take a slot to wait in. False when its function has begun."""
        if not self.claim_unbegun(held):
            return False
        self.writer.hand_back(held, "requeue", why="before it began")
        if not held.pending:
            self.held.forget(held)
        return True

    def _execute(self, held: Held, started: float) -> None:
        """The run-a-task path (a function, in this thread or a child process): call it, then
        record how it ended."""
        snapshot, ctx = held.snapshot, held.ctx
        task_type = self.app.types[snapshot.name]
        self.log.started(held)
        try:
            ctx.gate()  # stopped or paused while it waited for this slot (prefetched)
            params = task_type.load(snapshot.params)
            if task_type.isolation == "process":
                result = run_in_process(ctx, task_type.fn, params)
            else:
                result = task_type.fn(ctx, params)
        except Exception as exc:
            self._ended(held, exc, started)
            return
        self._returned(held, result, started)

    def _ended(self, held: Held, exc: BaseException, started: float) -> None:
        """Record a task whose function raised ``exc``: its own stop (``STOPPED``), its own
        loss (nothing written), or a failure (any other exception, ``FAILED``)."""
        ctx = held.ctx
        if isinstance(exc, TaskLost) and is_own(exc, ctx, ctx.lost_reason is not None):
            self._lost(held, ctx.lost_reason or str(exc), started)
        elif isinstance(exc, TaskStopped) and is_own(exc, ctx, ctx.stop_requested):
            self.log.ended(held, "stopped", started)
            self.finish(held, TaskStatus.STOPPED, reason="stop requested")
        elif isinstance(exc, ChildFailed):
            failure = Failure(exc.error_type, str(exc)[:4000], exc.child_traceback[-16000:] or None)
            policy = self.writer.policy_of(held.snapshot)
            retried = (policy.retries_names(exc.names) if exc.names
                       else policy.retries_error_type(exc.error_type))  # fmt: skip
            self._fail(held, failure, started, retried)
        else:
            retried = self.writer.policy_of(held.snapshot).retries(exc)
            self._fail(held, failure_of(exc), started, retried)

    def _returned(self, held: Held, result: Any, started: float) -> None:
        """Record a task whose function returned ``result`` (discarded if the task was lost)."""
        lost = held.ctx.lost_reason
        if lost is not None:
            self._lost(held, f"finished after losing it ({lost})", started)
            return
        try:
            if isinstance(result, BaseModel):
                result = result.model_dump(mode="json")
            encoded = encode_payload(result, "result")
        except (TypeError, ValueError) as exc:
            self._fail(held, Failure("ResultNotStorable", str(exc)), started)
            return
        limit = self.config.max_result_bytes
        if encoded is not None and len(encoded) > limit:
            message = f"result is {len(encoded)} bytes; at most {limit} are stored"
            self._fail(held, Failure("ResultTooLarge", message), started)
            return
        self.log.ended(held, "succeeded", started)
        # failure=None: a retried task that now succeeds no longer shows the earlier failure
        self.finish(held, TaskStatus.SUCCEEDED, result=result, failure=None)  # fmt: skip

    def _lost(self, held: Held, why: str, started: float) -> None:
        """A task this process lost: nothing more is written, its result is discarded."""
        self.log.ended(held, "lost", started, f"{why}; its result is discarded")
        self.writer.release_stops(held)  # its next holder answers them
        self.held.forget(held)

    def _fail(self, held: Held, failure: Failure, started: float, retried: bool = False) -> None:
        """``retried``: the task's policy retries this failure (attempts aside); its next
        attempt is then written with the failure, in one write."""
        self.log.ended(held, "failed", started, f"{failure.error_type}: {failure.message}")
        if failure.error_type == "TaskTimeout":
            self.writer.events.task_timed_out(held.snapshot.name)
        retry = f"failed ({failure.error_type})" if retried else None
        self.finish(held, TaskStatus.FAILED, failure=failure, retry_after=retry)

    def finish(self, held: Held, status: TaskStatus, *, reason: str | None = None,
               write_now: bool = False, retry_after: str | None = None,
               **changes: Any) -> None:  # fmt: skip
        """Record how a task ended; the group committer writes it (or now, ``write_now``). A
        stop command that waited for it is answered with how it ended: ``stopped``, or
        ``succeeded``/``failed`` for a task that finished without honouring the stop."""
        if not self.writer.end(held, status, reason, retry_after=retry_after, **changes):
            log.info("%s: %s was handed back before its end was recorded; %s is discarded",
                     self.writer.owner, held.task_id, status.value)  # fmt: skip
            self.writer.release_stops(held)
            return
        held.done = True
        held.final_outcome = status.value
        if self.group_commit and not write_now:  # many finished tasks per round trip
            held.queued = True
            self.commits.put(held)
            # Its thread frees when this returns; its slot once the commit is written
            # (settle), so a new start never overlaps this task's RUNNING in the store.
            return
        self.writer.flush(held)
        self.settle(held)

    def settle(self, held: Held, *, wake: bool = True) -> None:
        """After a finished task's last state was written (or buffered): answer the stop
        commands that waited for it, let it go, free its slot, look for more work (``wake``:
        the starter thread does; the committer starts the next tasks itself). An end the store
        did not take (it was away: buffered) keeps the slot until the supervisor writes it
        (``release_written``): a task started into it meanwhile would show one more ``RUNNING``
        here than there are slots, the old one's end not yet stored."""
        if not held.pending:
            self._release(held)
        now = self.writer.clock.now()
        for command_id in held.stop_commands:  # stop commands wait for the task to really end
            self.writer.complete(command_id, now, held.final_outcome)
        if not held.pending:
            self.held.forget(held)
        if wake:
            self.wake_starter.set()


def _log_crash(future: Future[None]) -> None:
    if future.cancelled():  # a task that was never begun, released at shutdown
        return
    if future.exception() is not None:
        log.error("task runner crashed: %r", future.exception())
