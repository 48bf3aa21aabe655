"""``Client``, the producer's API, against a real redis-server with a real worker (a started
``Controller`` on its own store connection) running the tasks: submit and wait, the typed
errors of a task that ended without a result, stop/pause/resume outcomes for running, pending,
finished and unknown tasks, retry, validation before any write, and typed handles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from chongming_redis import (
    App,
    Client,
    TaskContext,
    TaskFailed,
    TaskLost,
    TaskStatus,
    TaskStopped,
)
from chongming_redis.client.client import CommandTimeout, TaskNotFinished, TaskNotFound
from chongming_redis.errors import StoreUnavailable, TaskAlreadyExists
from chongming_redis.model import CommandKind, Failure, TaskQuery
from chongming_redis.outcomes import TaskOutcome
from chongming_redis.runtime.app import InvalidParams, TaskFunction, UnknownTask
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

app = App("client-tests")
release = threading.Event()


class Resize(BaseModel):
    width: int


@app.task()
def resize(ctx: TaskContext, params: Resize) -> dict[str, int]:
    return {"width": params.width * 2}


@app.task()
def boom(ctx: TaskContext, params: Any) -> None:
    raise ValueError(f"bad input {params!r}")


@app.task()
def spin(ctx: TaskContext, params: Any) -> str:
    """Checkpoints until released (or stopped)."""
    while not release.is_set():
        ctx.checkpoint(message="spinning")
        time.sleep(0.005)
    return "released"


#: The ids of the swallow_stop tasks whose function is running.
SWALLOWING: set[str] = set()


@app.task()
def swallow_stop(ctx: TaskContext, params: Any) -> str:
    """Catches the stop (a broad ``except Exception``) and returns a result anyway."""
    try:
        while True:
            SWALLOWING.add(ctx.task_id)  # its function runs (a stop before it began stops it)
            ctx.checkpoint()
            time.sleep(0.005)
    except Exception:
        return "carried on"


@pytest.fixture
def client(redis_proc: RedisProc, namespace: str) -> Iterator[Client]:
    with Client.from_url(redis_proc.url, namespace=namespace, app=app) as made:
        yield made


@pytest.fixture
def worker(redis_proc: RedisProc, namespace: str) -> Iterator[Controller]:
    release.clear()
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    controller = Controller(store, app=app, concurrency=4, command_poll_interval=0.2,
                            start_poll_interval=0.2)  # fmt: skip
    controller.start()
    yield controller
    release.set()
    controller.shutdown(grace=5)
    store.close()


def wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def statuses(client: Client, task_id: str) -> list[str]:
    return [t.to_status.value for t in client.history(task_id)]


# -- submit and wait ---------------------------------------------------------------------------


def test_submit_then_wait_returns_the_result_and_the_history_is_complete(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("resize", {"width": 320})
    assert isinstance(handle.task_id, str) and len(handle.task_id) == 20
    assert handle.wait(timeout=10) == {"width": 640}
    assert handle.wait(timeout=10) == {"width": 640}  # a second wait reads the same
    assert handle.result() == {"width": 640}
    assert statuses(client, handle.task_id) == ["pending", "running", "succeeded"]
    assert client.get(handle.task_id).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]


def test_a_failed_task_raises_task_failed_carrying_the_stored_failure(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("boom", {"n": 1})
    with pytest.raises(TaskFailed) as caught:
        handle.wait(timeout=10)
    failure = caught.value.failure
    assert isinstance(failure, Failure) and failure.error_type == "ValueError"
    assert "bad input {'n': 1}" in failure.message and "Traceback" in (failure.traceback or "")
    assert caught.value.task_id == handle.task_id and isinstance(caught.value, TaskOutcome)
    assert "ValueError: bad input" in str(caught.value)
    with pytest.raises(TaskFailed):
        handle.result()


def test_wait_times_out_with_the_status_it_last_read_and_result_does_not_wait(
    client: Client,
) -> None:
    handle = client.submit("resize", {"width": 1})  # no worker: it stays pending
    began = time.monotonic()
    with pytest.raises(TaskNotFinished) as caught:
        handle.wait(timeout=0.3)
    assert time.monotonic() - began >= 0.3
    assert caught.value.snapshot.status is TaskStatus.PENDING and "pending" in str(caught.value)
    with pytest.raises(TaskNotFinished):
        handle.result()
    with pytest.raises(TaskNotFound):
        client.wait("no-such-task", timeout=1)
    with pytest.raises(ValueError):
        client.wait(handle.task_id, timeout=-1)


def test_submit_validates_name_params_and_options_before_writing_anything(
    client: Client,
) -> None:
    with pytest.raises(UnknownTask, match="resise"):
        client.submit("resise", {"width": 1})
    with pytest.raises(InvalidParams, match="width"):
        client.submit("resize", {"width": "wide"})
    with pytest.raises(InvalidParams):
        client.submit_many("resize", [{"width": 1}, {"width": "x"}])  # the whole batch
    with pytest.raises(ValueError, match="delay"):
        client.submit("resize", {"width": 1}, delay=-1)
    with pytest.raises(ValueError):
        client.submit("resize", {"width": 1}, tags=[""])
    with pytest.raises(TypeError):
        client.submit("resize", {"width": 1}, delay=1, not_before=client.clock.now())
    assert client.stats() == dict.fromkeys(TaskStatus, 0)
    assert client.list() == []


def test_submit_many_and_an_existing_id(client: Client, worker: Controller) -> None:
    handles = client.submit_many("resize", [{"width": n} for n in range(5)])
    assert len({h.task_id for h in handles}) == 5
    assert [h.wait(timeout=10) for h in handles] == [{"width": 2 * n} for n in range(5)]
    assert client.submit_many("resize", []) == []
    client.submit("resize", {"width": 1}, task_id="fixed-id")
    with pytest.raises(TaskAlreadyExists):
        client.submit("resize", {"width": 2}, task_id="fixed-id")
    assert client.get("fixed-id").params == {"width": 1}  # type: ignore[union-attr]


def test_a_delayed_task_does_not_start_before_its_delay(client: Client) -> None:
    handle = client.submit("resize", {"width": 1}, delay=30)
    stored = client.get(handle.task_id)
    assert stored is not None and stored.not_before is not None
    assert 29 < (stored.not_before - stored.created_at).total_seconds() <= 30


def test_typed_handles_submit_by_the_registered_name_and_stay_callable(
    client: Client, worker: Controller
) -> None:
    assert isinstance(resize, TaskFunction) and resize.name == "resize"
    assert resize(None, Resize(width=4)) == {"width": 8}  # still the function
    assert resize.submit(client, width=5).wait(timeout=10) == {"width": 10}
    assert resize.submit(client, Resize(width=6)).wait(timeout=10) == {"width": 12}
    handles = resize.submit_many(client, [{"width": 1}, {"width": 2}])
    assert [h.wait(timeout=10) for h in handles] == [{"width": 2}, {"width": 4}]
    with pytest.raises(InvalidParams):
        resize.submit(client, width="x")
    with pytest.raises(TypeError):
        resize.submit(client, Resize(width=1), width=2)


def test_registration_checks_the_signature() -> None:
    other = App("signatures")
    with pytest.raises(TypeError, match=r"\(ctx, params\)"):

        @other.task()
        def one_argument(ctx: TaskContext) -> None: ...

    with pytest.raises(TypeError, match=r"\(ctx, params\)"):

        @other.task()
        def keyword_only(*, ctx: Any, params: Any) -> None: ...

    @other.task()
    def flexible(ctx: Any, params: Any = None, *rest: Any) -> None: ...

    assert set(other.types) == {"flexible"}


def test_without_an_app_parameters_are_stored_as_given(
    redis_proc: RedisProc, namespace: str
) -> None:
    with Client.from_url(redis_proc.url, namespace=namespace) as bare:
        handle = bare.submit("anything", {"free": ["form"]})
        assert bare.get(handle.task_id).params == {"free": ["form"]}  # type: ignore[union-attr]


# -- control -----------------------------------------------------------------------------------


def test_stop_of_a_running_task_waits_for_the_holder_and_reports_stopped(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("spin")
    wait_for(lambda: client.get(handle.task_id).status is TaskStatus.RUNNING, "the start")  # type: ignore[union-attr]
    assert handle.stop() == "stopped"
    assert client.get(handle.task_id).status is TaskStatus.STOPPED  # type: ignore[union-attr]
    with pytest.raises(TaskStopped) as caught:
        handle.wait(timeout=5)
    assert caught.value.snapshot is not None and caught.value.task_id == handle.task_id
    assert handle.stop() == "already-terminal"
    assert client.stop("never-submitted") == "no-such-task"


def test_pause_and_resume_of_a_running_task_report_their_outcomes(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("spin")
    wait_for(lambda: client.get(handle.task_id).status is TaskStatus.RUNNING, "the start")  # type: ignore[union-attr]
    assert client.pause(handle.task_id) == "paused"
    assert client.get(handle.task_id).status is TaskStatus.PAUSED  # type: ignore[union-attr]
    assert client.pause(handle.task_id) == "already-paused"
    assert client.resume(handle.task_id) == "resumed"
    assert client.resume(handle.task_id) == "not-paused"
    release.set()
    assert handle.wait(timeout=10) == "released"
    assert statuses(client, handle.task_id) == [
        "pending", "running", "paused", "running", "succeeded",
    ]  # fmt: skip


def test_control_of_a_task_nobody_holds_needs_no_worker(client: Client) -> None:
    handle = client.submit("resize", {"width": 1})
    assert client.resume(handle.task_id) == "not-paused"
    assert client.pause(handle.task_id) == "paused"
    assert client.pause(handle.task_id) == "already-paused"
    assert client.resume(handle.task_id) == "resumed"
    assert client.stop(handle.task_id) == "stopped"
    assert statuses(client, handle.task_id) == ["pending", "paused", "pending", "stopped"]
    reasons = [t.reason or "" for t in client.history(handle.task_id)][1:]
    assert all(client.name in reason for reason in reasons)
    with pytest.raises(TaskStopped):
        handle.wait(timeout=1)


def test_without_wait_a_command_is_sent_and_the_holder_applies_it(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("spin")
    wait_for(lambda: client.get(handle.task_id).status is TaskStatus.RUNNING, "the start")  # type: ignore[union-attr]
    sent = client.stop(handle.task_id, wait=False)
    assert sent.startswith("sent:cmd-")
    command = client.adapter.get_command(sent.removeprefix("sent:"))
    assert command is not None and command.kind is CommandKind.STOP
    wait_for(lambda: client.get(handle.task_id).status is TaskStatus.STOPPED, "the stop")  # type: ignore[union-attr]
    wait_for(lambda: client.adapter.get_command(command.command_id).outcome == "stopped",  # type: ignore[union-attr]
             "the outcome")  # fmt: skip


def test_a_command_nobody_answers_times_out_and_stays_queued(client: Client) -> None:
    """A task held by a worker that is gone (its lease still valid): nobody answers."""
    handle = client.submit("spin")
    pending = client.get(handle.task_id)
    assert pending is not None
    now = client.clock.now()
    client.store.save(pending.evolve(status=TaskStatus.RUNNING, status_version=2, updated_at=now),
                      expect_version=1)  # fmt: skip
    client.store.touch(handle.task_id, lease_owner="gone-worker",
                       lease_until=now + timedelta(seconds=60))  # fmt: skip
    with pytest.raises(CommandTimeout) as caught:
        client.stop(handle.task_id, timeout=0.3)
    assert "stays queued" in str(caught.value)
    queued = client.adapter.get_command(caught.value.command_id)
    assert queued is not None and queued.finished_at is None and queued.lease_until is None
    assert client.get(handle.task_id).status is TaskStatus.RUNNING  # type: ignore[union-attr]


def test_retry_gives_a_finished_task_a_new_attempt(client: Client, worker: Controller) -> None:
    handle = client.submit("boom", {"n": 2})
    with pytest.raises(TaskFailed):
        handle.wait(timeout=10)
    assert client.retry(handle.task_id) == handle
    with pytest.raises(TaskFailed):
        handle.wait(timeout=10)
    snapshot = client.get(handle.task_id)
    assert snapshot is not None and snapshot.attempt == 2
    assert statuses(client, handle.task_id) == [
        "pending", "running", "failed", "pending", "running", "failed",
    ]  # fmt: skip
    done = client.submit("resize", {"width": 1})
    done.wait(timeout=10)
    with pytest.raises(ValueError, match="succeeded"):
        client.retry(done.task_id)
    with pytest.raises(TaskNotFound):
        client.retry("never-submitted")


def test_a_lost_task_with_no_attempt_left_raises_task_lost(client: Client) -> None:
    handle = client.submit("resize", {"width": 1})
    snapshot = client.get(handle.task_id)
    assert snapshot is not None
    lost = snapshot.evolve(status=TaskStatus.LOST, status_version=2)
    client.store.save(lost, expect_version=1)
    with pytest.raises(TaskLost) as caught:
        handle.wait(timeout=5)
    assert caught.value.snapshot is not None and caught.value.snapshot.status is TaskStatus.LOST


# -- reads and plumbing ------------------------------------------------------------------------


def test_list_stats_and_history_read_the_namespace(client: Client) -> None:
    first = client.submit("resize", {"width": 1}, tags=["a"])
    client.submit("boom", None)
    assert [t.task_id for t in client.list(tag="a")] == [first.task_id]
    assert [t.task_id for t in client.list(TaskQuery(name="resize"))] == [first.task_id]
    assert len(client.list(limit=1)) == 1
    with pytest.raises(TypeError):
        client.list(TaskQuery(), name="resize")
    assert client.stats()[TaskStatus.PENDING] == 2
    assert [t.version for t in client.history(first.task_id)] == [1]


def test_the_client_uses_the_bucket_count_the_workers_recorded(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    store.pool_tick(worker="w", now=store.server_time(), lease_seconds=5, num_buckets=8,
                    wanted=[])  # fmt: skip
    with Client.from_url(redis_proc.url, namespace=namespace, app=app) as recorded:
        handles = [recorded.submit("resize", {"width": n}) for n in range(20)]
        assert {recorded.get(h.task_id).bucket for h in handles} <= set(range(8))  # type: ignore[union-attr]
    other = Client.from_url(redis_proc.url, namespace=namespace, app=app, num_buckets=16)
    with pytest.raises(ValueError, match="num_buckets=8"):
        other.submit("resize", {"width": 1})
    other.close()
    store.close()


def test_an_unreachable_redis_is_store_unavailable(fresh_redis_proc: RedisProc) -> None:
    made = Client.from_url(fresh_redis_proc.url, namespace="gone", socket_timeout=0.5,
                           socket_connect_timeout=0.5, retries=0)  # fmt: skip
    fresh_redis_proc.stop()
    with pytest.raises(StoreUnavailable):
        made.submit("anything")
    with pytest.raises(StoreUnavailable):
        made.stop("some-task")
    made.close()


def test_a_client_works_on_any_task_store() -> None:
    store = InMemoryTaskStore()
    made = Client(store, app=app)
    handle = made.submit("resize", {"width": 3})
    assert made.pause(handle.task_id) == "paused"
    assert made.stop(handle.task_id) == "stopped"
    with pytest.raises(TypeError):
        Client(object())  # type: ignore[arg-type]


def test_submit_many_keeps_the_submission_order_and_shares_a_key(client: Client) -> None:
    handles = client.submit_many("resize", [{"width": n} for n in range(30)], key="one-user",
                                 tags=["batch"], delay=60)  # fmt: skip
    listed = client.list(tag="batch")
    assert [t.task_id for t in listed] == [h.task_id for h in handles]
    assert [t.params["width"] for t in listed] == list(range(30))
    assert len({t.bucket for t in listed}) == 1 and {t.key for t in listed} == {"one-user"}
    assert all(t.not_before is not None for t in listed)


def test_registration_takes_the_bare_decorator_and_refuses_what_would_fail_later() -> None:
    import functools

    other = App("registration")

    @other.task
    def bare(ctx: TaskContext, params: Any) -> int:
        return 1

    assert isinstance(bare, TaskFunction) and set(other.types) == {"bare"}
    with pytest.raises(ValueError, match="already registered"):

        @other.task(name="bare")
        def again(ctx: TaskContext, params: Any) -> int:
            return 2

    assert other.types["bare"].fn is bare.fn  # the first one stays

    def unresolvable() -> None:
        class Local(BaseModel):
            x: int

        @other.task()
        def uses_local(ctx: TaskContext, params: Local) -> None: ...

    with pytest.raises(TypeError, match="cannot be resolved"):
        unresolvable()

    def plain_decorator(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args)

        return wrapper

    @other.task()
    @plain_decorator
    async def wrapped(ctx: TaskContext, params: Any) -> int:
        return 3

    assert other.types["wrapped"].is_async


def test_a_client_with_an_app_of_no_tasks_refuses_every_name(
    redis_proc: RedisProc, namespace: str
) -> None:
    with Client.from_url(redis_proc.url, namespace=namespace, app=App("empty")) as empty:
        with pytest.raises(UnknownTask, match="none registered"):
            empty.submit("anything")
        assert empty.list() == []


def test_a_stop_the_task_never_honours_is_answered_with_how_it_ended(
    client: Client, worker: Controller
) -> None:
    handle = client.submit("swallow_stop")
    wait_for(lambda: handle.task_id in SWALLOWING, "its function to run")
    assert handle.stop(timeout=20) == "succeeded"
    assert handle.wait(timeout=5) == "carried on"


def test_without_an_app_a_name_no_worker_runs_is_refused_once_workers_recorded_theirs(
    redis_proc: RedisProc, namespace: str, worker: Controller
) -> None:
    with Client.from_url(redis_proc.url, namespace=namespace) as bare:
        with pytest.raises(UnknownTask, match=r"'resiz'.*workers run: .*resize"):
            bare.submit("resiz", {"width": 1})
        assert bare.stats()[TaskStatus.PENDING] == 0  # nothing written
        assert bare.submit("resize", {"width": 4}).wait(timeout=10) == {"width": 8}


@app.task()
def flaky(ctx: TaskContext, params: Any) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return f"attempt {ctx.attempt}"


def test_wait_sees_through_a_retried_failure_to_the_next_attempts_result(
    redis_proc: RedisProc, namespace: str, client: Client
) -> None:
    """The failure and the retry are one write: a waiter never reads FAILED in between."""
    from chongming_redis.policy import RetryPolicy

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    written: list[TaskStatus] = []  # the state every commit of the worker leaves a task in
    commit_tasks, commit_and_start = store.commit_tasks, store.commit_and_start

    def recording(items: Any) -> Any:
        written.extend(snapshot.status for snapshot, _, _ in items)
        return commit_tasks(items)

    def recording_with_starts(items: Any, **start: Any) -> Any:  # the group committer's call
        written.extend(snapshot.status for snapshot, _, _ in items)
        return commit_and_start(items, **start)

    store.commit_tasks = recording  # type: ignore[method-assign]
    store.commit_and_start = recording_with_starts  # type: ignore[method-assign]
    retrying = Controller(store, app=app, start_poll_interval=0.05,
                          retry=RetryPolicy(max_attempts=2, base_delay=0.2, jitter=0.0,
                                            retry_on=(Exception,)))  # fmt: skip
    retrying.start()
    try:
        handles = [client.submit("flaky") for _ in range(5)]
        assert [h.wait(timeout=20) for h in handles] == ["attempt 2"] * 5
        for handle in handles:
            assert statuses(client, handle.task_id) == [
                "pending", "running", "failed", "pending", "running", "succeeded",
            ]  # fmt: skip
        assert TaskStatus.FAILED not in written and written.count(TaskStatus.SUCCEEDED) == 5
    finally:
        retrying.shutdown(grace=5)
        store.close()
