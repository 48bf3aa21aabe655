"""The worker's observer (``runtime/events.py``) and its Prometheus series
(``metrics/worker.py``), in one process on ``InMemoryTaskStore``: every task run is reported
once when it starts and once when it ends, with how it ended (succeeded, failed, stopped,
lost); lease renewals, store errors, the reconnect and the bucket count reach the observer;
``WorkerMetrics`` turns them into the documented series in a registry of its own.

Nothing here asserts how fast anything happened: every wait polls with a generous timeout.
The same series through real worker processes: ``test_worker_metrics_cli.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chongming_redis import InMemoryTaskStore, TaskStatus
from chongming_redis.errors import StoreUnavailable
from chongming_redis.metrics.worker import DURATION_BUCKETS, WorkerMetrics
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.events import ENDINGS, NO_EVENTS, OPERATIONS, WorkerEvents
from chongming_redis.runtime.loops import OutageLog, every
from chongming_redis.runtime.pool import BucketPool
from tests.support.flaky_store import ALL, RecordingStore

FAST: dict[str, Any] = {
    "command_poll_interval": 0.05,
    "task_lease": 1.5,
    "start_poll_interval": 0.05,
    "reconcile_interval": 0.1,
    "progress_interval": 0.05,
    "concurrency": 4,
}
WAIT = 15.0

app = App("metrics-unit")


@app.task()
def ok(ctx: TaskContext, params: Any) -> str:
    return "ok"


@app.task()
def boom(ctx: TaskContext, params: Any) -> None:
    raise ValueError("boom on purpose")


@app.task()
def hold(ctx: TaskContext, params: Any) -> None:
    """Runs until it is stopped or lost (its checkpoint raises)."""
    while True:
        ctx.checkpoint()
        time.sleep(0.01)


class Recorder(WorkerEvents):
    """Every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def _add(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        with self._lock:
            return [c[1:] for c in self.calls if c[0] == kind]

    def task_started(self, name: str) -> None:
        self._add("started", name)

    def task_ended(self, name: str, ending: Any, seconds: float) -> None:
        assert seconds >= 0
        self._add("ended", name, ending)

    def leases_renewed(self, count: int) -> None:
        self._add("renewed", count)

    def store_error(self, operation: str) -> None:
        assert operation in OPERATIONS
        self._add("store_error", operation)

    def reconnected(self) -> None:
        self._add("reconnected")

    def buckets_owned(self, count: int) -> None:
        self._add("buckets", count)


def wait_until(predicate: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def controllers() -> Iterator[list[Controller]]:
    made: list[Controller] = []
    yield made
    for controller in made:
        if controller._running.is_set():
            controller.shutdown(grace=0, hand_back="stop")


def run_every_ending(
    controller: Controller, ended: Callable[[], int], renewed: Callable[[], bool]
) -> None:
    """On a started ``controller``: 3 ``ok`` (succeeded), 2 ``boom`` (failed), 2 ``hold``, one
    of them stopped and the other handed back at shutdown while it runs (lost). The ``hold``
    tasks run until the supervisor has renewed a lease (``renewed()``); returns once the 7
    runs ended (``ended()``: how many ended so far)."""
    store = controller.store
    oks = controller.submit_many("ok", [None] * 3)
    booms = controller.submit_many("boom", [None] * 2)
    holds = controller.submit_many("hold", [None] * 2)
    done = (TaskStatus.SUCCEEDED, TaskStatus.FAILED)
    wait_until(lambda: all(store.get(t).status in done for t in oks + booms), "ok and boom")
    wait_until(renewed, "a lease renewal")
    controller.stop(holds[0])
    wait_until(lambda: store.get(holds[0]).status is TaskStatus.STOPPED, "the stop")
    controller.shutdown(grace=0.1)  # hands the other one back: its function ends as lost
    wait_until(lambda: ended() == 7, "seven ends")


def test_each_task_run_is_reported_once_when_it_starts_and_once_when_it_ends(
    controllers: list[Controller],
) -> None:
    events = Recorder()
    controller = Controller(InMemoryTaskStore(), app=app, events=events, **FAST)
    controllers.append(controller)
    controller.start()
    run_every_ending(controller, lambda: len(events.of("ended")), lambda: events.of("renewed"))
    assert Counter(events.of("started")) == {("ok",): 3, ("boom",): 2, ("hold",): 2}
    assert Counter(events.of("ended")) == {
        ("ok", "succeeded"): 3,
        ("boom", "failed"): 2,
        ("hold", "stopped"): 1,
        ("hold", "lost"): 1,
    }
    assert events.of("renewed") and all(count >= 1 for (count,) in events.of("renewed"))
    assert events.of("store_error") == []


def test_a_controller_without_an_observer_uses_the_no_op_one() -> None:
    controller = Controller(InMemoryTaskStore(), app=app)
    assert controller.events is NO_EVENTS
    assert controller.writer.events is NO_EVENTS
    assert controller.runner.log.events is NO_EVENTS


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``registry``'s exposition, parsed back: ``(name, labels) -> value``."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def test_worker_metrics_count_runs_by_task_and_ending_in_a_registry_of_their_own(
    controllers: list[Controller],
) -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, tasks=app.types)
    controller = Controller(InMemoryTaskStore(), app=app, events=metrics, **FAST)
    controllers.append(controller)
    # Before any run: every task type and ending is there, at 0 (a rate sees the first one).
    found = samples(registry)
    for name in app.types:
        assert value(found, "chongming_worker_tasks_started_total", task=name) == 0
        for ending in ENDINGS:
            labels = {"task": name, "status": ending}
            assert value(found, "chongming_worker_tasks_finished_total", **labels) == 0
    for operation in OPERATIONS:
        assert value(found, "chongming_worker_store_errors_total", operation=operation) == 0

    controller.start()

    def ended() -> int:
        found = samples(registry)
        return int(sum(v for (n, _), v in found.items() if n.endswith("_finished_total")))

    def renewed() -> bool:
        return value(samples(registry), "chongming_worker_lease_renewals_total") > 0

    run_every_ending(controller, ended, renewed)
    found = samples(registry)
    finished = {
        ("ok", "succeeded"): 3,
        ("boom", "failed"): 2,
        ("hold", "stopped"): 1,
        ("hold", "lost"): 1,
    }
    for name in app.types:
        runs = sum(n for (task, _), n in finished.items() if task == name)
        assert value(found, "chongming_worker_tasks_started_total", task=name) == runs
        for ending in ENDINGS:
            count = value(found, "chongming_worker_tasks_finished_total", task=name,
                          status=ending)  # fmt: skip
            assert count == finished.get((name, ending), 0), (name, ending)
        assert value(found, "chongming_worker_task_duration_seconds_count", task=name) == runs
        assert value(found, "chongming_worker_task_duration_seconds_sum", task=name) > 0
        inf = value(found, "chongming_worker_task_duration_seconds_bucket", task=name, le="+Inf")
        assert inf == runs
    assert value(found, "chongming_worker_tasks_running") == 0
    assert value(found, "chongming_worker_lease_renewals_total") >= 1
    assert value(found, "chongming_worker_reconnects_total") == 0
    assert value(found, "chongming_worker_buckets_owned") == 0  # no pool joined
    le = {dict(labels).get("le") for (name, labels) in found if name.endswith("_bucket")}
    assert len(le) == len(DURATION_BUCKETS) + 1
    # Nothing went to prometheus-client's global registry.
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("chongming_")]


