"""Schedules end to end in one process: ``client.schedules`` (upsert, get, list, pause, resume,
trigger, delete) on the in-memory store and a real redis-server, the refusals that store
nothing, ``App.schedule`` registered when a worker starts, and workers firing each tick once
(two of them sharing the buckets of one namespace)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import pytest
from pydantic import BaseModel

from chongming_redis import Client, Controller, Schedule, ScheduleNotFound
from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.runtime.app import App, InvalidParams, UnknownTask
from chongming_redis.schedules import Overlap, ScheduleError
from chongming_redis.stores.redis import RedisTaskStore
from tests.json_file_store import JsonFileTaskStore
from tests.support.redis_server import RedisProc


class Report(BaseModel):
    day: int = 1


def make_app() -> App:
    app = App()

    @app.task(params=Report)
    def report(ctx: Any, params: Report) -> int:
        return params.day

    @app.task
    def echo(ctx: Any, params: Any) -> Any:
        return params

    return app


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_client_stores_pauses_triggers_and_deletes_a_schedule(
    memory_or_redis_store: Any,
) -> None:
    client = Client(memory_or_redis_store, app=make_app())
    schedules = client.schedules
    assert schedules.list() == [] and schedules.get("nightly") is None
    nightly = Schedule("nightly", "report", {"day": 3}, cron="30 2 * * *", tz="Europe/Berlin")
    stored = schedules.upsert(nightly)
    assert stored.version == 1 and stored.schedule == nightly and not stored.state.paused
    assert stored.state.next_tick > datetime.now(timezone.utc)
    assert schedules.upsert(nightly).version == 1  # the same definition writes nothing
    assert schedules.get("nightly") == stored
    changed = schedules.upsert(Schedule("nightly", "report", {"day": 4}, cron="30 2 * * *",
                                        tz="Europe/Berlin"))  # fmt: skip
    assert changed.version == 2 and changed.state.next_tick == stored.state.next_tick
    schedules.upsert(Schedule("sync", "echo", every=300, overlap=Overlap.ALLOW))
    assert [s.schedule.id for s in schedules.list()] == ["nightly", "sync"]

    paused = schedules.pause("nightly")
    assert paused.state.paused and paused.version == 3
    assert schedules.pause("nightly").version == 3  # already paused: nothing written
    handle = schedules.trigger("nightly")  # fires paused or not
    assert handle.task_id.startswith("nightly@") and handle.task_id.endswith(".trigger")
    task = handle.get()
    assert task is not None and task.status is TaskStatus.PENDING and task.params == {"day": 4}
    assert task.tags == frozenset({"schedule:nightly"})
    assert handle.history()[0].reason.startswith("submitted by schedule nightly")
    after = schedules.get("nightly")
    assert after is not None and after.state.counts["triggered"] == 1
    assert after.state.last_task == handle.task_id
    resumed = schedules.resume("nightly")
    assert not resumed.state.paused and resumed.state.next_tick > datetime.now(timezone.utc)

    assert schedules.delete("nightly") is True and schedules.delete("nightly") is False
    assert [s.schedule.id for s in schedules.list()] == ["sync"]
    assert client.get(handle.task_id) is not None  # its tasks stay
    for call in (schedules.pause, schedules.resume, schedules.trigger):
        with pytest.raises(ScheduleNotFound, match="nightly"):
            call("nightly")


def test_a_schedule_no_tick_could_fire_is_refused_and_nothing_is_stored(
    memory_or_redis_store: Any,
) -> None:
    client = Client(memory_or_redis_store, app=make_app())
    with pytest.raises(UnknownTask, match="nope"):
        client.schedules.upsert(Schedule("s", "nope", every=60))
    with pytest.raises(InvalidParams):
        client.schedules.upsert(Schedule("s", "report", {"day": "not a day"}, every=60))
    with pytest.raises(TypeError, match="Schedule"):
        client.schedules.upsert({"id": "s"})  # type: ignore[arg-type]
    for bad in (dict(cron="61 * * * *"), dict(every=0), dict(cron="* * * * *", every=5),
                dict(), dict(every=5, tz="Mars/Olympus")):  # fmt: skip
        with pytest.raises(ScheduleError):
            Schedule("s", "echo", **bad)  # type: ignore[arg-type]
    assert client.schedules.list() == []
    assert client.list() == []  # no task either


def test_a_store_without_schedules_says_so(tmp_path: Any) -> None:
    store = JsonFileTaskStore(tmp_path / "tasks.json")
    with pytest.raises(TypeError, match="keeps no schedules"):
        Client(store).schedules.list()
    app = make_app()
    app.schedule(Schedule("sync", "echo", every=60))
    with pytest.raises(TypeError, match="keeps no schedules"):
        Controller(store, app=app).start()


def test_a_worker_refuses_to_start_with_a_schedule_of_a_type_it_does_not_run(
    memory_or_redis_store: Any,
) -> None:
    app = make_app()
    app.schedule(Schedule("sync", "elsewhere", every=60))
    controller = Controller(memory_or_redis_store, app=app)
    with pytest.raises(UnknownTask, match="elsewhere"):
        controller.start()
    assert Client(memory_or_redis_store).schedules.list() == []


def test_app_schedule_refuses_a_second_different_definition() -> None:
    app = make_app()
    app.schedule(Schedule("sync", "echo", every=60))
    app.schedule(Schedule("sync", "echo", every=60))  # the same again: fine
    with pytest.raises(ValueError, match="registered twice"):
        app.schedule(Schedule("sync", "echo", every=30))
    with pytest.raises(TypeError):
        app.schedule("sync")  # type: ignore[arg-type]


def test_two_workers_sharing_a_namespace_fire_each_tick_once(
    redis_proc: RedisProc, namespace: str
) -> None:
    controllers = []
    for n in range(2):
        app = make_app()
        # ALLOW: a tick is never skipped because the last one's task is still running
        app.schedule(Schedule("every-second", "echo", {"n": 1}, every=1, overlap=Overlap.ALLOW))
        store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        controller = Controller(store, app=app, owner=f"w{n}", schedule_poll_interval=0.1)
        controller.join_pool(worker_lease=3.0)
        controllers.append(controller)
    for controller in controllers:
        controller.start()
    client = Client(RedisTaskStore.from_url(redis_proc.url, namespace=namespace))
    try:
        wait_for("five ticks fired", lambda: len(client.list(name="echo")) >= 5)
    finally:
        for controller in controllers:
            controller.shutdown(5)
    tasks = client.list(TaskQuery(name="echo"))
    ticks = sorted(t.task_id.split("@")[1] for t in tasks)
    assert len(ticks) == len(set(ticks))  # ids are unique anyway: the counts must agree too
    stored = client.schedules.get("every-second")
    assert stored is not None
    counts = stored.state.counts
    assert counts["fired"] == len(tasks) and counts["skipped"] == 0, counts
    # Each tick since the first decided once: fired, or (a firing thread starved for over a
    # second on a loaded machine) missed, never both, never forgotten.
    elapsed = (stored.state.next_tick - stored.state.first_tick).total_seconds()
    assert counts["fired"] + counts["missed"] == int(elapsed), counts
    seconds = [datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ") for t in ticks]
    assert all((b - a).total_seconds() >= 1 for a, b in pairwise(seconds))
    for task in tasks:  # never before its time: created at or after its tick
        tick = datetime.strptime(task.task_id.split("@")[1], "%Y-%m-%dT%H:%M:%SZ")
        assert task.created_at >= tick.replace(tzinfo=timezone.utc)


def test_a_tick_whose_task_cannot_be_made_is_skipped_once_and_the_others_fire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.scheduling import TaskMaker, fire_due, read
    from chongming_redis.stores.memory import InMemoryTaskStore

    store = InMemoryTaskStore()
    client = Client(store)  # no app: the parameters are stored as given
    client.schedules.upsert(Schedule("broken", "report", {"day": "not a day"}, every=1))
    client.schedules.upsert(Schedule("fine", "echo", every=1))
    maker = TaskMaker(make_app(), BucketPolicy(), "w")  # this worker's report refuses them
    moment = datetime.now(timezone.utc) + timedelta(seconds=2)
    later = lambda: moment  # noqa: E731  (one instant: the second pass finds nothing due)
    assert fire_due(store, later, maker, owned=lambda sid: True) == 1
    broken, fine = read(store, "broken"), read(store, "fine")
    assert broken is not None and fine is not None
    assert broken.state.counts["skipped"] == 1 and broken.state.counts["fired"] == 0
    assert broken.state.recent[-1].outcome == "skipped" and broken.state.last_task is None
    assert fine.state.counts["fired"] == 1
    assert [t.name for t in store.query()] == ["echo"]
    assert "tick" in caplog.text and "not fired" in caplog.text
    assert fire_due(store, later, maker, owned=lambda sid: True) == 0  # decided: not again
