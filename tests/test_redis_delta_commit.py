"""Commits that send only the columns that change (``stores/_written_rows.py``).

A store that started or committed a task knows the row stored at its version and write token;
its next commit of that task sends only what differs (plus heartbeat and progress, which
``touch`` changes without a new version), naming that token. The result must be exactly what a
full save gives: the same hash, the same indexes, counters and feed order; a commit whose base
row is no longer stored (the token differs) is answered ``STALE`` and sent again in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import Failure, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_redis_store import T0, task

pytestmark = pytest.mark.redis

P, R, S, F = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED
NOW = T0 + timedelta(seconds=10)


@pytest.fixture
def client(redis_proc: RedisProc) -> Iterator[redis.Redis]:
    opened = redis_proc.client()
    yield opened
    opened.close()


@pytest.fixture
def stores(redis_proc: RedisProc, namespace: str) -> Iterator[tuple[RedisTaskStore, ...]]:
    """Three stores on one namespace: ``a`` starts and commits (knows its rows), ``b`` and
    ``c`` are other writers (they know nothing)."""
    opened = tuple(RedisTaskStore.from_url(redis_proc.url, namespace=namespace) for _ in "abc")
    yield opened
    for store in opened:
        store.close()


def started_pair(a: RedisTaskStore, **fields: Any) -> tuple[TaskSnapshot, TaskSnapshot]:
    """Two identical tasks (``d-`` committed by delta, ``f-`` in full), started by ``a``."""
    for prefix in ("d-", "f-"):
        a.create(task(prefix + "t", bucket=3, **fields))
    found = a.start_tasks(owner="w", now=T0, lease_until=T0 + timedelta(seconds=60), buckets=[3])
    by_id = {t.task_id: t for t in found}
    return by_id["d-t"], by_id["f-t"]


def hash_of(client: redis.Redis, store: RedisTaskStore, task_id: str) -> dict[bytes, bytes]:
    raw = client.hgetall(store.keys.task(task_id))
    return {k: v for k, v in raw.items() if k not in (b"w", b"fs")}


def index_entries(client: redis.Redis, store: RedisTaskStore, task_id: str) -> set[bytes]:
    """Every index sorted set that lists ``task_id`` (composite, tag, pipeline)."""
    root = store.keys.root
    found = set()
    for kind in ("ix:", "tag:", "p:"):
        for key in client.scan_iter(match=root + kind + "*", count=1000):
            if client.zscore(key, task_id) is not None:
                found.add(key)
    return found


def sent_args(store: RedisTaskStore) -> list[list[Any]]:
    """Record the arguments of every commit_tasks call of ``store``."""
    calls: list[list[Any]] = []
    run = store._run

    def recording(name: str, keys: Any, args: Any, **about: Any) -> list[Any]:
        if name == "commit_tasks":
            calls.append(list(args))
        return run(name, keys, args, **about)

    store._run = recording  # type: ignore[method-assign]
    return calls


CHANGES: dict[str, dict[str, Any]] = {
    "succeeds with a result": {"status": S, "result": {"rows": 3}, "progress": Progress(3, 3)},
    "fails with a failure": {"status": F, "failure": Failure("E", "boom", "tb")},
    "progress and heartbeat": {"progress": Progress(1, 9, "x"), "heartbeat_at": NOW},
    "moves bucket and name": {"bucket": 5, "name": "other"},
    "drops its tags and pipeline": {"tags": frozenset(), "pipeline_run_id": None},
    "changes its tags": {"tags": frozenset({"b", "c"})},
    "nothing but the version": {},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_commit_of_only_the_changes_leaves_what_a_full_save_leaves(
    stores: tuple[RedisTaskStore, ...], client: redis.Redis, change: str
) -> None:
    a, b, _ = stores
    d, f = started_pair(a, tags=frozenset({"a", "b"}), pipeline_run_id="run", key="k1")
    changes = {"status_version": d.status_version + 1, "updated_at": NOW, **CHANGES[change]}
    calls = sent_args(a)
    entry = Transition("d-t", d.status_version + 1, R, changes.get("status", R), NOW)
    assert a.commit_tasks([(d.evolve(**changes), d.status_version, [entry])]) == [None]
    # the same snapshot through a store that knows nothing: a full save
    full_entry = dataclasses.replace(entry, task_id="f-t")
    assert b.commit_tasks([(f.evolve(**changes), f.status_version, [full_entry])]) == [None]
    assert hash_of(client, a, "d-t") == hash_of(client, a, "f-t")
    assert a.get("d-t") == dataclasses.replace(a.get("f-t"), task_id="d-t")  # type: ignore[arg-type]
    assert index_entries(client, a, "d-t") == index_entries(client, a, "f-t")
    for query in (TaskQuery(statuses=frozenset({changes.get("status", R)})), TaskQuery(tag="b"),
                  TaskQuery(tag="a"), TaskQuery(pipeline_run_id="run"), TaskQuery(name="other"),
                  TaskQuery(buckets=frozenset({5}))):  # fmt: skip
        found = sorted(t.task_id for t in a.query(query))
        assert found in ([], ["d-t", "f-t"]), (query, found)  # both or neither
    assert len(calls[0]) < 40  # only the changes went: a full row is ~40 arguments


def test_a_second_commit_after_a_first_sends_only_changes_again(
    stores: tuple[RedisTaskStore, ...], client: redis.Redis
) -> None:
    a, b, _ = stores
    d, f = started_pair(a)
    paused = {"status": TaskStatus.PAUSED, "status_version": 3, "updated_at": NOW}
    done = {"status": S, "status_version": 4, "updated_at": NOW, "result": [1]}
    calls = sent_args(a)
    assert a.commit_tasks([(d.evolve(**paused), 2, [])]) == [None]
    assert a.commit_tasks([(d.evolve(**paused).evolve(**done), 3, [])]) == [None]
    assert b.commit_tasks([(f.evolve(**paused), 2, [])]) == [None]
    assert b.commit_tasks([(f.evolve(**paused).evolve(**done), 3, [])]) == [None]
    assert hash_of(client, a, "d-t") == hash_of(client, a, "f-t")
    assert all(args[1] != "" for args in calls)  # both of a's commits named a base token


def test_a_commit_whose_base_row_was_replaced_is_sent_again_in_full(
    stores: tuple[RedisTaskStore, ...], client: redis.Redis
) -> None:
    """The task a knows was pruned and created again under the same id and version by another
    writer, with other columns: a's commit is answered STALE and resent in full, so nothing
    of the row a remembered survives."""
    a, b, c = stores
    d, _ = started_pair(a, key="old-key", params={"old": True})
    client.delete(a.keys.task("d-t"))  # gone (as by a prune), then created again:
    replacement = task("d-t", status=R, status_version=d.status_version, bucket=3,
                       params={"new": True})  # fmt: skip
    client.hset(a.keys.root + "counts", "running", 1)  # keep the counters plausible
    b.create(replacement)
    calls = sent_args(a)
    done = d.evolve(status=S, status_version=d.status_version + 1, updated_at=NOW)
    assert a.commit_tasks([(done, d.status_version, [])]) == [None]
    assert len(calls) == 2 and calls[0][1] != "" and calls[1][1] == ""  # partial, then full
    stored = a.get("d-t")
    assert stored is not None and stored.key == "old-key" and stored.params == {"old": True}
    assert stored == dataclasses.replace(done, lease_owner=None, lease_until=None)  # as created
    # and a full save by a store that knows nothing writes the same
    c_done = dataclasses.replace(done, status_version=done.status_version + 1)
    assert c.commit_tasks([(c_done, done.status_version, [])]) == [None]


def test_a_conflict_is_still_a_conflict(stores: tuple[RedisTaskStore, ...]) -> None:
    a, b, _ = stores
    d, _ = started_pair(a)
    other = d.evolve(status=TaskStatus.PAUSED, status_version=d.status_version + 1)
    assert b.commit_tasks([(other, d.status_version, [])]) == [None]  # another writer first
    ours = d.evolve(status=S, status_version=d.status_version + 1, updated_at=NOW)
    (error,) = a.commit_tasks([(ours, d.status_version, [])])
    assert isinstance(error, ConcurrencyConflict)
    assert a.get("d-t").status is TaskStatus.PAUSED  # type: ignore[union-attr]