def test_two_workers_in_one_process_keep_their_series_apart() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = WorkerMetrics(first), WorkerMetrics(second)
    a.task_started("x")
    a.task_ended("x", "succeeded", 0.5)
    b.store_error("pool")
    assert value(samples(first), "chongming_worker_tasks_started_total", task="x") == 1
    assert ("chongming_worker_tasks_started_total", frozenset({("task", "x")})) not in samples(
        second
    )
    assert value(samples(second), "chongming_worker_store_errors_total", operation="pool") == 1
    assert value(samples(first), "chongming_worker_store_errors_total", operation="pool") == 0


def test_an_unreachable_store_is_counted_by_the_operation_that_failed(
    controllers: list[Controller],
) -> None:
    events = Recorder()
    store = RecordingStore(InMemoryTaskStore(), failing=ALL)
    # A long lease: the task is not lost while the store is away (only its heartbeats fail).
    controller = Controller(store, app=app, events=events, **{**FAST, "task_lease": 30.0})
    controllers.append(controller)
    controller.start()
    (task_id,) = controller.submit_many("hold", [None])
    wait_until(lambda: controller.writer.held.get(task_id) is not None, "the task to be held")
    store.down = True
    wanted = {"start", "commands", "reconcile", "lease"}
    wait_until(lambda: wanted <= {op for (op,) in events.of("store_error")}, str(wanted))
    store.down = False
    controller.stop(task_id)
    wait_until(lambda: events.of("ended") == [("hold", "stopped")], "the stop")


def test_every_reports_each_failure_and_the_reconnect_that_ends_an_outage() -> None:
    events = Recorder()
    running, wake = threading.Event(), threading.Event()
    running.set()
    outage = OutageLog(logger=logging.getLogger("test.metrics.outage"))
    calls = 0

    def body() -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise StoreUnavailable("down (test)")
        running.clear()  # the third call succeeds, and is the last

    every(0, body, running=running, wake=wake, what="look", reaches_store=True, outage=outage,
          events=events, operation="start")  # fmt: skip
    assert events.of("store_error") == [("start",), ("start",)]
    assert events.of("reconnected") == [()]


class PoolStore:
    """A ``BucketPoolStore`` of one worker that can be taken down."""

    def __init__(self) -> None:
        self.down = False

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        if self.down:
            raise StoreUnavailable("pool_state: down (test)")
        return {}, {}

    def pool_tick(self, *, worker: str, wanted: list[int], leaving: bool,
                  **_: Any) -> tuple[list[int], list[str]]:  # fmt: skip
        if self.down:
            raise StoreUnavailable("pool_tick: down (test)")
        return ([] if leaving else wanted), [worker]


