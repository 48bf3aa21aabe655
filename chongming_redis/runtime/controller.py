"""``Controller``: runs tasks on any ``TaskStore`` and writes every transition through.

A thin facade over the runtime's parts, each in its own module (``docs/runtime.md``):

* ``held`` — which tasks this process holds (``HeldTasks``, the one lock);
* ``writer`` — how every write reaches the store (``TaskWriter``, over the named extensions);
* ``runner`` — starting and running tasks, and the group committer;
* ``supervisor`` — leases, heartbeats, progress, buffered writes;
* ``commands`` — control commands; ``reconcile`` — expired leases and retries.

Threads of a running controller (all daemons, started by ``start()``): up to
``concurrency`` task threads (an ``async def`` task holds a slot but no thread: it runs on the
event loop thread started with the first one, ``runtime/task_loop.py``); ``supervisor`` (every
tick); ``commands`` (every ``command_poll_interval``, or at once when nudged); ``starter``
(every ``start_poll_interval``, or when nudged; unnudged, every ``loops.BUSY_POLL`` for a
while after it started a task); ``reconciler`` (every ``reconcile_interval``);
``committer`` where the store batches; and the bucket pool's heartbeat after ``join_pool``.

A controller that is never started is a pure client: it submits, queries and sends control
commands, and never polls commands (it would steal them from the real holders).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from chongming_redis.model import (
    CommandKind,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.policy import RetryPolicy, worker_default
from chongming_redis.runtime.app import App, InvalidParams, TaskFunction, UnknownTask
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.commands import CommandHandler
from chongming_redis.runtime.committer import commit_finished
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.events import NO_EVENTS, WorkerEvents
from chongming_redis.runtime.held import HeldTasks
from chongming_redis.runtime.loops import OUTAGE, BusyPoll, every, store_name
from chongming_redis.runtime.notify import POOL, WORK, LocalNotifier, RedisNotifier
from chongming_redis.runtime.reconcile import Reconciler, ReconcileReport
from chongming_redis.runtime.releases import release_pass, releaser
from chongming_redis.runtime.retention import expire_finished
from chongming_redis.runtime.runner import Runner
from chongming_redis.runtime.schedule_loop import schedule_firer
from chongming_redis.runtime.signals import ShutdownSignals
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.runtime.stranded import StrandedWarnings
from chongming_redis.runtime.submitting import Submitting
from chongming_redis.runtime.supervisor import supervise
from chongming_redis.runtime.task_schemas import publish_task_schemas
from chongming_redis.runtime.timeouts import end_overdue
from chongming_redis.runtime.writer import TaskWriter
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.validation import check_identifier

if TYPE_CHECKING:
    from chongming_redis.runtime.pool import BucketPool

__all__ = ["Controller", "ControllerConfig", "InvalidParams", "ReconcileReport", "UnknownTask"]

log = logging.getLogger("chongming_redis.runtime")


class Controller(Submitting):
    def __init__(
        self,
        store: TaskStore,
        *,
        app: App | None = None,
        owner: str | None = None,
        config: ControllerConfig | None = None,
        buckets: BucketPolicy | None = None,
        serve_buckets: Iterable[int] | None = None,
        retry: RetryPolicy | None = None,
        events: WorkerEvents | None = None,
        replace_limits: bool = False,
        **timings: Any,
    ) -> None:
        """``config`` holds the timings; a timing given as a keyword (``task_lease=5``)
        overrides it. ``events``: an observer of the running worker (``runtime/events.py``;
        ``chongming_redis.metrics.worker.WorkerMetrics`` for Prometheus). ``replace_limits``:
        ``start`` records the app's limit definitions over differing recorded ones instead of
        refusing to start (``--replace-limits``)."""
        if not isinstance(store, TaskStore):
            raise TypeError(f"store must implement TaskStore, not {type(store).__name__}")
        self.store = store
        self.owner = check_identifier(owner or f"worker-{secrets.token_hex(4)}", "owner")
        self.config = dataclasses.replace(config or ControllerConfig(), **timings)
        self.buckets = buckets or BucketPolicy()
        self.serve_buckets = None if serve_buckets is None else frozenset(serve_buckets)
        self.app = app or App()
        self.replace_limits = replace_limits
        self._limits_recorded = False
        #: The store's extensions, resolved once: the runtime never probes the store itself.
        self.adapter = StoreAdapter(store, owner=self.owner)
        OUTAGE.store = store_name(store)  # the process's outage lines name its store
        self.clock = ServerClock(self.adapter)
        self.held = HeldTasks()
        self.events = events or NO_EVENTS
        self.writer = TaskWriter(self.adapter, owner=self.owner, clock=self.clock, held=self.held,
                                 config=self.config, retry=retry or worker_default(),
                                 events=self.events)  # fmt: skip
        self._running = threading.Event()
        self._accepting = threading.Event()
        self._wake_commands = threading.Event()
        self._wake_starter = threading.Event()
        self._wake_reconciler = threading.Event()
        self.runner = Runner(self.writer, app=self.app, num_buckets=self.buckets.num_buckets,
                             serving=lambda: self.serve_buckets, accepting=self._accepting,
                             look_elsewhere=lambda: self.bucket_pool is not None,
                             wake_starter=self._wake_starter)  # fmt: skip
        self.commands = CommandHandler(self.writer, stop_unbegun=self.runner.stop_unbegun,
                                       release_unbegun=self.runner.release_unbegun)  # fmt: skip
        self.writer.types = self.app.types  # the live dict: types registered later count
        self.reconciler = Reconciler(self.writer)
        self.bucket_pool: BucketPool | None = None
        self._stranded = StrandedWarnings(self.store, self.owner, self.app.types)
        self._threads: list[threading.Thread] = []
        self._start_poll: BusyPoll | None = None  # start(): the starter's interval, unnudged
        nudge = self.adapter.nudge
        self.notifier: RedisNotifier | LocalNotifier = (
            LocalNotifier(store) if nudge is None else RedisNotifier(nudge.client, nudge.namespace)
        )

    # -- registration and submission -------------------------------------------------------

    def task(
        self, name: str | None = None, *, params: type[BaseModel] | None = None, **options: Any
    ) -> Callable[[Callable[..., Any]], TaskFunction[Any]]:
        """Register ``fn(ctx, params)`` on this controller's ``App`` (``options``: those of
        ``App.task``)."""
        return self.app.task(name, params=params, **options)

    # -- queries ---------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        return self.store.get(task_id)

    def list_tasks(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return self.store.query(query)

    def stats(self) -> dict[TaskStatus, int]:
        return self.store.counts()

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        return self.adapter.bucket_counts()

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
        return self.commands.control(task_id, kind, self.notifier.publish)

    # -- one pass of each loop (tests and tools drive them directly) ----------------------

    def start_available(self) -> int:
        """Start as many eligible ``PENDING`` tasks as there are free slots; returns how many."""
        return self.runner.start_available()

    def handle_commands(self) -> int:
        """Claim and handle one batch of commands; returns how many were claimed."""
        return self.commands.handle_commands()

    def reconcile(self) -> ReconcileReport:
        """Mark tasks whose supervisor lease expired ``LOST`` and queue retries, once."""
        return self.reconciler.reconcile()

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self, buckets: Iterable[int] | None) -> None:
        """Start ``PENDING`` tasks of these buckets only (``None``: every bucket). The bucket
        pool calls this as bucket leases move; running tasks are not affected."""
        self.serve_buckets = None if buckets is None else frozenset(buckets)
        self._wake_starter.set()

    def join_pool(self, worker_lease: float = 5.0) -> BucketPool:
        """Share the buckets with the other workers of the namespace (a ``BucketPoolStore``,
        such as ``RedisTaskStore``): this controller then starts only the tasks of the buckets
        it holds."""
        from chongming_redis.runtime.pool import BucketPool

        if self.adapter.pool is None:
            raise TypeError("a bucket pool needs a BucketPoolStore (pool_tick, pool_state)")
        self.bucket_pool = BucketPool(
            self.adapter.pool, owner=self.owner, num_buckets=self.buckets.num_buckets,
            clock=self.clock, on_change=self.serve, worker_lease=worker_lease,
            announce=lambda: self.notifier.publish(POOL), events=self.events,
        )  # fmt: skip
        self.serve(frozenset())  # nothing until the first tick says what is ours
        return self.bucket_pool

    def start(self) -> None:
        """Start running tasks: the bucket pool and the background threads (after
        ``record_limits``: a ``LimitConflict`` starts nothing)."""
        if self._running.is_set():
            return
        if not self._limits_recorded:
            self.record_limits()
        self.clock.sync()
        firer = schedule_firer(self.store, app=self.app, owner=self.owner, buckets=self.buckets,
                               now=self.clock.now, serving=lambda: self.serve_buckets,
                               events=self.events, wake=self._wake_starter.set,
                               read_limits=self.adapter.limit_definitions)  # fmt: skip
        self.adapter.record_task_types(list(self.app.types))
        publish_task_schemas(self.store, self.app, self.clock.now, self.owner)
        self.notifier.subscribe(self.owner, self._wake_commands)
        self.notifier.subscribe(WORK, self._wake_starter)
        self.notifier.subscribe(WORK, self._wake_commands)
        if self.bucket_pool is not None:
            self.notifier.subscribe(POOL, self.bucket_pool.wake)
            # Listening before joining: the owners answer our arrival within milliseconds,
            # and a missed answer would cost a whole pool tick.
            self.notifier.wait_listening(timeout=2.0)
            self.bucket_pool.start()
        self._running.set()
        self._accepting.set()
        self.runner.open(self.owner)
        c, running, events = self.config, self._running, self.events
        # Without nudges from other processes, a quicker look while work is arriving.
        nudged = self.adapter.nudge is not None
        self._start_poll = None if nudged else BusyPoll(c.start_poll_interval)
        start_interval = c.start_poll_interval if self._start_poll is None else (
            self._start_poll.interval
        )  # fmt: skip
        loops: list[tuple[str, Callable[[], None]]] = [
            ("supervisor", lambda: supervise(self.writer, running,
                                              lambda held: end_overdue(self.runner, held),
                                              self.runner.release_written)),
            ("commands", lambda: every(c.command_poll_interval, self.handle_commands,
                                       running=running, wake=self._wake_commands,
                                       what="claim commands", events=events,
                                       operation="commands")),
            ("starter", lambda: every(start_interval, self._start_if_accepting,
                                      running=running, wake=self._wake_starter,
                                      what="look for work", events=events, operation="start")),
            ("reconciler", lambda: every(c.reconcile_interval, self._reconcile_once,
                                         running=running, wake=self._wake_reconciler,
                                         what="reconcile", events=events,
                                         operation="reconcile")),
        ]  # fmt: skip
        if self.runner.group_commit:
            loops.append(("committer", lambda: commit_finished(self.runner, running)))
        if firer is not None:
            loops.append(("schedules", lambda: firer.run(c.schedule_poll_interval, running)))
        if (deps := releaser(self.store)) is not None:
            loops.append(("releases", lambda: every(
                c.release_poll_interval, lambda: release_pass(deps, wake=self._wake_starter.set),
                running=running, wake=threading.Event(), what="continue releases",
                events=events, operation="releases")))  # fmt: skip
        for name, loop in loops:
            thread = threading.Thread(target=loop, name=f"{self.owner}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def record_limits(self) -> None:
        """Record the app's limit definitions (``start`` does it first, the CLI before it says
        anything); raises as ``StoreAdapter.record_limits``, and then nothing has started."""
        self.adapter.record_limits(*self.app.limit_definitions(), replace=self.replace_limits)
        self._limits_recorded = True

    def _start_if_accepting(self) -> None:
        if self._accepting.is_set():
            started = self.runner.start_available()
            if self._start_poll is not None:
                self._start_poll.started(started)

    def _reconcile_once(self) -> None:
        self._stranded.tick(self.clock.now())
        expire_finished(self.adapter, self.clock.now())
        report = self.reconcile()
        if report.lost:
            log.warning("%s: marked LOST: %s (retried: %s)", self.owner, report.lost,
                        report.retried)  # fmt: skip
        if report.lost or report.retried:
            self._wake_starter.set()

    def shutdown(self, grace: float = 30.0, *, hand_back: str = "requeue") -> None:
        """Take no new work; let running tasks finish within ``grace`` seconds; then hand the
        rest back: ``"requeue"`` (a new attempt, ``PENDING``; a paused task stays ``PAUSED``)
        or ``"stop"`` (``STOPPED``)."""
        self.runner.shutdown_policy = hand_back
        self._accepting.clear()  # from now on no task begins (runner._begin)
        self.runner.wait_for_start()  # a start under way lands before the hand-backs below
        if self.bucket_pool is not None:
            self.bucket_pool.stop()
        for held in self.held.active():  # started, never begun (prefetched): back at once
            if self.runner.claim_unbegun(held):
                self.writer.hand_back(held, hand_back)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.held.active():
            time.sleep(0.05)
        for held in self.held.active():
            self.writer.hand_back(held, hand_back)
        self.writer.flush_all(deadline=time.monotonic() + 5)
        self._running.clear()
        self._wake_reconciler.set()
        self._wake_commands.set()
        self._wake_starter.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.runner.close()
        self.notifier.close()

    def run_forever(
        self, grace: float = 30.0, *, same_signal_within: float = 0.0, parent: int | None = None
    ) -> None:
        """``start()``, then block until SIGTERM/SIGINT: the first signal shuts down gracefully
        (``grace`` seconds), a second one hands the running tasks back at once.
        ``same_signal_within``: a repeat this soon is the same request — for a worker under a
        ``--processes`` parent, to which Ctrl-C and systemd's ``KillMode=control-group``
        deliver it both directly and through the parent (2 s there; a lone worker gets every
        signal once, so a quick second Ctrl-C counts). ``parent``: a forked child's control
        pipe (``runtime/signals.py``: the parent's requests, and its death)."""
        signals = ShutdownSignals(self.owner, grace, same_signal_within, parent)
        signals.install()
        self.start()
        signals.stop.wait()
        worker = threading.Thread(target=self.shutdown, args=(grace,), daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if signals.again:
                log.warning("%s: second signal, handing running tasks back now", self.owner)
                for held in self.held.active():
                    self.writer.hand_back(held, "requeue")
                self.writer.flush_all(deadline=time.monotonic() + 5)
                return
