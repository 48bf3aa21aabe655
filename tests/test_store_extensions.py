"""Runtime extensions beyond the 14-method protocol, on both built-in stores:
``touch_fenced`` (the zombie guard of RELIABILITY fact 6), ``server_time`` and
``bucket_counts``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_redis import InMemoryTaskStore, Progress, TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, namespace: str) -> Iterator[object]:
    if request.param == "memory":
        yield InMemoryTaskStore()
        return
    server: RedisProc = request.getfixturevalue("redis_proc")
    redis_store = RedisTaskStore.from_url(server.url, namespace=namespace)
    yield redis_store
    redis_store.close()


def task(
    task_id: str = "t", status: TaskStatus = TaskStatus.RUNNING, **fields: object
) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", status, 3, T0, T0, **fields)  # type: ignore[arg-type]


def test_a_fenced_touch_applies_while_the_version_matches_and_never_bumps_it(store) -> None:  # type: ignore[no-untyped-def]
    store.create(task())
    until = T0 + timedelta(seconds=30)
    assert store.touch_fenced("t", expect_version=3, lease_owner="w1", lease_until=until)
    assert store.touch_fenced("t", expect_version=3, progress=Progress(1, 2), heartbeat_at=T0)
    got = store.get("t")
    assert (got.status_version, got.lease_owner, got.lease_until) == (3, "w1", until)
    assert got.progress == Progress(1, 2) and got.heartbeat_at == T0


def test_a_fenced_touch_from_a_holder_that_lost_the_task_writes_nothing(store) -> None:  # type: ignore[no-untyped-def]
    store.create(task())
    store.touch("t", lease_owner="old", lease_until=T0)
    taken = dataclasses.replace(task(), status=TaskStatus.LOST, status_version=4)
    store.save(taken, expect_version=3)  # someone else moved the task on
    store.touch("t", lease_owner="new", lease_until=T0 + timedelta(hours=1))
    before = store.get("t")

    assert not store.touch_fenced("t", expect_version=3, lease_owner="old", lease_until=T0)
    assert not store.touch_fenced("t", expect_version=3, progress=Progress(9))

    assert store.get("t") == before


def test_a_fenced_touch_of_a_missing_task_is_false_and_creates_nothing(store) -> None:  # type: ignore[no-untyped-def]
    assert not store.touch_fenced("nope", expect_version=1, heartbeat_at=T0)
    assert store.get("nope") is None


def test_server_time_is_an_aware_utc_now(store) -> None:  # type: ignore[no-untyped-def]
    moment = store.server_time()
    assert moment.tzinfo == timezone.utc
    assert abs((moment - datetime.now(timezone.utc)).total_seconds()) < 60


def test_bucket_counts_follow_creates_and_saves(store) -> None:  # type: ignore[no-untyped-def]
    store.create(task("a", bucket=1))
    store.create(task("b", bucket=1, status=TaskStatus.PENDING))
    store.create(task("c", bucket=7))
    store.save(dataclasses.replace(task("c", bucket=7), status=TaskStatus.SUCCEEDED,
                                   status_version=4), expect_version=3)  # fmt: skip
    counts = store.bucket_counts()
    assert counts[1][TaskStatus.RUNNING] == 1 and counts[1][TaskStatus.PENDING] == 1
    assert counts[7][TaskStatus.SUCCEEDED] == 1 and counts[7][TaskStatus.RUNNING] == 0


def test_commit_tasks_creates_a_task_with_its_first_history_entry(
    redis_proc: RedisProc, namespace: str
) -> None:
    from chongming_redis import TaskAlreadyExists, Transition

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    fresh = task("new", status=TaskStatus.PENDING)
    entry = Transition("new", 3, None, TaskStatus.PENDING, T0, "submitted")
    assert store.commit_tasks([(fresh, None, [entry])]) == [None]
    assert store.get("new") == fresh
    assert store.history("new") == [entry]
    assert store.counts()[TaskStatus.PENDING] == 1

    (error,) = store.commit_tasks([(task("new", bucket=5), None, [])])
    assert isinstance(error, TaskAlreadyExists)
    assert store.get("new") == fresh, "an existing task is never overwritten"


def test_submit_many_creates_every_task_with_its_history_in_few_round_trips(
    redis_proc: RedisProc, namespace: str
) -> None:
    from chongming_redis.runtime.app import App, UnknownTask
    from chongming_redis.runtime.controller import Controller

    app = App("batch")

    @app.task()
    def noop(ctx, params):  # type: ignore[no-untyped-def]
        return None

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = Controller(store, app=app, owner="submitter")
    ids = client.submit_many("noop", [{"i": i} for i in range(250)])
    assert len(set(ids)) == 250
    assert store.counts()[TaskStatus.PENDING] == 250
    assert [h.to_status for h in store.history(ids[-1])] == [TaskStatus.PENDING]
    with pytest.raises(UnknownTask):
        client.submit_many("nope", [{}])
    assert store.counts()[TaskStatus.PENDING] == 250
