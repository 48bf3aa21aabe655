"""``query.lua`` merges every composite index key an unfiltered (or status-only, or bucket-
only) query allows — statuses x buckets x names, hundreds of keys — as a k-way merge read in
chunks: a page of 50 is one script call and agrees, task for task and in order, with the
in-memory store, at any depth, both directions, ties on ``created_at`` included. (A merge that
trusted only its first chunk per key took one call per task on such a query: 950 ms for 50 of
20,000 tasks.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.contract.support import CORE_STATUSES
from tests.support.redis_server import RedisProc
from tests.test_redis_dashboard_reads import requests_during as round_trips

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
STATUSES = list(CORE_STATUSES)  # a WAITING task needs parents (the contract queries them)
NAMES = ("a", "b", "c", "d")


def task(i: int) -> TaskSnapshot:
    at = BASE + timedelta(milliseconds=(i * 7919) % 1500)  # shuffled, with ties
    return TaskSnapshot(task_id=f"t{i:05d}", name=NAMES[i % 4], status=STATUSES[i % 7],
                        status_version=1, created_at=at, updated_at=at, bucket=i % 16)  # fmt: skip


@pytest.fixture(scope="module")
def stores(redis_proc: RedisProc) -> Iterator[tuple[RedisTaskStore, InMemoryTaskStore]]:
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace="merge-test")
    memory = InMemoryTaskStore()
    for start in range(0, 3000, 100):
        items = [(task(i), None, ()) for i in range(start, start + 100)]
        assert not any(redis_store.commit_tasks(items))
        for snap, _, _ in items:
            memory.create(snap)
    yield redis_store, memory
    redis_store.drop_namespace()
    redis_store.close()


QUERIES = [
    TaskQuery(limit=50),
    TaskQuery(limit=50, newest_first=True),
    TaskQuery(statuses=frozenset({TaskStatus.RUNNING, TaskStatus.LOST}), limit=75),
    TaskQuery(buckets=frozenset({3, 11}), limit=40, newest_first=True),
    TaskQuery(name_prefix="b", limit=33),
    TaskQuery(),  # everything: 3,000 tasks over 448 keys
]


@pytest.mark.parametrize("query", QUERIES)
def test_many_key_queries_equal_the_memory_store(
    stores: tuple[RedisTaskStore, InMemoryTaskStore], query: TaskQuery
) -> None:
    redis_store, memory = stores
    assert [t.task_id for t in redis_store.query(query)] == [t.task_id for t in memory.query(query)]


@pytest.mark.parametrize("newest_first", [False, True])
def test_keyset_pages_through_448_keys_equal_the_memory_store(
    stores: tuple[RedisTaskStore, InMemoryTaskStore], newest_first: bool
) -> None:
    redis_store, memory = stores
    query = TaskQuery(limit=97, newest_first=newest_first)
    after = None
    walked: list[str] = []
    while True:
        page = redis_store.query_page(query, after=after)
        assert [t.task_id for t in page] == [
            t.task_id for t in memory.query_page(query, after=after)
        ]
        if not page:
            break
        walked += [t.task_id for t in page]
        after = (page[-1].created_at, page[-1].task_id)
    assert len(walked) == len(set(walked)) == 3000


def test_a_page_of_fifty_over_448_keys_is_one_round_trip(
    stores: tuple[RedisTaskStore, InMemoryTaskStore],
) -> None:
    redis_store, _ = stores
    middle = redis_store.query(TaskQuery(limit=1500))[-1]
    for query, after in ((TaskQuery(limit=50), None),
                         (TaskQuery(limit=50, newest_first=True), None),
                         (TaskQuery(limit=50), (middle.created_at, middle.task_id))):  # fmt: skip
        assert round_trips(lambda q=query, a=after: redis_store.query_page(q, after=a)) == 1