class Clock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)


def test_the_pool_reports_its_buckets_its_failures_and_the_reconnect() -> None:
    events, store = Recorder(), PoolStore()
    pool = BucketPool(store, owner="w", num_buckets=8, clock=Clock(), on_change=lambda b: None,
                      worker_lease=0.15, events=events)  # fmt: skip
    pool.start()
    try:
        assert events.of("buckets") == [(8,)]
        store.down = True
        wait_until(lambda: events.of("store_error"), "a failed heartbeat")
        # (The outage log is the process's: an earlier test may have left it in an outage.)
        before = len(events.of("reconnected"))
        store.down = False
        wait_until(lambda: len(events.of("reconnected")) > before, "the reconnect")
    finally:
        pool.stop()
    assert {op for (op,) in events.of("store_error")} == {"pool"}
    assert events.of("buckets") == [(8,), (0,)]


def test_retries_and_timeouts_are_counted_by_task_type_and_cause(
    controllers: list[Controller],
) -> None:
    from chongming_redis.policy import RetryPolicy

    policies = App("policies")
    quick = RetryPolicy(max_attempts=2, base_delay=0.01, jitter=0.0)

    @policies.task("flaky", retry=quick)
    def flaky(ctx: TaskContext, params: Any) -> None:
        if ctx.attempt == 1:
            raise ValueError("first attempt")

    @policies.task("slow", retry=quick, timeout=0.2)
    def slow(ctx: TaskContext, params: Any) -> None:
        while True:
            ctx.checkpoint()
            time.sleep(0.01)

    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, tasks=policies.types)
    store = InMemoryTaskStore()
    controller = Controller(store, app=policies, events=metrics, **FAST)
    controllers.append(controller)
    controller.start()
    ids = [controller.submit("flaky"), controller.submit("slow")]
    deadline = time.monotonic() + 15
    while not all(store.get(i).status.is_terminal for i in ids):  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    found = samples(registry)
    assert value(found, "chongming_worker_task_retries_total", task="flaky", cause="failed") == 1
    assert value(found, "chongming_worker_task_retries_total", task="slow", cause="timeout") == 1
    assert value(found, "chongming_worker_task_timeouts_total", task="slow") == 2  # both tries
    assert ("chongming_worker_task_timeouts_total", frozenset({("task", "flaky")})) not in found


def test_worker_metrics_implement_every_worker_event() -> None:
    """Each ``WorkerEvents`` method is a series: none is left to the no-op base."""
    methods = [n for n, v in vars(WorkerEvents).items() if callable(v) and not n.startswith("_")]
    assert "schedule_ticks" in methods
    missing = [n for n in methods if getattr(WorkerMetrics, n) is getattr(WorkerEvents, n)]
    assert missing == []


def test_schedule_ticks_are_counted_by_schedule_and_outcome_from_zero() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    name = "chongming_worker_schedule_ticks_total"
    assert not [k for k in samples(registry) if k[0] == name]  # no schedule seen yet
    metrics.schedule_ticks("nightly", "missed", 3)
    metrics.schedule_ticks("nightly", "fired", 1)
    metrics.schedule_ticks("nightly", "fired", 1)
    metrics.schedule_ticks("hourly", "skipped", 1)
    found = {dict(labels)["schedule"] + "/" + dict(labels)["outcome"]: v
             for (n, labels), v in samples(registry).items() if n == name}  # fmt: skip
    assert found == {
        "nightly/fired": 2, "nightly/skipped": 0, "nightly/missed": 3, "nightly/triggered": 0,
        "hourly/fired": 0, "hourly/skipped": 1, "hourly/missed": 0, "hourly/triggered": 0,
    }  # fmt: skip


def test_a_controller_reports_the_ticks_it_fires(controllers: list[Controller]) -> None:
    from chongming_redis.schedules import Schedule

    ticking = App("ticking")

    @ticking.task()
    def tick(ctx: TaskContext, params: Any) -> None:
        return None

    ticking.schedule(Schedule("each-second", "tick", every=1))
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, tasks=ticking.types)
    store = InMemoryTaskStore()
    controller = Controller(store, app=ticking, events=metrics, **FAST)
    controllers.append(controller)
    controller.start()

    def fired() -> float:
        found = samples(registry)
        key = ("chongming_worker_schedule_ticks_total",
               frozenset({("schedule", "each-second"), ("outcome", "fired")}))  # fmt: skip
        return found.get(key, 0.0)

    wait_until(lambda: fired() >= 1, "a fired tick")
    controller.shutdown(grace=1)
    _, text = store.schedule_records()["each-second"]
    stored = json.loads(text)["counts"]["fired"]
    assert fired() == stored  # every tick the store counts was reported, once
