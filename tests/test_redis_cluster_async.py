"""``AsyncRedisTaskStore`` and ``AsyncClient`` on a real Redis Cluster (``cluster=True``): the
producer's calls through ``redis.asyncio``'s cluster client, a worker on the sync cluster store
running what they submit, and the cluster's refusals (unreachable, a plain server, a slot
left half-migrated, a master without the scripts) as the sync store reports them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from redis.cluster import RedisCluster

from chongming_redis.client.client_async import AsyncClient
from chongming_redis.embedded.redis_cluster import RedisClusterProcs
from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.model import Command, CommandKind, TaskSnapshot, TaskStatus
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores._redis import cluster as cluster_calls
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from tests.support.redis_server import RedisProc, free_port
from tests.test_client_async import app

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def task(task_id: str) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", TaskStatus.PENDING, 1, T0, T0)


@pytest.fixture
def sync_store(redis_cluster: RedisClusterProcs, namespace: str) -> Iterator[RedisTaskStore]:
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                    check_server=False)  # fmt: skip
    yield store
    store.drop_namespace()
    store.close()


def test_the_async_store_calls_on_a_cluster(
    redis_cluster: RedisClusterProcs, namespace: str, sync_store: RedisTaskStore
) -> None:
    async def main() -> None:
        store = AsyncRedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
        try:
            assert await store.commit_tasks([(task("a"), None, [])]) == [None]
            assert await store.get("a") == task("a")
            assert [t.task_id for t in await store.query()] == ["a"]
            assert (await store.counts())[TaskStatus.PENDING] == 1
            command = Command("c1", "a", CommandKind.STOP, T0)
            await store.submit_command(command)
            assert await store.get_command("c1") == command
            assert abs((await store.server_time() - datetime.now(UTC)).total_seconds()) < 5
            assert await store.recorded_num_buckets() is None
            await store.publish("work")  # fire and forget: no error on a cluster
        finally:
            await store.aclose()

    asyncio.run(main())
    assert sync_store.get("a") == task("a")  # the same keys as the sync store's


def test_async_client_submits_and_a_cluster_worker_runs_it(
    redis_cluster: RedisClusterProcs, namespace: str, sync_store: RedisTaskStore
) -> None:
    worker = Controller(RedisTaskStore.from_url(redis_cluster.url, namespace=namespace,
                                                cluster=True, check_server=False),
                        app=app, concurrency=2, start_poll_interval=0.2)  # fmt: skip
    worker.start()
    try:

        async def main() -> object:
            made = AsyncClient.from_url(redis_cluster.url, namespace=namespace, app=app,
                                        cluster=True)  # fmt: skip
            async with made as client:
                handle = await client.submit("resize", {"width": 21})
                await handle.wait(timeout=30)
                return await handle.result()

        assert asyncio.run(main()) == {"width": 42}
    finally:
        worker.shutdown(grace=5)
        worker.store.close()


def test_the_async_store_refusals_on_a_cluster(redis_proc: RedisProc, namespace: str) -> None:
    async def first_call(url: str, **options: object) -> None:
        store = AsyncRedisTaskStore.from_url(url, namespace=namespace, cluster=True, **options)  # type: ignore[arg-type]
        try:
            await store.counts()
        finally:
            await store.aclose()

    with pytest.raises(StoreUnavailable, match="Redis Cluster is unreachable"):
        asyncio.run(first_call(f"redis://127.0.0.1:{free_port()}/0"))
    with pytest.raises(StoreError, match="not a Redis Cluster node"):
        asyncio.run(first_call(redis_proc.url))
    with pytest.raises(ValueError, match="durability_replicas must be 0 or more"):
        AsyncRedisTaskStore.from_url(redis_proc.url, namespace=namespace, cluster=True,
                                 durability_replicas=-1)  # fmt: skip
    with pytest.raises(ValueError, match="bad Redis URL"):
        AsyncRedisTaskStore.from_url("unix:///tmp/x.sock", namespace=namespace, cluster=True)


def test_the_async_store_reloads_scripts_and_waits_out_a_migration(
    redis_cluster: RedisClusterProcs, namespace: str, sync_store: RedisTaskStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    sync_store.create(task("a"))
    slot = redis_cluster.keyslot(sync_store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    monkeypatch.setattr(cluster_calls, "MIGRATION_WAIT", 0.3)

    async def main() -> None:
        store = AsyncRedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
        try:
            with redis_cluster.client(source.port) as node:
                node.script_flush()
            assert [t.task_id for t in await store.query()] == ["a"]  # NOSCRIPT: loaded
            with redis_cluster.client(source.port) as src, redis_cluster.client(target.port) as dst:
                dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)  # type: ignore[no-untyped-call]
                src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)  # type: ignore[no-untyped-call]
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS",
                                    sync_store.keys.task("a"))  # type: ignore[no-untyped-call]  # fmt: skip
                with pytest.raises(StoreUnavailable, match="cannot serve the namespace now"):
                    await store.commit_tasks([(task("b"), None, [])])
                assert await store.get("a") == task("a")  # moved: read on the target (ASK)
            redis_cluster.move_slot(slot, target.port)  # the rest, then the owner
            assert await store.commit_tasks([(task("b"), None, [])]) == [None]
            assert sorted(t.task_id for t in await store.query()) == ["a", "b"]
        finally:
            await store.aclose()

    asyncio.run(main())
    cluster = RedisCluster.from_url(redis_cluster.url)
    try:
        assert cluster.get_node_from_key(sync_store.keys.root).port == target.port
    finally:
        cluster.close()
