"""A task's limit refs (``TaskSnapshot.limits``) are kept by every built-in store (in-memory,
Redis, Redis Cluster, SQLite, PostgreSQL) through each write and read path: create, save,
``commit_tasks``, ``start_tasks``, ``get``, ``query``; none stays none, and a stored refs value
another client broke is ``CorruptRecord``, never a task without its limits."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chongming_redis import InMemoryTaskStore, TaskQuery, TaskSnapshot
from chongming_redis.errors import CorruptRecord
from chongming_redis.testing.contract.support import PENDING, RUNNING, at
from chongming_redis.testing.extensions.policy_support import entry
from tests.support.store_targets import WITH_CLUSTER, store_target

REFS = ("export.concurrency=customer:42/ü {x}*", "payments", "k=é=2")


@pytest.fixture(params=("memory", *WITH_CLUSTER))
def store(request: pytest.FixtureRequest, tmp_path: Path, namespace: str) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryTaskStore()
        return
    for target in store_target(request, request.param, tmp_path, namespace):
        opened = target.open()
        try:
            yield opened
        finally:
            opened.close()


def task(task_id: str, *, status: Any = PENDING, version: int = 1, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id=task_id, name="export", status=status, status_version=version,
                        created_at=at(0), updated_at=at(0), bucket=0, **fields)  # fmt: skip


def test_limit_refs_round_trip_through_every_write_and_read(store: Any) -> None:
    limited, bare = task("limited", limits=REFS), task("bare")
    store.create(limited)
    store.create(bare)
    assert store.get("limited") == limited and store.get("limited").limits == REFS
    assert store.get("bare").limits == ()
    assert {s.task_id: s.limits for s in store.query()} == {"limited": REFS, "bare": ()}
    cleared = replace(limited, status_version=2, limits=(), updated_at=at(1))
    store.save(cleared, expect_version=1)
    assert store.get("limited") == cleared
    filled = replace(bare, status_version=2, limits=("one",), updated_at=at(1))
    store.save(filled, expect_version=1)
    assert store.get("bare") == filled
    created = task("made", limits=("a=1", "b"))
    assert store.commit_tasks([(created, None, [entry("made", 1)])]) == [None]
    assert store.get("made") == created
    (started,) = store.start_tasks(owner="w1", now=at(100), lease_until=at(130), buckets=[0],
                                   names=["export"], limit=1)  # fmt: skip
    assert started.status == RUNNING and started.limits == store.get(started.task_id).limits
    assert [s.limits for s in store.query(TaskQuery(statuses=frozenset({RUNNING})))] == [
        started.limits
    ]


def test_a_broken_refs_value_is_corrupt_not_a_task_without_limits(
    redis_proc: Any, namespace: str
) -> None:
    from chongming_redis.stores.redis import RedisTaskStore

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    try:
        store.create(task("t", limits=("a",)))
        for bad in (b"not json", b'"a"', b'["a", "a"]', b'["=x"]', b"[1]"):
            store.client.hset(f"{{{namespace}}}:t:t", "lm", bad)
            with pytest.raises(CorruptRecord):
                store.get("t")
    finally:
        store.close()
