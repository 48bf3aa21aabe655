"""The Redis store's start queues (``lua/lib/indexes.lua``, ``lua/start_tasks.lua``) beyond the
shipped contract: a namespace written before them is upgraded whole, even when tasks leave the
index while it walks; entries left by an older version never block or break a start."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores._redis import worker_ops
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
P, R = TaskStatus.PENDING, TaskStatus.RUNNING


def task(task_id: str, created: float = 0.0, **fields: Any) -> TaskSnapshot:
    at = T0 + timedelta(seconds=created)
    return TaskSnapshot(task_id, fields.pop("name", "job"), P, 1, at, at, **fields)


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    opened = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield opened
    opened.close()


def as_written_before_the_queues(client: redis.Redis, store: RedisTaskStore) -> None:
    """Drop the start queues, their heads and the upgrade flag: the layout of before."""
    root = store.keys.root
    for kind in ("rq", "dq", "rh", "dh"):
        for key in client.scan_iter(match=f"{{{store.keys.namespace}}}:{kind}:*"):
            client.delete(key)
    client.hdel(root + "meta", "so")


def start(store: RedisTaskStore, limit: int = 100, **options: Any) -> list[str]:
    args: dict[str, Any] = {"owner": "w", "now": T0 + timedelta(hours=1),
                            "lease_until": T0 + timedelta(hours=2),
                            "buckets": list(range(4))}  # fmt: skip
    return [s.task_id for s in store.start_tasks(limit=limit, **{**args, **options})]


def test_a_namespace_written_before_the_queues_is_upgraded_once_whole(
    store: RedisTaskStore, redis_proc: RedisProc
) -> None:
    client = redis_proc.client()
    for i in range(6):
        store.create(task(f"p{i}", created=i, bucket=i % 2, name=("a", "b")[i % 3 == 0],
                          priority=i % 2))  # fmt: skip
    store.create(task("later", not_before=T0 + timedelta(days=1)))
    as_written_before_the_queues(client, store)
    fresh = RedisTaskStore.from_url(redis_proc.url, namespace=store.keys.namespace)
    assert fresh.prepare_start_order() == 7  # every PENDING index entry looked at
    assert client.hget(store.keys.root + "meta", "so") == b"1"
    assert fresh.prepare_start_order() == 0  # once per store, then a flag
    assert start(fresh) == ["p1", "p3", "p5", "p0", "p2", "p4"]  # the reference order
    assert start(fresh, now=T0 + timedelta(days=2)) == ["later"]
    fresh.close()


def test_tasks_that_leave_the_index_while_the_upgrade_walks_do_not_hide_others(
    store: RedisTaskStore, redis_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices of two entries; after the first, two tasks of it are stopped (they leave the
    pending index, shifting the rest): the count check sees the gap and the walk runs again."""
    client = redis_proc.client()
    for i in range(6):
        store.create(task(f"p{i}", created=i))
    as_written_before_the_queues(client, store)
    monkeypatch.setattr(worker_ops, "UPGRADE_SLICE", 2)
    fresh = RedisTaskStore.from_url(redis_proc.url, namespace=store.keys.namespace)
    real = fresh._request
    calls = {"n": 0}

    def request(req: Any) -> Any:
        reply = real(req)
        if getattr(req, "name", "") == "upgrade_start_order":
            calls["n"] += 1
            if calls["n"] == 1:  # another client stops p0 and p1 between two slices
                for stopped in ("p0", "p1"):
                    old = store.get(stopped)
                    assert old is not None
                    store.save(old.evolve(status=TaskStatus.STOPPED, status_version=2),
                               expect_version=1)  # fmt: skip
        return reply

    monkeypatch.setattr(fresh, "_request", request)
    fresh.prepare_start_order()
    assert calls["n"] > 3, "walked again after the count check"
    assert start(fresh) == ["p2", "p3", "p4", "p5"]
    fresh.close()


def test_entries_left_by_an_older_version_are_dropped_and_never_block_a_start(
    store: RedisTaskStore, redis_proc: RedisProc
) -> None:
    """An older store version starts tasks without removing their queue entries: the entries
    of two started high-priority tasks must not keep later tasks from starting, one at a time."""
    client = redis_proc.client()
    store.create(task("hi0", priority=5))
    store.create(task("hi1", created=1, priority=5))
    store.prepare_start_order()
    queue = store.keys.root + "rq:0:job"
    scores = {m: client.zscore(queue, m) for m in (b"hi0", b"hi1")}
    assert start(store) == ["hi0", "hi1"]
    client.zadd(queue, {m.decode(): s for m, s in scores.items() if s is not None})  # left behind
    client.zadd(store.keys.root + "rh:job", {"0": min(s for s in scores.values() if s)})
    for i in range(3):
        store.create(task(f"lo{i}", created=10 + i))
    assert [start(store, limit=1) for _ in range(4)] == [["lo0"], ["lo1"], ["lo2"], []]
    assert client.zcard(queue) == 0, "the stale entries were dropped"
    stale = store.keys.root + "dq:0:job"
    client.zadd(stale, {"hi0": 1})  # a delayed entry of a task that is RUNNING now
    client.zadd(store.keys.root + "dh:job", {"0": 1})
    assert start(store, names=["job"]) == [] and client.zcard(stale) == 0
