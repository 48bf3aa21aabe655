"""The group committer (``runtime/committer.py``): how long it waits for running tasks to end
and join its call (``Runner.linger``), and that it does gather them, on a real in-memory
worker and with a stand-in runner."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chongming_redis import InMemoryTaskStore, TaskStatus
from chongming_redis.errors import StoreUnavailable
from chongming_redis.runtime.app import App
from chongming_redis.runtime.committer import commit_finished
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.starting import MAX_LINGER
from tests.test_controller import FAST, wait_until


def runner_with(run_time: float | None, round_trip: float | None) -> Any:
    app = App("linger")
    controller = Controller(InMemoryTaskStore(), app=app, owner="w", concurrency=4)
    window = controller.runner._window
    window.run_time, window.round_trip_time = run_time, round_trip
    return controller.runner


def test_it_lingers_one_round_trip_for_short_tasks_and_never_for_long_ones() -> None:
    assert runner_with(None, None).linger() == 0.0, "nothing measured yet"
    assert runner_with(0.0001, None).linger() == 0.0
    assert runner_with(None, 0.001).linger() == 0.0
    assert runner_with(0.0001, 0.001).linger() == 0.001, "short tasks: one round trip"
    assert runner_with(0.0001, 0.5).linger() == MAX_LINGER, "bounded"
    assert runner_with(0.002, 0.001).linger() == 0.0, "tasks longer than the wait: none"
    assert runner_with(1.0, 0.5).linger() == 0.0


class StandIn:
    """What ``commit_finished`` uses of a runner: its queue, the wait, the running slots; it
    records each batch instead of writing it."""

    def __init__(self, linger: float, running: int, turn_free: bool = True) -> None:
        self.commits: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.batches: list[list[str]] = []
        self.starts: list[Any] = []  # what each flush_many was asked to start
        self._linger, self._running, self._turn_free = linger, running, turn_free
        self.writer = self
        self.owner = "stand-in"
        self.wake_starter = threading.Event()
        self.in_turn = False

    @contextmanager
    def start_turn(self) -> Iterator[bool]:
        self.in_turn = self._turn_free
        try:
            yield self._turn_free
        finally:
            self.in_turn = False

    def linger(self) -> float:
        return self._linger

    def running(self) -> int:
        return self._running

    def start_with_commit(self, freed: int) -> dict[str, Any]:
        assert self.in_turn, "the committer's start is asked for inside the start turn"
        return {"limit": freed}

    def flush_many(self, batch: list[Any], start: Any = None) -> list[Any]:
        self.batches.append([held.task_id for held in batch])
        self.starts.append(start)
        return []

    def took(self, seconds: float) -> None:
        pass

    def take(self, started: list[Any], sent_at: float) -> None:
        pass

    def settle(self, held: Any, *, wake: bool = True) -> None:
        pass

    def start_available(self, *, wait: bool = True) -> int:
        return 0


class Ended:
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.queued = True


def run_committer(stand_in: StandIn, late: float) -> list[list[str]]:
    running = threading.Event()
    running.set()
    thread = threading.Thread(target=commit_finished, args=(stand_in, running), daemon=True)
    thread.start()
    stand_in.commits.put(Ended("first"))
    time.sleep(late)
    stand_in.commits.put(Ended("second"))
    wait_until(lambda: sum(len(b) for b in stand_in.batches) == 2, timeout=10)
    running.clear()
    thread.join(timeout=5)
    return stand_in.batches


def test_a_task_ending_while_the_committer_lingers_joins_its_call() -> None:
    assert run_committer(StandIn(linger=5.0, running=1), late=0.05) == [["first", "second"]]


def test_without_a_wait_or_with_no_task_running_the_first_end_goes_alone() -> None:
    assert run_committer(StandIn(linger=0.0, running=1), late=0.3) == [["first"], ["second"]]
    assert run_committer(StandIn(linger=5.0, running=0), late=0.3) == [["first"], ["second"]]


def test_a_worker_of_short_tasks_drains_with_the_wait_measured() -> None:
    """End to end on the in-memory store: after a drain of short tasks both times are
    measured, so the committer waits (a bounded time) and every task still succeeds once."""
    app = App("linger")

    @app.task()
    def quick(ctx: TaskContext, params: Any) -> None:
        return None

    store = InMemoryTaskStore()
    controller = Controller(store, app=app, owner="w", **{**FAST, "concurrency": 4})
    ids = [controller.submit("quick") for _ in range(200)]
    controller.start()
    try:
        wait_until(lambda: store.counts()[TaskStatus.SUCCEEDED] == 200, timeout=30)
    finally:
        controller.shutdown(grace=5)
    assert 0.0 < controller.runner.linger() <= MAX_LINGER
    for task_id in ids:
        starts = [t for t in store.history(task_id) if t.to_status is TaskStatus.RUNNING]
        assert len(starts) == 1


def test_the_committer_starts_in_its_commit_call_only_while_it_holds_the_start_turn() -> None:
    """The turn free: the commit call carries the start of the freed slots. The starter's call
    under way: the batch is committed alone and the starter is woken to fill the slots."""
    free = StandIn(linger=0.0, running=0)
    assert run_committer(free, late=0.3) == [["first"], ["second"]]
    assert free.starts == [{"limit": 1}, {"limit": 1}]
    busy = StandIn(linger=0.0, running=0, turn_free=False)
    assert run_committer(busy, late=0.3) == [["first"], ["second"]]
    assert busy.starts == [None, None] and busy.wake_starter.is_set()


def test_the_start_turn_is_one_at_a_time_and_a_shutdown_waits_for_it() -> None:
    """A shutdown hands back what was started before it, after ``wait_for_start``: a start
    the committer sends in its commit call holds the same turn, so none lands after."""
    runner = runner_with(None, None)
    with runner.start_turn() as mine:
        assert mine
        with runner.start_turn() as second:
            assert not second, "one start call at a time"
        waiter = threading.Thread(target=runner.wait_for_start, daemon=True)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive(), "the shutdown's wait waits for the committer's start"
    waiter.join(5)
    assert not waiter.is_alive()
    with runner.start_turn() as again:
        assert again, "released"


class EndsUnwritable(InMemoryTaskStore):
    """The store is away for the ends of tasks while ``down`` is set: a ``commit_tasks``,
    ``commit_and_start`` or ``save`` that writes a final status raises ``StoreUnavailable``;
    submits and starts still work (a store that comes back between two calls)."""

    down = False

    def _refuse(self, what: str, items: Any = ()) -> None:
        if self.down and any(item[0].status.is_terminal for item in items):
            raise StoreUnavailable(f"{what}: away (test)")

    def commit_tasks(self, items: Any, **kwargs: Any) -> Any:
        self._refuse("commit_tasks", items)
        return super().commit_tasks(items, **kwargs)

    def commit_and_start(self, items: Any, **kwargs: Any) -> Any:
        self._refuse("commit_and_start", items)
        return super().commit_and_start(items, **kwargs)

    def save(self, snapshot: Any, *, expect_version: int) -> None:
        self._refuse("save", [(snapshot,)])
        super().save(snapshot, expect_version=expect_version)


def test_a_slot_whose_end_the_store_did_not_take_stays_taken_until_it_is_written() -> None:
    """A task's end that could not be written keeps its slot: a task started into it would
    show one more RUNNING here than there are slots until the buffered end lands (seen in a
    PostgreSQL stress run across a server restart: 5 RUNNING with 4 slots)."""
    store = EndsUnwritable()
    app = App("buffered-end")

    @app.task()
    def quick(ctx: TaskContext, params: Any) -> None:
        pass

    controller = Controller(store, app=app, owner="w", **{**FAST, "concurrency": 1})
    store.down = True
    first = controller.submit("quick")
    controller.start()
    try:
        wait_until(lambda: store.get(first).status is TaskStatus.RUNNING, what="the first start")
        second = controller.submit("quick")
        time.sleep(1.0)  # its function has returned; its end cannot be written
        running = [t for t in (first, second) if store.get(t).status is TaskStatus.RUNNING]
        assert running == [first], "a task started into a slot whose end is not stored"
        assert store.get(second).status is TaskStatus.PENDING
        store.down = False  # the supervisor writes the end, then the slot takes the next
        wait_until(lambda: store.get(second).status is TaskStatus.SUCCEEDED, what="the second")
        assert store.get(first).status is TaskStatus.SUCCEEDED
        assert [t.to_status for t in store.history(second)][-1] is TaskStatus.SUCCEEDED
    finally:
        store.down = False
        controller.shutdown(grace=2)
