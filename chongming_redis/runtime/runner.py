"""``Runner``: starting tasks and running them.

Starts ``PENDING`` tasks of the served buckets into free slots (one batched start where the
store has it), runs each in a thread of the executor (or in a child process), records how it
ended, and hands finished tasks to the group committer — one ``commit_tasks`` for every task
that finished since the last round trip — or writes them at once where the store cannot batch.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from chongming_redis.model import Failure, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped
from chongming_redis.runtime.held import Held, HeldTasks
from chongming_redis.runtime.isolation import ChildFailed, run_in_process
from chongming_redis.runtime.writer import TaskWriter
from chongming_redis.stores.codec import encode_payload

log = logging.getLogger("chongming_redis.runtime")


class Runner:
    def __init__(
        self,
        writer: TaskWriter,
        *,
        app: App,
        num_buckets: int,
        serving: Callable[[], frozenset[int] | None],
        accepting: threading.Event,
        wake_starter: threading.Event,
    ) -> None:
        self.writer = writer
        self.held: HeldTasks = writer.held
        self.config = writer.config
        self.app = app
        self.num_buckets = num_buckets
        self.serving = serving
        self.accepting = accepting
        self.wake_starter = wake_starter
        self.group_commit = False
        self.commits: queue.SimpleQueue[Held] = queue.SimpleQueue()
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._outstanding = 0  # started here, task function not yet returned
        #: How a started task that will not begin is handed back once shutdown has begun.
        self.shutdown_policy = "requeue"
        self._window = Window(self.config.concurrency, self.config.prefetch)

    def open(self, owner: str) -> None:
        self.group_commit = self.writer.adapter.batching
        self._executor = ThreadPoolExecutor(self.config.concurrency,
                                            thread_name_prefix=f"{owner}-task")  # fmt: skip

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -- starting --------------------------------------------------------------------------

    def start_available(self) -> int:
        """Start as many eligible ``PENDING`` tasks as the window has room for (the free slots,
        plus the prefetch the measured task and round-trip times call for); returns how many."""
        free = self._window.size() - self._outstanding
        if free <= 0 or not self.accepting.is_set():
            return 0
        buckets = self.serving()
        if not self.app.types or (buckets is not None and not buckets):
            return 0
        now = self.writer.clock.now()
        renewed_at = time.monotonic()
        started = self.writer.adapter.start(
            now=now, lease_until=now + timedelta(seconds=self.config.task_lease),
            buckets=buckets, num_buckets=self.num_buckets,
            limit=min(free, 100), names=frozenset(self.app.types),
        )  # fmt: skip
        if started:
            self._window.round_trip(time.monotonic() - renewed_at)
        for one in started:  # where the start could not write the lease or history: now
            held = self._hold(one.snapshot, renewed_at if one.leased else None, one.unwritten)
            if not one.leased:
                self.writer.renew_lease(held)
            if held.pending:
                self.writer.flush(held)
        return len(started)

    def _hold(
        self, running: TaskSnapshot, renewed_at: float | None, pending: list[Transition]
    ) -> Held:
        """Hold a task that was just stored ``RUNNING`` and hand it to the executor.
        ``renewed_at``: when its lease was written, if the start wrote it."""
        ctx = TaskContext(running.task_id, running.attempt, self.writer.owner)
        held = Held(running, running.status_version, ctx, pending=list(pending))
        if renewed_at is not None:
            held.lease_renewed_at = renewed_at
            ctx.extend_lease(renewed_at + self.config.task_lease * 0.8)
        self.held.add(held)
        assert self._executor is not None
        with self._lock:
            self._outstanding += 1
        future: Future[None] = self._executor.submit(self._run_slot, held)
        future.add_done_callback(_log_crash)
        return held

    # -- running ---------------------------------------------------------------------------

    def _run_slot(self, held: Held) -> None:
        """One slot's turn: run the task unless it was released while it waited (shutdown, a
        stop or a pause of a prefetched task), then free the slot and wake the starter."""
        started = time.monotonic()
        try:
            if self._begin(held):
                self._execute(held)
                self._window.ran(time.monotonic() - started)
            elif self.claim_unbegun(held):
                # Started while shutdown began (after its hand-back of the waiting tasks): it
                # never runs here, so it goes back now, as the others did.
                self.writer.hand_back(held, self.shutdown_policy)
                if not held.pending:
                    self.held.forget(held)
        finally:
            with self._lock:
                self._outstanding -= 1
            self.wake_starter.set()

    def _begin(self, held: Held) -> bool:
        """Claim a task for its function; False when it was released before its turn."""
        with self._lock:
            if held.done or not self.accepting.is_set():
                return False  # released (or shutting down: the controller hands it back)
            held.began = True
            return True

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
        self.finish(held, TaskStatus.STOPPED, reason="stopped before it began",
                    outcome="stopped", write_now=True)  # fmt: skip
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

    def _execute(self, held: Held) -> None:
        """The run-a-task path: call the function, then record how it ended."""
        snapshot, ctx = held.snapshot, held.ctx
        task_type = self.app.types[snapshot.name]
        try:
            ctx.gate()  # stopped or paused while it waited for this slot (prefetched)
            params = task_type.load(snapshot.params)
            if task_type.isolation == "process":
                result = run_in_process(ctx, task_type.fn, params)
            else:
                result = task_type.fn(ctx, params)
            if isinstance(result, BaseModel):
                result = result.model_dump(mode="json")
        except TaskLost as exc:
            log.error("%s: %s; its result is discarded", self.writer.owner, exc)
            self.held.forget(held)
            return
        except TaskStopped:
            self.finish(held, TaskStatus.STOPPED, reason="stop requested", outcome="stopped")
            return
        except ChildFailed as exc:
            failure = Failure(exc.error_type, str(exc)[:4000], exc.child_traceback[-16000:] or None)
            self._fail(held, failure)
            return
        except Exception as exc:
            failure = Failure(type(exc).__name__, str(exc)[:4000], traceback.format_exc()[-16000:])
            self._fail(held, failure)
            return
        if ctx.lost_reason is not None:
            log.error("%s: task %s finished after losing it (%s); result discarded",
                      self.writer.owner, snapshot.task_id, ctx.lost_reason)  # fmt: skip
            self.held.forget(held)
            return
        self._succeed(held, result)

    def _succeed(self, held: Held, result: Any) -> None:
        try:
            encoded = encode_payload(result, "result")
        except (TypeError, ValueError) as exc:
            self._fail(held, Failure("ResultNotStorable", str(exc)))
            return
        limit = self.config.max_result_bytes
        if encoded is not None and len(encoded) > limit:
            message = f"result is {len(encoded)} bytes; at most {limit} are stored"
            self._fail(held, Failure("ResultTooLarge", message))
            return
        # failure=None: a retried task that now succeeds no longer shows the earlier failure
        self.finish(held, TaskStatus.SUCCEEDED, result=result, failure=None,
                    outcome="already-terminal")  # fmt: skip

    def _fail(self, held: Held, failure: Failure) -> None:
        retry = self.writer.retry
        if retry.retry_failures and retry.allows(held.snapshot.attempt):
            # Written now, not by the group committer: the retry needs the stored version.
            self.finish(held, TaskStatus.FAILED, failure=failure, outcome="already-terminal",
                        write_now=True)  # fmt: skip
            snapshot = held.stored()
            if snapshot is not None:
                self.writer.queue_retry(snapshot, "failed")
            return
        self.finish(held, TaskStatus.FAILED, failure=failure, outcome="already-terminal")

    def finish(self, held: Held, status: TaskStatus, *, reason: str | None = None,
               outcome: str, write_now: bool = False, **changes: Any) -> None:  # fmt: skip
        """Record how a task ended; the group committer writes it (or now, ``write_now``)."""
        self.writer.transition(held, status, reason, **changes)
        held.done = True
        held.final_outcome = "stopped" if status is TaskStatus.STOPPED else outcome
        if self.group_commit and not write_now:  # many finished tasks per round trip
            held.queued = True
            self.commits.put(held)
            # Its slot frees when this returns (_run_slot wakes the starter then): the next
            # task starts while this one's commit is on its way, not a round trip later.
            return
        self.writer.flush(held)
        self.settle(held)

    def settle(self, held: Held) -> None:
        """After a finished task's last state was written (or buffered): answer the stop
        commands that waited for it, let it go, look for more work."""
        now = self.writer.clock.now()
        for command_id in held.stop_commands:  # stop commands wait for the task to really end
            self.writer.complete(command_id, now, held.final_outcome)
        if not held.pending:
            self.held.forget(held)
        self.wake_starter.set()

    # -- group commit ----------------------------------------------------------------------

    def commit_finished(self, running: threading.Event) -> None:
        """The committer thread: write every task that finished since the last round trip
        with one ``commit_tasks`` call (up to 100), then settle them."""
        while running.is_set() or not self.commits.empty():
            try:
                batch = [self.commits.get(timeout=0.2)]
            except queue.Empty:
                continue
            while len(batch) < 100:
                try:
                    batch.append(self.commits.get_nowait())
                except queue.Empty:
                    break
            self.writer.flush_many(batch)
            for held in batch:
                held.queued = False  # if the write failed, the supervisor retries it
                self.settle(held)


def _log_crash(future: Future[None]) -> None:
    if future.cancelled():  # a task that was never begun, released at shutdown
        return
    if future.exception() is not None:
        log.error("task runner crashed: %r", future.exception())


class Window:
    """How many started tasks a process may have outstanding: ``concurrency`` running, plus a
    prefetch sized like a bandwidth-delay product — the tasks the slots finish during one
    start round trip, ``concurrency * round_trip / run_time`` rounded down (at most
    ``prefetch``). A worker of short tasks starts its next batch while the current one runs (a
    no-op drain would otherwise wait one round trip per ``concurrency`` tasks); a worker of
    tasks longer than ``concurrency`` round trips prefetches nothing, so no task waits behind a
    long one while another worker could run it. The round trip is a moving average; the run
    time rises at once with a longer task and falls slowly, so a switch to long tasks closes
    the window at the first one. Before both are measured there is no prefetch."""

    def __init__(self, concurrency: int, prefetch: int, weight: float = 0.2) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.weight = weight
        self.run_time: float | None = None
        self.round_trip_time: float | None = None

    def ran(self, seconds: float) -> None:
        # Up at once, down slowly: one long task closes the window before the next batch.
        if self.run_time is None or seconds > self.run_time:
            self.run_time = seconds
        else:
            self.run_time = self._average(self.run_time, seconds)

    def round_trip(self, seconds: float) -> None:
        self.round_trip_time = self._average(self.round_trip_time, seconds)

    def size(self) -> int:
        if not self.prefetch or self.run_time is None or self.round_trip_time is None:
            return self.concurrency
        wanted = self.concurrency * self.round_trip_time / max(self.run_time, 1e-6)
        return self.concurrency + min(self.prefetch, math.floor(wanted))

    def _average(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.weight * (sample - old)
