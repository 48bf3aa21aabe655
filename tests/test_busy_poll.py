"""The starter's quicker poll on a store without nudges (``runtime.loops.BusyPoll``): for a
while after a pass started a task it looks every ``BUSY_POLL`` seconds, then at its idle
interval again; on SQLite a task another process submits during that while starts long before
the idle poll would have found it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from chongming_redis.runtime.app import App
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.loops import BUSY_POLL, BusyPoll
from chongming_redis.stores.sqlite import SqliteTaskStore

#: The longest a wait here takes when the quicker poll works; the idle poll is 30 s.
BOUND = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_poll_is_quick_for_a_while_after_a_pass_started_work_then_idle() -> None:
    clock = Clock()
    poll = BusyPoll(1.0, busy=0.02, busy_for=2.0, clock=clock)
    assert poll.interval() == 1.0  # nothing started yet
    poll.started(0)
    assert poll.interval() == 1.0  # a pass that found nothing changes nothing
    poll.started(3)
    assert poll.interval() == 0.02
    clock.now += 1.9
    poll.started(0)
    assert poll.interval() == 0.02  # an empty pass does not end the while...
    clock.now += 0.2
    assert poll.interval() == 1.0  # ... its length does
    poll.started(1)
    clock.now += 1.9
    poll.started(1)  # each pass that starts work extends it
    clock.now += 1.9
    assert poll.interval() == 0.02


def test_the_quick_poll_is_never_slower_than_the_idle_one() -> None:
    assert BusyPoll(0.01).busy == 0.01
    assert BusyPoll(5.0).busy == BUSY_POLL


def test_on_sqlite_work_from_another_process_starts_quickly_after_work(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    store, producer = SqliteTaskStore(path), SqliteTaskStore(path)  # no in-process nudge
    app, ran = App("busy"), [threading.Event(), threading.Event()]

    @app.task("job")
    def job(ctx: TaskContext, params: Any) -> None:
        ran[params["n"]].set()

    worker = Controller(store, app=app, owner="w1",
                        config=ControllerConfig(start_poll_interval=30.0))  # fmt: skip
    worker.start()
    try:
        worker.submit("job", {"n": 0})  # a local submit wakes the starter, which finds work
        assert ran[0].wait(BOUND)
        time.sleep(0.3)  # the pass that started it, and the one its end woke, are over
        Controller(producer, app=app, owner="p").submit("job", {"n": 1})
        assert ran[1].wait(BOUND)  # the idle poll would be 30 s away
    finally:
        worker.shutdown(grace=2)
        producer.close()
        store.close()
