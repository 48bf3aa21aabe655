"""``PostgresTaskStore``'s nudges (``LISTEN``/``NOTIFY`` behind ``NudgeStore``), on a real
PostgreSQL: an idle worker starts a task another store object submitted although its poll is
30 s away; the work nudge is sent in the write's own transaction (heard at the commit, never for
a rolled-back one), for each write that makes a task ``PENDING`` and for no other; two schemas of
one database do not hear each other; a terminated listener connection comes back.

The contract's work-nudge test runs on this store too (tests/test_contract_postgres.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.cli.worker import UNNUDGED_POLL, polling_for
from chongming_redis.runtime.app import App
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.notify import WORK, RedisNotifier
from chongming_redis.stores._sql.pg_nudges import PgPubSub, pg_channel
from chongming_redis.stores.extensions import NudgeStore
from chongming_redis.stores.postgres import PostgresTaskStore
from tests.support.pg_schemas import SchemaPool, schema_pool

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
#: The longest any wait here takes when the nudge works; a poll would take 30 s.
BOUND = 10.0
#: How long a listener waits to conclude that nothing was sent.
QUIET = 0.3


def task(task_id: str, status: TaskStatus = TaskStatus.PENDING, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", status, 1, T0, updated_at=T0, **fields)


@pytest.fixture(scope="module")
def schemas(postgres_proc: Any) -> SchemaPool:
    return schema_pool(postgres_proc.dsn, "n_")


@pytest.fixture
def open_store(postgres_proc: Any, schemas: SchemaPool) -> Iterator[Callable[..., Any]]:
    """Opens stores in schemas of their own (``open_store()``) or in a given one."""
    opened: list[PostgresTaskStore] = []

    def open_one(schema: str | None = None, **options: Any) -> PostgresTaskStore:
        if schema is None:
            store = schemas.open(
                lambda name: PostgresTaskStore(postgres_proc.dsn, schema=name, **options)
            )
        else:
            store = PostgresTaskStore(postgres_proc.dsn, schema=schema, **options)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()
    schemas.release()


def listen(store: PostgresTaskStore, topic: str = WORK) -> PgPubSub:
    """A listener on ``store``'s ``topic`` nudges, subscribed on the server when returned."""
    listener = store.client.pubsub()
    listener.subscribe("{" + store.schema + "}:nudge:" + topic)
    return listener


def heard(listener: PgPubSub) -> int:
    """How many nudges arrived (each within ``QUIET`` of the one before)."""
    count = 0
    while listener.get_message(timeout=QUIET) is not None:
        count += 1
    return count


def test_an_idle_worker_starts_a_task_submitted_elsewhere_long_before_its_next_poll(
    open_store: Callable[..., Any],
) -> None:
    store = open_store()
    producer = PostgresTaskStore(store.dsn, schema=store.schema)  # no in-process link
    app, ran = App("nudged"), threading.Event()

    @app.task("job")
    def job(ctx: TaskContext, params: Any) -> None:
        ran.set()

    slow = ControllerConfig(start_poll_interval=30.0, command_poll_interval=30.0)
    assert polling_for(store, slow) == slow  # the CLI leaves a nudged store's polls alone
    worker = Controller(store, app=app, owner="w1", config=slow)
    worker.start()
    try:
        assert worker.notifier.wait_listening(BOUND)
        time.sleep(0.5)  # the starter's first pass is over: it waits 30 s for the next one
        submitted = Controller(producer, app=app, owner="p").submit("job", {})
        assert ran.wait(BOUND), store.get(submitted)
    finally:
        worker.shutdown(grace=2)
        producer.close()


def test_the_work_nudge_is_sent_in_the_writes_transaction(
    open_store: Callable[..., Any],
) -> None:
    store = open_store()
    listener = listen(store)
    try:
        with pytest.raises(RuntimeError), store._transaction(write=True) as tx:
            store._nudge_work(tx)
            raise RuntimeError("roll back")
        assert heard(listener) == 0  # rolled back: never delivered
        with store._transaction(write=True) as tx:
            store._nudge_work(tx)
            assert heard(listener) == 0  # not before the commit
        assert heard(listener) == 1
    finally:
        listener.close()


