"""Process isolation: a task in a child process is stopped, paused and resumed without its
cooperation, reports progress through the parent, and its result or failure is recorded."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from chongming_redis import InMemoryTaskStore, TaskStatus
from chongming_redis.runtime.controller import Controller
from tests.support.isolated_tasks import app


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def controller() -> Iterator[Controller]:
    worker = Controller(InMemoryTaskStore(), app=app, owner="iso", start_poll_interval=0.05,
                        progress_interval=0.05, task_lease=5.0)  # fmt: skip
    worker.start()
    yield worker
    worker.shutdown(grace=1.0, hand_back="stop")


def status(controller: Controller, task_id: str) -> TaskStatus:
    snapshot = controller.get(task_id)
    assert snapshot is not None
    return snapshot.status


def test_a_task_that_never_checks_in_is_stopped_by_killing_its_process(
    controller: Controller,
) -> None:
    task_id = controller.submit("spin_forever")
    wait_until(lambda: status(controller, task_id) is TaskStatus.RUNNING)
    wait_until(lambda: controller.held.get(task_id) is not None)  # held a moment after
    assert controller.stop(task_id) == "stopping"
    wait_until(lambda: status(controller, task_id) is TaskStatus.STOPPED)
    assert [t.to_status for t in controller.history(task_id)][-1] is TaskStatus.STOPPED


def test_pause_freezes_the_child_and_resume_lets_it_finish(controller: Controller) -> None:
    task_id = controller.submit("count", {"n": 200, "sleep": 0.01})

    def progress() -> int | float:
        snapshot = controller.get(task_id)
        return -1 if snapshot is None or snapshot.progress is None else snapshot.progress.current

    wait_until(lambda: progress() >= 5)
    assert controller.pause(task_id) == "paused"
    time.sleep(0.3)  # let the last heartbeats before the SIGSTOP arrive
    frozen = progress()
    time.sleep(0.5)
    assert progress() == frozen, "a paused child does no work"
    assert status(controller, task_id) is TaskStatus.PAUSED
    assert controller.resume(task_id) == "resumed"
    wait_until(lambda: status(controller, task_id) is TaskStatus.SUCCEEDED)
    snapshot = controller.get(task_id)
    assert snapshot is not None and snapshot.result == {"counted": 200}


def test_a_failure_in_the_child_is_recorded_with_its_type_and_traceback(
    controller: Controller,
) -> None:
    task_id = controller.submit("explode")
    wait_until(lambda: status(controller, task_id) is TaskStatus.FAILED)
    snapshot = controller.get(task_id)
    assert snapshot is not None and snapshot.failure is not None
    assert snapshot.failure.error_type == "RuntimeError"
    assert snapshot.failure.message == "boom in the child"
    assert "explode" in (snapshot.failure.traceback or "")


def test_isolation_must_be_thread_or_process() -> None:
    with pytest.raises(ValueError, match="isolation"):
        app.task(isolation="fiber")


def test_a_process_task_past_its_timeout_is_terminated_and_failed_as_a_timeout(
    controller: Controller,
) -> None:
    task_id = controller.submit("spin_with_timeout")
    wait_until(lambda: status(controller, task_id) is TaskStatus.FAILED)
    snapshot = controller.get(task_id)
    assert snapshot is not None and snapshot.failure is not None
    assert snapshot.failure.error_type == "TaskTimeout" and snapshot.attempt == 1
    assert snapshot.timeout == 0.5 and snapshot.deadline is not None
    after = controller.submit("count", {"n": 3})  # the worker goes on
    wait_until(lambda: status(controller, after) is TaskStatus.SUCCEEDED)


def test_a_process_tasks_failure_is_matched_through_its_class_hierarchy(
    controller: Controller,
) -> None:
    retried = controller.submit("connects")
    wait_until(lambda: status(controller, retried) is TaskStatus.SUCCEEDED)
    assert controller.get(retried).attempt == 2  # type: ignore[union-attr]
    final = controller.submit("declines")
    wait_until(lambda: status(controller, final) is TaskStatus.FAILED)
    time.sleep(0.3)
    ended = controller.get(final)
    assert ended is not None and ended.attempt == 1 and ended.failure is not None
    assert ended.failure.error_type == "Declined"
