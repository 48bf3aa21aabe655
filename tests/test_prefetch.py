"""Prefetch: started tasks waiting for a free slot (``runtime/runner.py``, ``Window``).

1. ``Window``: no prefetch before anything was measured or with ``prefetch=0``; short tasks
   against a slow round trip open it up to ``concurrency + prefetch``; tasks longer than the
   slots finish in a round trip keep it at ``concurrency``, and the first long task closes it.
2. A controller with one slot held by a blocked task and the window forced open: the next task
   is started (``RUNNING``, leased) and waits. Stopped while it waits, it is ``STOPPED`` at once
   (not when the slot frees) and its function never begins; paused, it is handed back paused
   at once, held by nobody, and runs after a resume; at shutdown the waiting tasks are handed
   back at once while the running one gets its grace; no more tasks are outstanding than the
   window allows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chongming_redis import InMemoryTaskStore, RetryPolicy, TaskStatus
from chongming_redis.runtime.app import App
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.runner import Window
from tests.test_controller import FAST, wait_status, wait_until

# -- the window ------------------------------------------------------------------------------


def test_no_prefetch_before_both_times_are_measured() -> None:
    window = Window(concurrency=4, prefetch=64)
    assert window.size() == 4
    window.ran(0.0001)
    assert window.size() == 4  # no round trip measured yet
    window.round_trip(0.001)
    assert window.size() > 4


def test_short_tasks_open_the_window_up_to_the_prefetch_limit() -> None:
    window = Window(concurrency=4, prefetch=64)
    window.ran(0.00005)
    window.round_trip(0.002)  # 4 slots finish 160 tasks per round trip: capped at 64
    assert window.size() == 4 + 64
    window = Window(concurrency=4, prefetch=64)
    window.ran(0.001)
    window.round_trip(0.002)  # 4 slots finish 8 tasks during one round trip
    assert window.size() == 4 + 8


def test_tasks_longer_than_the_slots_finish_in_a_round_trip_prefetch_nothing() -> None:
    window = Window(concurrency=4, prefetch=64)
    window.ran(2.0)
    window.round_trip(0.001)
    assert window.size() == 4  # 4 * 0.001 / 2.0 rounds down to no task
    for _ in range(50):
        window.ran(2.0)
    assert window.size() == 4


def test_one_long_task_closes_the_window_at_once_and_it_reopens_slowly() -> None:
    window = Window(concurrency=4, prefetch=64)
    for _ in range(20):
        window.ran(0.00005)
    window.round_trip(0.002)
    assert window.size() == 68  # a backlog of short tasks: the whole prefetch
    window.ran(0.5)  # the workload switched to long tasks: the first one decides
    assert window.size() == 4
    window.ran(0.00005)  # one short task does not reopen it
    assert window.size() == 4


def test_prefetch_zero_means_exactly_the_slots() -> None:
    window = Window(concurrency=3, prefetch=0)
    window.ran(0.00001)
    window.round_trip(1.0)
    assert window.size() == 3


def test_the_config_takes_prefetch_zero_and_refuses_negative() -> None:
    assert ControllerConfig(prefetch=0).prefetch == 0
    with pytest.raises(ValueError):
        ControllerConfig(prefetch=-1)
    with pytest.raises(TypeError):
        ControllerConfig(prefetch=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerConfig(concurrency=0)


# -- a prefetched task -----------------------------------------------------------------------


@pytest.fixture
def one_slot() -> Iterator[tuple[Controller, InMemoryTaskStore, dict[str, Any]]]:
    """A started controller with one slot and the window forced open to 1 + 2; ``state``
    has ``gate`` (the blocker waits on it) and ``ran`` (the ids whose function began)."""
    store = InMemoryTaskStore()
    app = App("prefetch")
    state: dict[str, Any] = {"gate": threading.Event(), "ran": []}

    @app.task()
    def block(ctx: TaskContext, params: Any) -> None:
        state["ran"].append(ctx.task_id)
        state["gate"].wait(10)

    @app.task()
    def quick(ctx: TaskContext, params: Any) -> None:
        state["ran"].append(ctx.task_id)

    controller = Controller(store, app=app, **{**FAST, "concurrency": 1, "prefetch": 2})
    window = controller.runner._window
    window.ran(0.00001)
    window.round_trip(1.0)  # as if round trips were slow and tasks instant
    assert window.size() == 3
    controller.start()
    try:
        yield controller, store, state
    finally:
        state["gate"].set()
        controller.shutdown(grace=2, hand_back="stop")


def occupy_the_slot(controller: Controller, state: dict[str, Any]) -> str:
    """Submit the blocker and wait until it runs: the only slot is busy from then on."""
    blocker = controller.submit("block")
    wait_until(lambda: state["ran"] == [blocker], what="the blocker to run")
    return blocker


def test_a_prefetched_task_stopped_while_waiting_is_stopped_at_once_and_never_begins(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = occupy_the_slot(controller, state)
    waiting = controller.submit("quick")
    snapshot = wait_status(store, waiting, TaskStatus.RUNNING)  # started: prefetched
    assert snapshot.lease_owner == controller.owner
    assert state["ran"] == [blocker]  # started, not begun: the only slot is busy
    assert controller.stop(waiting) == "stopped"
    stopped = store.get(waiting)  # now, while the blocker still holds the slot
    assert stopped is not None and stopped.status is TaskStatus.STOPPED
    assert [t.reason for t in store.history(waiting)][-1] == "stopped before it began"
    state["gate"].set()
    wait_status(store, blocker, TaskStatus.SUCCEEDED)
    assert waiting not in state["ran"]  # the function never began


def test_a_prefetched_task_paused_while_waiting_is_handed_back_paused_and_runs_after_resume(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = occupy_the_slot(controller, state)
    waiting = controller.submit("quick")
    wait_status(store, waiting, TaskStatus.RUNNING)
    assert controller.pause(waiting) == "paused"
    paused = store.get(waiting)  # at once, while the blocker still holds the slot
    assert paused is not None and paused.status is TaskStatus.PAUSED
    assert paused.attempt == 1  # handed back: the same attempt, held by nobody
    assert waiting not in controller.held
    state["gate"].set()
    wait_status(store, blocker, TaskStatus.SUCCEEDED)
    assert store.get(waiting).status is TaskStatus.PAUSED  # type: ignore[union-attr]
    assert waiting not in state["ran"]
    assert controller.resume(waiting).startswith("sent:")  # nobody holds it: a command
    wait_status(store, waiting, TaskStatus.SUCCEEDED)
    assert state["ran"] == [blocker, waiting]
    starts = [t for t in store.history(waiting) if t.to_status is TaskStatus.RUNNING]
    # attempt 1 twice: prefetched and handed back before it began, then run
    assert len(starts) == 2 and store.get(waiting).attempt == 1  # type: ignore[union-attr]


def test_shutdown_hands_waiting_tasks_back_at_once_and_none_begins_after_it(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = occupy_the_slot(controller, state)
    waiting = [controller.submit("quick") for _ in range(2)]
    for task_id in waiting:
        wait_status(store, task_id, TaskStatus.RUNNING)
    stopping = threading.Thread(target=controller.shutdown, kwargs={"grace": 60})
    stopping.start()
    for task_id in waiting:  # handed back while the blocker still runs, not after the grace
        snapshot = wait_status(store, task_id, TaskStatus.PENDING)
        assert snapshot.attempt == 1  # a hand-back keeps the attempt
    assert store.get(blocker).status is TaskStatus.RUNNING  # type: ignore[union-attr]
    state["gate"].set()  # the blocker ends within its grace
    stopping.join(30)
    assert not stopping.is_alive()
    assert store.get(blocker).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    assert state["ran"] == [blocker]  # neither waiting task began, not even during the grace


def test_no_more_tasks_are_outstanding_than_the_window_allows(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    occupy_the_slot(controller, state)
    others = [controller.submit("quick") for _ in range(5)]
    wait_until(
        lambda: sum(store.get(t).status is TaskStatus.RUNNING for t in others) == 2,  # type: ignore[union-attr]
        what="two prefetched",
    )
    controller.start_available()  # another pass starts nothing: the window is full
    assert sum(store.get(t).status is TaskStatus.PENDING for t in others) == 3  # type: ignore[union-attr]
    state["gate"].set()
    for task_id in others:
        wait_status(store, task_id, TaskStatus.SUCCEEDED)


class SlowStartStore(InMemoryTaskStore):
    """Its batched start takes a while, and says when it has begun: long enough for a
    shutdown to begin while tasks are being started."""

    def __init__(self) -> None:
        super().__init__()
        self.starting = threading.Event()

    def start_tasks(self, **options: Any) -> list[Any]:
        started = super().start_tasks(**options)
        if started:
            self.starting.set()
            time.sleep(0.5)
        return started


def test_a_task_started_while_shutdown_begins_is_handed_back_not_left_running() -> None:
    store = SlowStartStore()
    app = App("prefetch-race")
    ran: list[str] = []

    @app.task()
    def quick(ctx: TaskContext, params: Any) -> None:
        ran.append(ctx.task_id)

    controller = Controller(store, app=app, **{**FAST, "concurrency": 1, "prefetch": 0})
    controller.start()
    task_id = controller.submit("quick")
    assert store.starting.wait(10)  # the start call is under way: stored RUNNING, not yet held
    controller.shutdown(grace=5)  # begins while the start call has not returned
    snapshot = wait_status(store, task_id, TaskStatus.PENDING)
    assert snapshot.attempt == 1  # handed back at once, not left RUNNING until its lease ends
    assert ran == []


def test_a_task_is_handed_back_once_however_often_it_is_asked() -> None:
    """A second signal and the shutdown thread may both hand back the same task: it must get
    one hand-back, not two."""
    store = InMemoryTaskStore()
    app = App("hand-back-once")
    gate = threading.Event()

    @app.task()
    def block(ctx: TaskContext, params: Any) -> None:
        gate.wait(10)

    controller = Controller(store, app=app, **{**FAST, "concurrency": 1})
    controller.start()
    try:
        task_id = controller.submit("block")
        wait_status(store, task_id, TaskStatus.RUNNING)
        held = controller.held.get(task_id)
        assert held is not None
        threads = [threading.Thread(target=controller.writer.hand_back, args=(held, "requeue"))
                   for _ in range(4)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        snapshot = wait_status(store, task_id, TaskStatus.PENDING)
        assert (snapshot.attempt, snapshot.status_version) == (1, 3)  # created, started, back
        assert [t.reason for t in store.history(task_id)].count("handed back at shutdown") == 1
    finally:
        gate.set()
        controller.shutdown(grace=2)


def _blocked_task(name: str) -> tuple[Controller, InMemoryTaskStore, threading.Event, list[str]]:
    store = InMemoryTaskStore()
    app = App(name)
    gate = threading.Event()
    returned: list[str] = []

    @app.task()
    def block(ctx: TaskContext, params: Any) -> None:
        gate.wait(10)
        returned.append(ctx.task_id)

    controller = Controller(store, app=app, **{**FAST, "concurrency": 1})
    controller.start()
    return controller, store, gate, returned


def test_a_hand_back_or_a_pause_after_the_task_ended_moves_nothing() -> None:
    """The shutdown's hand-back (or a pause) racing the task's own end: once the end is
    recorded here, nothing moves the finished task on — not to a new attempt, not to PAUSED
    (the store cannot fence it: the version is ours). Then the function's return, which lost
    the race, writes nothing either."""
    controller, store, gate, returned = _blocked_task("end-then-hand-back")
    try:
        task_id = controller.submit("block")
        wait_status(store, task_id, TaskStatus.RUNNING)
        held = controller.held.get(task_id)
        assert held is not None
        writer = controller.writer
        assert writer.end(held, TaskStatus.SUCCEEDED, None, result=None)
        writer.hand_back(held, "requeue")
        assert not writer.transition(held, TaskStatus.PAUSED, "pause requested")
        assert not writer.end(held, TaskStatus.FAILED, None)  # claimed once
        assert writer.flush(held)
        gate.set()  # the function returns: its end lost the race
        wait_until(lambda: returned == [task_id])
        time.sleep(0.3)
        history = store.history(task_id)
        assert [e.to_status for e in history][-1] is TaskStatus.SUCCEEDED
        assert [e.to_status for e in history].count(TaskStatus.SUCCEEDED) == 1
        final = store.get(task_id)
        assert final is not None and final.status is TaskStatus.SUCCEEDED
        assert final.attempt == 1 and final.status_version == history[-1].version
    finally:
        gate.set()
        controller.shutdown(grace=5)


def test_a_task_handed_back_before_its_function_returns_records_no_end_of_its_own() -> None:
    controller, store, gate, returned = _blocked_task("hand-back-then-end")
    try:
        task_id = controller.submit("block")
        wait_status(store, task_id, TaskStatus.RUNNING)
        held = controller.held.get(task_id)
        assert held is not None
        controller.writer.hand_back(held, "requeue")
        version = held.snapshot.status_version
        gate.set()
        wait_until(lambda: task_id in returned)
        time.sleep(0.3)
        assert held.snapshot.status_version == version  # its return moved nothing
        history = store.history(task_id)
        handed = next(i for i, e in enumerate(history) if e.reason == "handed back at shutdown")
        assert history[handed - 1].to_status is TaskStatus.RUNNING
        # nothing of the handed-back run after it: what follows is the next run's own start
        assert all(e.from_status is not TaskStatus.PENDING or e.to_status is TaskStatus.RUNNING
                   or e.to_status is TaskStatus.STOPPED for e in history[handed + 1 :])  # fmt: skip
        assert [e.to_status for e in history].count(TaskStatus.SUCCEEDED) <= 1
    finally:
        gate.set()
        controller.shutdown(grace=5)


def test_a_prefetched_task_past_its_timeout_is_ended_while_it_waits_and_never_begins() -> None:
    """A task started (prefetched) behind a busy slot is RUNNING in the store: its timeout runs
    from that start, so it is ended FAILED/TaskTimeout timeout_grace later by its own worker
    (which no reconcile of its own would touch), and its function never begins."""
    store = InMemoryTaskStore()
    app = App("prefetch-timeout")
    gate, ran = threading.Event(), []

    @app.task()
    def block(ctx: TaskContext, params: Any) -> None:
        gate.wait(15)

    @app.task(timeout=0.2, retry=RetryPolicy(max_attempts=1))
    def short(ctx: TaskContext, params: Any) -> None:
        ran.append(ctx.task_id)

    controller = Controller(store, app=app, **{**FAST, "concurrency": 1, "prefetch": 2,
                                               "timeout_grace": 0.2})  # fmt: skip
    window = controller.runner._window
    window.ran(0.00001)
    window.round_trip(1.0)
    controller.start()
    try:
        blocker = controller.submit("block")
        wait_status(store, blocker, TaskStatus.RUNNING)
        waiting = controller.submit("short")
        failed = wait_status(store, waiting, TaskStatus.FAILED)
        assert failed.failure is not None and failed.failure.error_type == "TaskTimeout"
        assert "waited for a slot" in failed.failure.message
        assert store.get(blocker).status is TaskStatus.RUNNING  # type: ignore[union-attr]
        gate.set()
        wait_status(store, blocker, TaskStatus.SUCCEEDED)
        time.sleep(0.2)
        assert ran == []  # it never began
        assert store.get(waiting).status_version == failed.status_version  # type: ignore[union-attr]
    finally:
        gate.set()
        controller.shutdown(grace=2, hand_back="stop")
