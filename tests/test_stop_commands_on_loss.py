"""A stop command that waited for a task this worker then lost is handed back at once.

The explanation of the stress matrix's unfinished commands (docs/reliability.md, "A 20-seed
matrix"): a stop for a held task is claimed and answered only when the task has really ended.
If the worker lost the task first (its lease ran out under a pause, or another writer moved it
on), the command used to stay leased to that worker, unanswered, for the whole
``command_lease``. Now it goes back to the queue at once and is answered. The command lease here
is longer than every wait, so only the hand-back can explain the answer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from chongming_redis import TaskStatus, Transition
from chongming_redis.model import Command, CommandKind
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from tests.support.flaky_store import RecordingStore
from tests.test_controller import FAST, WAIT, wait_history, wait_status, wait_until

COMMAND_LEASE = 600.0  # far beyond every wait of this file


def completions(recording: RecordingStore, command_id: str) -> list[Any]:
    """The outcomes ``complete_command`` was called with for ``command_id``, in order."""
    return [
        c.kwargs.get("outcome")
        for c in recording.calls_of("complete_command")
        if c.args[:1] == (command_id,) and not c.failed
    ]


def test_a_stop_waiting_for_a_task_the_worker_lost_is_answered_before_its_lease_ends(
    memory_or_redis_store: Any,
) -> None:
    store = memory_or_redis_store
    recording = RecordingStore(store)
    worker = Controller(recording, **{**FAST, "command_lease": COMMAND_LEASE})
    asked = threading.Event()

    @worker.task()
    def stubborn(ctx: TaskContext, params: Any) -> str:
        """Ignores the stop (it never calls checkpoint) until it learns it lost the task."""
        deadline = time.monotonic() + WAIT
        while ctx.lost_reason is None and time.monotonic() < deadline:
            if ctx.stop_requested:
                asked.set()
            time.sleep(0.01)
        return "too late"

    worker.start()
    try:
        task_id = worker.submit("stubborn")
        running = wait_status(store, task_id, TaskStatus.RUNNING)
        wait_history(store, task_id, 2)
        stop = Command("stop-1", task_id, CommandKind.STOP, store.server_time())
        store.submit_command(stop)
        wait_until(asked.is_set, what="the worker to pass the stop to the task")
        assert completions(recording, "stop-1") == []  # "stopping": it waits for the end

        now = store.server_time()  # a second writer ends the task: this worker lost it
        intruder = dataclasses.replace(
            running, status=TaskStatus.STOPPED, status_version=3, updated_at=now
        )
        store.save(intruder, expect_version=2)
        store.append(Transition(task_id, 3, TaskStatus.RUNNING, TaskStatus.STOPPED, now, "other"))

        wait_until(lambda: completions(recording, "stop-1"), what="the stop to be answered")
        assert completions(recording, "stop-1") == ["already-terminal"]
        assert [c.args for c in recording.calls_of("release_command")] == [("stop-1",)]
        # Answered once and for good: nobody can claim it again, the task is as the other
        # writer left it (the late result is discarded).
        far = store.server_time().replace(year=2099)
        assert store.claim_commands(now=far, lease_seconds=1) == []
        after = store.get(task_id)
        assert (after.status, after.status_version, after.result) == (TaskStatus.STOPPED, 3, None)
    finally:
        worker.shutdown(grace=0, hand_back="stop")
