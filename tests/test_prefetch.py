"""Prefetch: started tasks waiting for a free slot (``runtime/runner.py``, ``Window``).

1. ``Window``: no prefetch before anything was measured or with ``prefetch=0``; short tasks
   against a slow round trip open it up to ``concurrency + prefetch``; tasks much longer than a
   round trip keep it at ``concurrency``.
2. A controller with one slot held by a blocked task and the window forced open: the next task
   is started (``RUNNING``, leased) and waits. Stopped or paused while it waits, its function
   never begins; resumed, it runs; and no more tasks are outstanding than the window allows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from chongming_redis import InMemoryTaskStore, TaskStatus
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


def test_long_tasks_prefetch_at_most_one_per_round_trip_they_span() -> None:
    window = Window(concurrency=4, prefetch=64)
    window.ran(2.0)
    window.round_trip(0.001)
    assert window.size() == 4 + 1  # ceil(4 * 0.001 / 2.0): less than one task's worth
    for _ in range(50):
        window.ran(2.0)
    assert window.size() == 5


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


def test_a_prefetched_task_stopped_while_waiting_never_begins(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = controller.submit("block")
    wait_until(lambda: state["ran"] == [blocker], what="the blocker to run")
    waiting = controller.submit("quick")
    snapshot = wait_status(store, waiting, TaskStatus.RUNNING)  # started: prefetched
    assert snapshot.lease_owner == controller.owner
    assert state["ran"] == [blocker]  # started, not begun: the only slot is busy
    controller.stop(waiting)
    state["gate"].set()
    wait_status(store, waiting, TaskStatus.STOPPED)
    assert waiting not in state["ran"]  # the function never began
    wait_status(store, blocker, TaskStatus.SUCCEEDED)


def test_a_prefetched_task_paused_while_waiting_waits_for_its_resume(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = controller.submit("block")
    wait_until(lambda: state["ran"] == [blocker], what="the blocker to run")
    waiting = controller.submit("quick")
    wait_status(store, waiting, TaskStatus.RUNNING)
    assert controller.pause(waiting) == "paused"
    state["gate"].set()
    wait_status(store, blocker, TaskStatus.SUCCEEDED)
    wait_status(store, waiting, TaskStatus.PAUSED)
    assert waiting not in state["ran"]  # it got the slot and waits, paused, before its work
    assert controller.resume(waiting) == "resumed"
    wait_status(store, waiting, TaskStatus.SUCCEEDED)
    assert state["ran"] == [blocker, waiting]


def test_no_more_tasks_are_outstanding_than_the_window_allows(
    one_slot: tuple[Controller, InMemoryTaskStore, dict[str, Any]],
) -> None:
    controller, store, state = one_slot
    blocker = controller.submit("block")
    wait_until(lambda: state["ran"] == [blocker], what="the blocker to run")
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