def test_writes_that_make_a_task_pending_nudge_and_no_others(
    open_store: Callable[..., Any],
) -> None:
    store = open_store()
    listener = listen(store)
    try:
        store.create(task("a"))
        assert heard(listener) == 1
        store.create(task("w", TaskStatus.WAITING, parents=("a",)))
        assert heard(listener) == 0  # waiting is not work
        running = task("a", TaskStatus.RUNNING).evolve(status_version=2)
        store.save(running, expect_version=1)
        assert heard(listener) == 0
        retried = running.evolve(status=TaskStatus.PENDING, status_version=3)
        store.save(retried, expect_version=2)  # a retry: pending again
        assert heard(listener) == 1
        store.save(retried.evolve(status_version=4, priority=5), expect_version=3)
        assert heard(listener) == 0  # pending before and after
        done = retried.evolve(status=TaskStatus.SUCCEEDED, status_version=5)
        store.save(done, expect_version=4)  # releases "w" in the same write
        assert heard(listener) == 1
        released = store.get("w")
        assert released is not None and released.status is TaskStatus.PENDING
        store.commit_tasks([(task("b"), None, []), (task("c"), None, [])])
        assert heard(listener) == 1  # one transaction, one nudge
    finally:
        listener.close()


def test_two_schemas_of_one_database_do_not_wake_each_other(
    open_store: Callable[..., Any],
) -> None:
    mine, other = open_store(), open_store()
    assert pg_channel("{" + mine.schema + "}:nudge:work") != pg_channel(
        "{" + other.schema + "}:nudge:work"
    )
    listener = listen(mine)
    try:
        other.create(task("elsewhere"))
        other.client.publish("{" + other.schema + "}:nudge:work")
        assert heard(listener) == 0
        mine.create(task("here"))
        assert heard(listener) == 1
    finally:
        listener.close()


def test_a_long_owner_topic_is_a_valid_channel_and_reaches_its_listener(
    open_store: Callable[..., Any],
) -> None:
    store = open_store()
    owner = "worker-" + "é" * 80 + '"; DROP TABLE tasks; --'  # over 63 bytes, quotes
    name = pg_channel("{" + store.schema + "}:nudge:" + owner)
    assert len(name.encode()) <= 63 and name.isascii()
    listener = listen(store, owner)
    try:
        RedisNotifier(store.client, store.namespace).publish(owner)
        message = listener.get_message(timeout=BOUND)
        assert message is not None
        assert message["channel"] == ("{" + store.schema + "}:nudge:" + owner).encode()
        assert store.get("x") is None  # the table is still there
    finally:
        listener.close()


def test_the_listener_comes_back_after_its_connection_is_terminated(
    open_store: Callable[..., Any], postgres_proc: Any
) -> None:
    store = open_store()
    notifier, woken = RedisNotifier(store.client, store.namespace), threading.Event()
    notifier.subscribe(WORK, woken)
    statement = f'LISTEN "{pg_channel("{" + store.schema + "}:nudge:work")}"'
    try:
        assert notifier.wait_listening(BOUND)
        with psycopg.connect(postgres_proc.dsn, autocommit=True) as admin:
            (first,) = _listeners(admin, statement)
            admin.execute("SELECT pg_terminate_backend(%s)", [first])
            deadline = time.monotonic() + BOUND
            while time.monotonic() < deadline and _listeners(admin, statement) in ([], [first]):
                time.sleep(0.05)
            (second,) = _listeners(admin, statement)
        assert second != first
        store.create(task("after"))
        assert woken.wait(BOUND)
    finally:
        notifier.close()


def _listeners(admin: psycopg.Connection[Any], statement: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid()",
        [statement],
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def test_nudges_off_sends_nothing_and_the_runtime_polls(open_store: Callable[..., Any]) -> None:
    store = open_store()
    quiet = open_store(store.schema, nudges=False)
    assert isinstance(quiet, NudgeStore) and quiet.namespace == ""
    assert not quiet.publishes_work
    slow = ControllerConfig(start_poll_interval=30.0, command_poll_interval=30.0)
    polled = polling_for(quiet, slow)
    assert (polled.start_poll_interval, polled.command_poll_interval) == (UNNUDGED_POLL,) * 2
    listener = listen(store)
    try:
        quiet.create(task("silent"))
        assert heard(listener) == 0
        store.create(task("loud"))
        assert heard(listener) == 1
    finally:
        listener.close()
    with pytest.raises(TypeError, match="nudges must be a bool"):
        PostgresTaskStore(store.dsn, schema=f"x_{uuid.uuid4().hex[:8]}", nudges="yes")  # type: ignore[arg-type]
