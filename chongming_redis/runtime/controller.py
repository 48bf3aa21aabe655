"""``Controller``: runs tasks on any ``TaskStore`` and writes every transition through.

Threads of a running controller (all daemons, started by ``start()``):

* a pool of ``concurrency`` task threads;
* ``supervisor``: every ``tick`` seconds renews the leases of held tasks, writes coalesced
  progress and heartbeats, and flushes transitions buffered while the store was unreachable;
  a busy task cannot starve it (it never runs task code);
* ``commands``: claims control commands (every ``command_poll_interval``, or at once when
  nudged), applies the ones for tasks this process holds, releases the others;
* ``starter``: starts ``PENDING`` tasks of the buckets this process serves, by a compare-and-set
  ``PENDING -> RUNNING`` (the version is the fencing token: two starters never both win);
* ``reconciler``: marks ``RUNNING``/``PAUSED`` tasks whose lease expired ``LOST`` and queues a
  retry when the policy allows.

A controller that is never started is a pure client: it submits, queries and sends control
commands, and never polls commands (it would steal them from the real holders).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from chongming_redis.errors import ConcurrencyConflict, StoreError, StoreUnavailable
from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.runtime.app import App, InvalidParams, UnknownTask
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped
from chongming_redis.runtime.isolation import ChildFailed, run_in_process
from chongming_redis.runtime.notify import WORK, LocalNotifier, RedisNotifier
from chongming_redis.runtime.retry import RetryPolicy
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.stores.codec import encode_payload
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.validation import check_identifier

if TYPE_CHECKING:
    from chongming_redis.runtime.pool import BucketPool

__all__ = ["Controller", "InvalidParams", "ReconcileReport", "UnknownTask"]

log = logging.getLogger("chongming_redis.runtime")

LIVE = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED})
HELD = (TaskStatus.RUNNING, TaskStatus.PAUSED)


@dataclass
class _Held:
    """A task this process runs. ``snapshot`` is the holder's truth; ``stored_version`` is the
    version the store has confirmed; ``pending`` are transitions not yet written."""

    snapshot: TaskSnapshot
    stored_version: int
    ctx: TaskContext
    pending: list[Transition] = field(default_factory=list)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    lease_renewed_at: float = 0.0
    heartbeat_written: int = 0
    stop_commands: list[str] = field(default_factory=list)
    done: bool = False
    final_outcome: str = "already-terminal"
    queued: bool = False  # waiting for the group committer


@dataclass
class ReconcileReport:
    lost: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)


class Controller:
    def __init__(
        self,
        store: TaskStore,
        *,
        app: App | None = None,
        owner: str | None = None,
        command_poll_interval: float = 0.5,
        command_lease: float = 30.0,
        task_lease: float = 30.0,
        concurrency: int = 4,
        buckets: BucketPolicy | None = None,
        serve_buckets: Iterable[int] | None = None,
        retry: RetryPolicy | None = None,
        start_poll_interval: float = 1.0,
        reconcile_interval: float = 5.0,
        progress_interval: float = 0.5,
        stall_after: float = 300.0,
        max_result_bytes: int = 1024 * 1024,
    ) -> None:
        if not isinstance(store, TaskStore):
            raise TypeError(f"store must implement TaskStore, not {type(store).__name__}")
        self.store = store
        self.owner = check_identifier(owner or f"worker-{secrets.token_hex(4)}", "owner")
        self.command_poll_interval = command_poll_interval
        self.command_lease = command_lease
        self.task_lease = task_lease
        self.concurrency = concurrency
        self.buckets = buckets or BucketPolicy()
        self.serve_buckets = None if serve_buckets is None else frozenset(serve_buckets)
        self.retry = retry or RetryPolicy()
        self.start_poll_interval = start_poll_interval
        self.reconcile_interval = reconcile_interval
        self.progress_interval = progress_interval
        self.stall_after = stall_after
        self.max_result_bytes = max_result_bytes
        #: The store's extensions, resolved once: the runtime never probes the store itself.
        self.writer = StoreAdapter(store, owner=self.owner)
        self.clock = ServerClock(self.writer)
        self.app = app or App()
        self.pool: BucketPool | None = None
        self._held: dict[str, _Held] = {}
        self._lock = threading.RLock()
        self._running = threading.Event()
        self._group_commit = False
        self._commits: queue.Queue[_Held] = queue.Queue()
        self._stopping = threading.Event()
        self._accepting = threading.Event()
        self._wake_commands = threading.Event()
        self._wake_starter = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        nudge = self.writer.nudge
        self.notifier: RedisNotifier | LocalNotifier = (
            LocalNotifier(store) if nudge is None else RedisNotifier(nudge.client, nudge.namespace)
        )

    # -- registration and submission -------------------------------------------------------

    def task(
        self, name: str | None = None, *, params: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(ctx, params)`` on this controller's ``App`` (see ``App.task``)."""
        return self.app.task(name, params=params)

    def submit(
        self,
        name: str,
        params: Any = None,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        not_before: datetime | None = None,
    ) -> str:
        """Validate and create a ``PENDING`` task; returns its id. A bad submit creates
        nothing: ``UnknownTask`` / ``InvalidParams`` / ``TypeError`` / ``ValueError``."""
        snapshot, transition = self._new_task(name, params, key=key, tags=tags,
                                              task_id=task_id, pipeline_run_id=pipeline_run_id,
                                              not_before=not_before)  # fmt: skip
        # The task and its first history entry: in one step where the store batches.
        (error,) = self.writer.commit([(snapshot, None, [transition])], best_effort_history=True)
        if error is not None:
            raise error
        self.notifier.publish(WORK)
        return snapshot.task_id

    def submit_many(self, name: str, params_list: Iterable[Any]) -> list[str]:
        """Submit one task per parameter set; on Redis up to 100 per round trip. Every set is
        validated before anything is written."""
        prepared = [self._new_task(name, params) for params in params_list]
        items = [(snapshot, None, [transition]) for snapshot, transition in prepared]
        errors = self.writer.commit(items, best_effort_history=True)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error
        self.notifier.publish(WORK)
        return [snapshot.task_id for snapshot, _ in prepared]

    def _new_task(
        self,
        name: str,
        params: Any,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        not_before: datetime | None = None,
    ) -> tuple[TaskSnapshot, Transition]:
        stored_params = self.app.get(name).validate(params)
        task_id = task_id or secrets.token_hex(10)
        now = self.clock.now()
        snapshot = TaskSnapshot(
            task_id=task_id, name=name, status=TaskStatus.PENDING, status_version=1,
            created_at=now, updated_at=now, tags=frozenset(tags),
            bucket=self.buckets.bucket_for(key or task_id), key=key,
            pipeline_run_id=pipeline_run_id, params=stored_params, not_before=not_before,
        )  # fmt: skip
        encode_payload(stored_params, "params")  # refuse an oversized payload before writing
        reason = f"submitted by {self.owner}"
        return snapshot, Transition(task_id, 1, None, TaskStatus.PENDING, now, reason)

    # -- queries ---------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        return self.store.get(task_id)

    def list_tasks(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return self.store.query(query)

    def stats(self) -> dict[TaskStatus, int]:
        return self.store.counts()

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        return self.writer.bucket_counts()

    def history(self, task_id: str) -> list[Transition]:
        return self.store.history(task_id)

    # -- control ---------------------------------------------------------------------------

    def stop(self, task_id: str) -> str:
        return self._control(task_id, CommandKind.STOP)

    def pause(self, task_id: str) -> str:
        return self._control(task_id, CommandKind.PAUSE)

    def resume(self, task_id: str) -> str:
        return self._control(task_id, CommandKind.RESUME)

    def _control(self, task_id: str, kind: CommandKind) -> str:
        """Act locally on a task this process holds; otherwise queue a command for the holder
        and nudge it. Returns the outcome (local) or ``"sent:<command id>"``."""
        check_identifier(task_id, "task_id")
        with self._lock:
            held = self._held.get(task_id)
        if held is not None and not held.done:
            return self._apply(held, kind, command_id=None)
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise ValueError(f"no task {task_id!r}")
        if snapshot.status.is_terminal:
            return "already-terminal"
        command_id = f"cmd-{secrets.token_hex(8)}"
        command = Command(command_id, task_id, kind, self.clock.now(), issued_by=self.owner)
        self.store.submit_command(command)
        self.notifier.publish(holder(snapshot) or WORK)
        return f"sent:{command_id}"

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self, buckets: Iterable[int] | None) -> None:
        """Start ``PENDING`` tasks of these buckets only (``None``: every bucket). The pool
        calls this as bucket leases move; running tasks are not affected."""
        self.serve_buckets = None if buckets is None else frozenset(buckets)
        self._wake_starter.set()

    def join_pool(self, worker_lease: float = 5.0) -> BucketPool:
        """Share the buckets with the other workers of the namespace (a ``BucketPoolStore``,
        such as ``RedisTaskStore``): this controller then starts only the tasks of the buckets
        it holds."""
        from chongming_redis.runtime.pool import BucketPool

        if self.writer.pool is None:
            raise TypeError("a bucket pool needs a BucketPoolStore (pool_tick, pool_state)")
        self.pool = BucketPool(self, self.writer.pool, worker_lease=worker_lease)
        self.serve(frozenset())  # nothing until the first tick says what is ours
        return self.pool

    def start(self) -> None:
        """Start running tasks: the pool and the background threads."""
        if self._running.is_set():
            return
        self.clock.sync()
        if self.pool is not None:
            self.pool.start()
        self._running.set()
        self._accepting.set()
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"{self.owner}-task")
        self.notifier.subscribe(self.owner, self._wake_commands)
        self.notifier.subscribe(WORK, self._wake_starter)
        self.notifier.subscribe(WORK, self._wake_commands)
        self._group_commit = self.writer.batching
        loops: list[tuple[str, Callable[[], None]]] = [
            ("supervisor", self._supervise),
            ("commands", self._poll_commands),
            ("starter", self._start_pending),
            ("reconciler", self._reconcile_loop),
        ]
        if self._group_commit:
            loops.append(("committer", self._commit_finished))
        for name, loop in loops:
            thread = threading.Thread(target=loop, name=f"{self.owner}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self, grace: float = 30.0, *, hand_back: str = "requeue") -> None:
        """Take no new work; let running tasks finish within ``grace`` seconds; then hand the
        rest back: ``"requeue"`` (back to ``PENDING``) or ``"stop"`` (``STOPPED``)."""
        self._accepting.clear()
        if self.pool is not None:
            self.pool.stop()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self._active():
            time.sleep(0.05)
        for held in self._active():
            self._hand_back(held, hand_back)
        self._flush_all(deadline=time.monotonic() + 5)
        self._running.clear()
        self._stopping.set()
        self._wake_commands.set()
        self._wake_starter.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.notifier.close()

    def run_forever(self, grace: float = 30.0) -> None:
        """``start()``, then block until SIGTERM/SIGINT: the first signal shuts down gracefully
        (``grace`` seconds), a second one hands the running tasks back at once."""
        signals = {"count": 0}
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            signals["count"] += 1
            if signals["count"] == 1:
                log.warning("%s: signal %d, shutting down (grace %.0fs)", self.owner, signum, grace)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        self.start()
        stop.wait()
        worker = threading.Thread(target=self.shutdown, args=(grace,), daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if signals["count"] > 1:
                log.warning("%s: second signal, handing running tasks back now", self.owner)
                for held in self._active():
                    self._hand_back(held, "requeue")
                self._flush_all(deadline=time.monotonic() + 5)
                return

    # -- starting and running tasks --------------------------------------------------------

    def _start_pending(self) -> None:
        while self._running.is_set():
            self._wake_starter.wait(self.start_poll_interval)
            self._wake_starter.clear()
            if not self._accepting.is_set():
                continue
            try:
                self.start_available()
            except StoreError as exc:
                log.warning("%s: cannot look for work: %s", self.owner, exc)

    def start_available(self) -> int:
        """Start as many eligible ``PENDING`` tasks as there are free slots; returns how many."""
        free = self.concurrency - len(self._active())
        if free <= 0 or not self._accepting.is_set():
            return 0
        if not self.app.types or (self.serve_buckets is not None and not self.serve_buckets):
            return 0
        now = self.clock.now()
        renewed_at = time.monotonic()
        started = self.writer.start(
            now=now, lease_until=now + timedelta(seconds=self.task_lease),
            buckets=self.serve_buckets, num_buckets=self.buckets.num_buckets,
            limit=min(free, 100), names=frozenset(self.app.types),
        )  # fmt: skip
        for one in started:  # where the start could not write the lease or history: now
            held = self._hold(one.snapshot, renewed_at if one.leased else None, one.unwritten)
            if not one.leased:
                self._renew_lease(held)
            if held.pending:
                self._flush(held)
        return len(started)

    def _hold(
        self,
        running: TaskSnapshot,
        renewed_at: float | None,
        pending: list[Transition] | None = None,
    ) -> _Held:
        """Hold a task that was just stored ``RUNNING`` and hand it to the pool.
        ``renewed_at``: when its lease was written, if the start wrote it."""
        ctx = TaskContext(running.task_id, running.attempt, self.owner)
        held = _Held(running, running.status_version, ctx, pending=pending or [])
        if renewed_at is not None:
            held.lease_renewed_at = renewed_at
            ctx.extend_lease(renewed_at + self.task_lease * 0.8)
        with self._lock:
            self._held[running.task_id] = held
        assert self._pool is not None
        future: Future[None] = self._pool.submit(self._execute, held)
        future.add_done_callback(_log_crash)
        return held

    def _execute(self, held: _Held) -> None:
        """The run-a-task path: call the function, then record how it ended."""
        snapshot, ctx = held.snapshot, held.ctx
        task_type = self.app.types[snapshot.name]
        try:
            params = task_type.load(snapshot.params)
            if task_type.isolation == "process":
                result = run_in_process(ctx, task_type.fn, params)
            else:
                result = task_type.fn(ctx, params)
            if isinstance(result, BaseModel):
                result = result.model_dump(mode="json")
        except TaskLost as exc:
            log.error("%s: %s; its result is discarded", self.owner, exc)
            self._forget(held)
            return
        except TaskStopped:
            self._finish(held, TaskStatus.STOPPED, reason="stop requested", outcome="stopped")
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
                      self.owner, snapshot.task_id, ctx.lost_reason)  # fmt: skip
            self._forget(held)
            return
        try:
            encoded = encode_payload(result, "result")
        except (TypeError, ValueError) as exc:
            self._fail(held, Failure("ResultNotStorable", str(exc)))
            return
        if encoded is not None and len(encoded) > self.max_result_bytes:
            message = f"result is {len(encoded)} bytes; at most {self.max_result_bytes} are stored"
            self._fail(held, Failure("ResultTooLarge", message))
            return
        # failure=None: a retried task that now succeeds no longer shows the earlier failure
        self._finish(held, TaskStatus.SUCCEEDED, result=result, failure=None,
                     outcome="already-terminal")  # fmt: skip

    def _fail(self, held: _Held, failure: Failure) -> None:
        if self.retry.retry_failures and self.retry.allows(held.snapshot.attempt):
            # Written now, not by the group committer: the retry needs the stored version.
            self._finish(held, TaskStatus.FAILED, failure=failure, outcome="already-terminal",
                         now_please=True)  # fmt: skip
            snapshot = self._stored_or_none(held)
            if snapshot is not None:
                self._queue_retry(snapshot, "failed")
            return
        self._finish(held, TaskStatus.FAILED, failure=failure, outcome="already-terminal")

    def _finish(self, held: _Held, status: TaskStatus, *, reason: str | None = None,
                outcome: str, now_please: bool = False, **changes: Any) -> None:  # fmt: skip
        self._transition(held, status, reason, **changes)
        held.done = True
        held.final_outcome = "stopped" if status is TaskStatus.STOPPED else outcome
        if self._group_commit and not now_please:  # many finished tasks per round trip
            held.queued = True
            self._commits.put(held)
            return
        self._flush(held)
        self._settle(held)

    def _settle(self, held: _Held) -> None:
        """After a finished task's last state was written (or buffered): answer the stop
        commands that waited for it, let it go, look for more work."""
        now = self.clock.now()
        for command_id in held.stop_commands:  # stop commands wait for the task to really end
            self._complete(command_id, now, held.final_outcome)
        if not held.pending:
            self._forget(held)
        self._wake_starter.set()

    def _commit_finished(self) -> None:
        """Group commit: write every task that finished since the last round trip with one
        ``commit_tasks`` call (up to 100), then settle them."""
        while self._running.is_set() or not self._commits.empty():
            try:
                batch = [self._commits.get(timeout=0.2)]
            except queue.Empty:
                continue
            while len(batch) < 100:
                try:
                    batch.append(self._commits.get_nowait())
                except queue.Empty:
                    break
            self._flush_many(batch)
            for held in batch:
                held.queued = False  # if the write failed, the supervisor retries it
                self._settle(held)

    def _flush_many(self, batch: list[_Held]) -> None:
        for held in batch:  # only the committer ever holds more than one of these locks
            held.write_lock.acquire()
        try:
            # Judged under the locks: the supervisor may have flushed one meanwhile. A task
            # goes once per call (the store refuses it twice); a second holder of the same id
            # is left to the supervisor's next flush.
            dirty, ids = [], set()
            for h in batch:
                if h.stored_version != h.snapshot.status_version and h.snapshot.task_id not in ids:
                    ids.add(h.snapshot.task_id)
                    dirty.append(h)
            items = [(h.snapshot, h.stored_version, list(h.pending)) for h in dirty]
            try:
                results = self.writer.commit(items) if items else []
            except StoreError as exc:  # the supervisor flushes them one by one later
                for held in dirty:
                    self._log_buffered(held, exc)
                return
            for held, conflict in zip(dirty, results):
                if conflict is None or self._already_stored(held):
                    held.stored_version = held.snapshot.status_version
                    held.pending.clear()
                else:
                    log.error("%s: CONFLICT on %s, another writer exists: %s",
                              self.owner, held.snapshot.task_id, conflict)  # fmt: skip
                    held.ctx.lose(f"another writer moved it on ({conflict})")
                    held.pending.clear()
        finally:
            for held in batch:
                held.write_lock.release()

    def _log_buffered(self, held: _Held, exc: Exception) -> None:
        log.warning("%s: store unreachable, %d transition(s) of %s buffered: %s",
                    self.owner, len(held.pending), held.snapshot.task_id, exc)  # fmt: skip

    def _already_stored(self, held: _Held) -> bool:
        """Did an earlier attempt of ours land (its reply was lost)? Then the store holds
        exactly our snapshot."""
        current = self.store.get(held.snapshot.task_id)
        return current is not None and _without_lease(current) == _without_lease(held.snapshot)

    def _forget(self, held: _Held) -> None:
        held.done = True
        with self._lock:
            if self._held.get(held.snapshot.task_id) is held:
                del self._held[held.snapshot.task_id]

    def _active(self) -> list[_Held]:
        with self._lock:
            return [h for h in self._held.values() if not h.done]

    # -- write-through ---------------------------------------------------------------------

    def _transition(
        self, held: _Held, status: TaskStatus, reason: str | None, **changes: Any
    ) -> None:
        with held.write_lock:
            old = held.snapshot
            now = self.clock.now()
            if "progress" not in changes and held.ctx.progress is not None:
                changes["progress"] = held.ctx.progress  # not the stale one of the last save
            new = _advance(old, status, now, **changes)
            held.snapshot = new
            held.pending.append(
                Transition(old.task_id, new.status_version, old.status, status, now, reason)
            )

    def _flush(self, held: _Held) -> bool:
        """Write the latest snapshot (one save, whatever the number of buffered transitions:
        the version jumps) and then the buffered history. False while the store is away."""
        with held.write_lock:
            if not held.pending and held.stored_version == held.snapshot.status_version:
                return True
            try:
                stale = held.stored_version != held.snapshot.status_version
                if stale and self.writer.batching:
                    self._commit_resolving(held)  # save + history: one atomic step
                else:  # save, then history: a blip between them keeps the entries buffered
                    if stale:
                        self._save_resolving(held)
                    self.writer.append_all(held.pending)
                held.pending.clear()
                return True
            except StoreUnavailable as exc:
                self._log_buffered(held, exc)
                return False
            except ConcurrencyConflict as exc:
                # Never retried: a second writer exists. Stop acting on the task, loudly.
                log.error("%s: CONFLICT on %s, another writer exists; stopping it here: %s",
                          self.owner, held.snapshot.task_id, exc)  # fmt: skip
                held.ctx.lose(f"another writer moved it on ({exc})")
                held.pending.clear()
                self._forget(held)
                return False

    def _commit_resolving(self, held: _Held) -> None:
        """``commit_tasks`` of one task (save and history together), telling a lost reply
        from a real conflict as ``_save_resolving`` does."""
        (conflict,) = self.writer.commit([(held.snapshot, held.stored_version, list(held.pending))])
        if conflict is not None and not self._already_stored(held):
            raise conflict
        held.stored_version = held.snapshot.status_version

    def _save_resolving(self, held: _Held) -> None:
        """``save`` that tells a lost reply from a real conflict: if the store already holds
        exactly our snapshot (our earlier attempt landed), that is success."""
        try:
            self.store.save(held.snapshot, expect_version=held.stored_version)
        except ConcurrencyConflict:
            if not self._already_stored(held):
                raise
        held.stored_version = held.snapshot.status_version

    def _flush_all(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self._lock:
                dirty = [h for h in self._held.values() if h.pending]
            if not dirty:
                return
            for held in dirty:
                if self._flush(held) and held.done:
                    self._forget(held)
            time.sleep(0.1)

    # -- supervision: leases, progress, buffered writes ------------------------------------

    def _supervise(self) -> None:
        tick = min(self.progress_interval, self.task_lease / 4)
        while self._running.is_set():
            time.sleep(tick)
            for held in list(self._held.values()):
                try:
                    self._supervise_one(held)
                except Exception as exc:  # keep supervising the others
                    log.warning("%s: supervising %s: %s", self.owner, held.snapshot.task_id, exc)

    def _supervise_one(self, held: _Held) -> None:
        if held.queued:
            return  # the committer writes it
        if held.pending and self._flush(held) and held.done:
            self._forget(held)
            return
        if held.done:
            return
        if time.monotonic() - held.lease_renewed_at >= self.task_lease / 3:
            self._renew_lease(held)
        elif held.ctx.progress_dirty or held.ctx.beats != held.heartbeat_written:
            self._touch(held, lease=False)

    def _renew_lease(self, held: _Held) -> None:
        started = time.monotonic()
        if self._touch(held, lease=True):
            held.lease_renewed_at = started
            # Our own deadline ends before the store's: a margin for the round trip and skew.
            held.ctx.extend_lease(started + self.task_lease * 0.8)

    def _touch(self, held: _Held, *, lease: bool) -> bool:
        ctx = held.ctx
        now = self.clock.now()
        args: dict[str, Any] = {}
        beats, progress = ctx.take_progress()
        if beats != held.heartbeat_written:  # the task's own signal: never the lease's
            args["heartbeat_at"] = now
        if progress is not None:
            args["progress"] = progress
        if lease:
            args["lease_owner"] = self.owner
            args["lease_until"] = now + timedelta(seconds=self.task_lease)
        with held.write_lock:
            try:
                applied = self.writer.touch_fenced(
                    held.snapshot.task_id, expect_version=held.stored_version, **args
                )
            except StoreUnavailable:
                ctx.progress_dirty = progress is not None or ctx.progress_dirty
                return False
            if applied:  # later saves write the whole row: carry what touch wrote
                touched = {k: v for k, v in args.items() if k in ("heartbeat_at", "progress")}
                if touched:
                    held.snapshot = dataclasses.replace(held.snapshot, **touched)
        if not applied:
            held.ctx.lose("another writer moved it on (its version changed)")
            log.error("%s: lost task %s: its version moved on without us",
                      self.owner, held.snapshot.task_id)  # fmt: skip
            self._forget(held)
            return False
        held.heartbeat_written = beats
        return True

    # -- commands --------------------------------------------------------------------------

    def _poll_commands(self) -> None:
        while self._running.is_set():
            self._wake_commands.wait(self.command_poll_interval)
            self._wake_commands.clear()
            try:
                self.handle_commands()
            except StoreError as exc:
                log.warning("%s: cannot claim commands: %s", self.owner, exc)

    def handle_commands(self) -> int:
        """Claim and handle one batch of commands; returns how many were claimed."""
        now = self.clock.now()
        claimed = self.store.claim_commands(now=now, lease_seconds=self.command_lease, limit=50)
        for command in claimed:
            self._handle(command)
        return len(claimed)

    def _handle(self, command: Command) -> None:
        with self._lock:
            held = self._held.get(command.task_id)
        if held is not None and not held.done:
            outcome = self._apply(held, command.kind, command.command_id)
            if outcome != "stopping":
                self._complete(command.command_id, self.clock.now(), outcome)
            return
        snapshot = self.store.get(command.task_id)
        now = self.clock.now()
        if snapshot is None:
            self._complete(command.command_id, now, "no-such-task")
        elif snapshot.status.is_terminal:
            self._complete(command.command_id, now, "already-terminal")
        elif holder(snapshot) is None:
            self._complete(command.command_id, now, self._control_unheld(snapshot, command))
        else:  # held by another process: hand it back at once so the holder can claim it
            self.store.release_command(command.command_id, now=now)

    def _control_unheld(self, snapshot: TaskSnapshot, command: Command) -> str:
        """Stop, pause or resume a task nobody runs (``PENDING``, or paused before it started)."""
        target = {
            CommandKind.STOP: TaskStatus.STOPPED,
            CommandKind.PAUSE: TaskStatus.PAUSED,
            CommandKind.RESUME: TaskStatus.PENDING,
        }[command.kind]
        if target is snapshot.status or (
            command.kind is CommandKind.PAUSE and snapshot.status is not TaskStatus.PENDING
        ):
            return "no-change"
        now = self.clock.now()
        reason = f"{command.kind.value} by {command.issued_by or '?'}"
        if not self._move(snapshot, _advance(snapshot, target, now), reason):
            return "conflict-retry"
        return target.value

    def _apply(self, held: _Held, kind: CommandKind, command_id: str | None) -> str:
        ctx, status = held.ctx, held.snapshot.status
        if kind is CommandKind.STOP:
            if command_id is not None:
                held.stop_commands.append(command_id)
            ctx.request_stop()
            ctx.set_paused(False)
            return "stopping"
        if kind is CommandKind.PAUSE:
            if status is TaskStatus.PAUSED:
                return "already-paused"
            self._transition(held, TaskStatus.PAUSED, "pause requested")
            ctx.set_paused(True)
            self._flush(held)
            return "paused"
        if status is not TaskStatus.PAUSED:
            return "not-paused"
        self._transition(held, TaskStatus.RUNNING, "resume requested")
        ctx.set_paused(False)
        self._flush(held)
        return "resumed"

    def _complete(self, command_id: str, now: datetime, outcome: str) -> None:
        try:
            self.store.complete_command(command_id, now=now, outcome=outcome)
        except StoreError as exc:  # its lease expires and it is handled again
            log.warning("%s: command %s not completed: %s", self.owner, command_id, exc)

    # -- reconciliation --------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while self._running.is_set():
            self._stopping.wait(self.reconcile_interval)
            if not self._running.is_set():
                return
            try:
                report = self.reconcile()
            except StoreError as exc:
                log.warning("%s: reconcile failed: %s", self.owner, exc)
                continue
            if report.lost:
                log.warning(
                    "%s: marked LOST: %s (retried: %s)", self.owner, report.lost, report.retried
                )
            if report.lost or report.retried:
                self._wake_starter.set()

    def reconcile(self) -> ReconcileReport:
        """Mark ``RUNNING``/``PAUSED`` tasks whose supervisor lease expired ``LOST`` (a
        compare-and-set), queue a retry where the policy allows, and report tasks whose
        heartbeat stalled (a stalled heartbeat alone never makes a task ``LOST``)."""
        report = ReconcileReport()
        now = self.clock.now()
        for snapshot in self.store.query(TaskQuery(statuses=frozenset(HELD))):
            with self._lock:
                ours = snapshot.task_id in self._held  # we renew its lease
            if snapshot.status is TaskStatus.PAUSED and holder(snapshot) is None:
                continue  # paused while nobody ran it: no lease can expire
            if ours or not _lease_expired(snapshot, now, self.task_lease):
                if snapshot.status is TaskStatus.RUNNING and _heartbeat_stalled(
                    snapshot, now, self.stall_after
                ):
                    report.stalled.append(snapshot.task_id)
                continue
            lost = _advance(snapshot, TaskStatus.LOST, now)
            reason = (
                f"lease of {snapshot.lease_owner or 'nobody'} expired at {snapshot.lease_until}"
            )
            if not self._move(snapshot, lost, reason):
                continue  # the holder (or another reconciler) moved it on first
            report.lost.append(snapshot.task_id)
            if self._queue_retry(lost, "lost"):
                report.retried.append(snapshot.task_id)
        return report

    def _queue_retry(self, snapshot: TaskSnapshot, why: str) -> bool:
        if not self.retry.allows(snapshot.attempt):
            return False
        now = self.clock.now()
        delay = self.retry.delay(snapshot.attempt)
        retried = _advance(snapshot, TaskStatus.PENDING, now, attempt=snapshot.attempt + 1,
                           not_before=now + delay, progress=None)  # fmt: skip
        attempt = f"{snapshot.attempt + 1}/{self.retry.max_attempts}"
        reason = f"retry {attempt} after {why}, in {delay.total_seconds():.1f}s"
        return self._move(snapshot, retried, reason)

    def _move(self, snapshot: TaskSnapshot, new: TaskSnapshot, reason: str) -> bool:
        """Compare-and-set a task nobody here holds, with its history entry: in one round trip
        (so the history has no gap) where the store batches. False on conflict."""
        transition = Transition(snapshot.task_id, new.status_version, snapshot.status,
                                new.status, new.updated_at, reason)  # fmt: skip
        item = (new, snapshot.status_version, [transition])
        (conflict,) = self.writer.commit([item], best_effort_history=True)
        return conflict is None

    def _stored_or_none(self, held: _Held) -> TaskSnapshot | None:
        return held.snapshot if held.stored_version == held.snapshot.status_version else None

    def _hand_back(self, held: _Held, policy: str) -> None:
        """Give a task this process will not finish back: requeue it (a new attempt) or stop
        it. Its thread may still run; the version bump fences every write it tries."""
        if policy == "stop":
            self._transition(held, TaskStatus.STOPPED, "stopped at shutdown")
        else:
            self._transition(held, TaskStatus.PENDING, "handed back at shutdown",
                             attempt=held.snapshot.attempt + 1)  # fmt: skip
        held.done = True
        held.ctx.lose("handed back at shutdown")  # the task thread stops at its next checkpoint
        self._flush(held)


# -- helpers ---------------------------------------------------------------------------------


def _advance(
    snapshot: TaskSnapshot, status: TaskStatus, now: datetime, **changes: Any
) -> TaskSnapshot:
    """The next state: one version up (the store checks only that we held the previous one)."""
    return dataclasses.replace(snapshot, status=status, status_version=snapshot.status_version + 1,
                               updated_at=now, **changes)  # fmt: skip


def _log_crash(future: Future[None]) -> None:
    if future.exception() is not None:
        log.error("task runner crashed: %r", future.exception())


def _without_lease(snapshot: TaskSnapshot) -> TaskSnapshot:
    return dataclasses.replace(snapshot, lease_owner=None, lease_until=None, heartbeat_at=None,
                               progress=None)  # fmt: skip


def holder(snapshot: TaskSnapshot) -> str | None:
    """Who supervises the task, judged from the store alone: the lease owner, if the lease was
    written after the task's last change. A task paused or requeued while nobody ran it keeps
    the lease fields of an earlier attempt (``save`` never writes them), but that lease is
    older than the change, so nobody holds it. ``PENDING`` tasks have no holder."""
    if snapshot.status not in HELD or snapshot.lease_owner is None:
        return None
    if snapshot.lease_until is None or snapshot.lease_until <= snapshot.updated_at:
        return None
    return snapshot.lease_owner


def _lease_expired(snapshot: TaskSnapshot, now: datetime, lease: float) -> bool:
    if snapshot.lease_until is not None:
        return snapshot.lease_until <= now
    # Started but never leased (the holder died between its start and its first renewal):
    # give it one lease period from its last state change.
    return snapshot.updated_at + timedelta(seconds=lease) <= now


def _heartbeat_stalled(snapshot: TaskSnapshot, now: datetime, stall_after: float) -> bool:
    beat = snapshot.heartbeat_at or snapshot.updated_at
    return beat + timedelta(seconds=stall_after) <= now
