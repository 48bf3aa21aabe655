"""The bytes a finished task costs in Redis, pinned where the layout saves them: no ``g`` field
for a task without tags, 8-character write tokens, and data in the older shape still read."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from chongming_redis import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def task(task_id: str, **fields: object) -> TaskSnapshot:
    base: dict[str, object] = {"name": "job", "status": TaskStatus.PENDING, "status_version": 1,
                               "created_at": T0, "updated_at": T0}  # fmt: skip
    base.update(fields)
    return TaskSnapshot(task_id, **base)  # type: ignore[arg-type]


# -- the task hash ------------------------------------------------------------------------------


def test_a_task_without_tags_has_no_tags_field_and_a_save_to_no_tags_removes_it(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    k = store.keys
    store.create(task("bare"))
    store.create(task("tagged", tags=frozenset({"a"})))
    assert not client.hexists(k.task("bare"), "g")
    assert client.hget(k.task("tagged"), "g") == b'["a"]'
    untagged = dataclasses.replace(task("tagged"), status=TaskStatus.RUNNING, status_version=2)
    store.save(untagged, expect_version=1)
    assert not client.hexists(k.task("tagged"), "g")
    assert store.get("tagged") == untagged
    assert store.query(TaskQuery(tag="a")) == [] and client.exists(k.tag("a")) == 0
    assert store.get("bare") == task("bare")


def test_a_stored_empty_tags_field_is_still_read_indexed_and_saved_over(
    redis_proc: RedisProc, namespace: str
) -> None:
    """Tasks written before the field was left out carry ``g = []``."""
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    store.create(task("old", status=TaskStatus.SUCCEEDED))
    client.hset(store.keys.task("old"), "g", "[]")
    assert store.get("old") == task("old", status=TaskStatus.SUCCEEDED)
    assert [s.task_id for s in store.query(TaskQuery(statuses=frozenset({TaskStatus.SUCCEEDED})))
            ] == ["old"]  # fmt: skip
    store.save(task("old", status=TaskStatus.FAILED, status_version=2), expect_version=1)
    assert not client.hexists(store.keys.task("old"), "g")
    assert store.counts()[TaskStatus.FAILED] == 1 and store.counts()[TaskStatus.SUCCEEDED] == 0
    assert store.prune(keep_terminal=0) == 1


def test_write_tokens_are_eight_characters_and_retry_memos_keep_twelve(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    store.create(task("t"))
    created = client.hget(store.keys.task("t"), "w")
    store.save(task("t", status_version=2), expect_version=1)
    saved = client.hget(store.keys.task("t"), "w")
    assert created and saved and len(created) == len(saved) == 8 and created != saved
    started = store.start_tasks(owner="w1", now=T0, lease_until=T0 + timedelta(seconds=5),
                                buckets=[0])  # fmt: skip
    assert [s.task_id for s in started] == ["t"]
    memo = client.hget(store.keys.task("t"), "w")  # start_tasks stamps its memo token
    assert memo and len(memo) == 12 and client.exists(store.keys.start_memo(memo.decode()))
