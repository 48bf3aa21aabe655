"""Every key a write script touches is checked before its first write.

A Lua script is not rolled back: a command that fails halfway leaves the commands before it
applied. The write scripts therefore plan their index, counter and change-feed writes while
they read, check every key those writes touch (``index_check``, ``feed_check``), and only then
write. Here another client breaks one such key — an index key, a tag or pipeline index, the
name counts of a bucket, the counters, a feed chunk, the feed head — and every write that would
touch it (``create``, ``save``, ``commit_tasks`` creating and saving, ``start_tasks``,
``prune``) must raise ``CorruptRecord`` naming that key and leave the namespace byte-identical
(``DUMP`` of every key); the next write after the key is repaired gets a fresh feed position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import redis

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import TaskStatus, Transition
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_redis_store import T0, dump_namespace, task

pytestmark = pytest.mark.redis

P, R, S = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED


def breakers(store: RedisTaskStore) -> dict[str, tuple[str, Callable[[redis.Redis], object]]]:
    """name -> (the key broken, how): each replaces a key the writes below touch with a value
    of another type (or a counter with a word)."""
    k = store.keys
    root = k.root

    def replace(key: str, how: Callable[[redis.Redis], object]) -> Callable[[redis.Redis], object]:
        return lambda c: (c.delete(key), how(c))

    return {
        "tag index is a string": (root + "tag:io", replace(root + "tag:io",
                                                           lambda c: c.set(root + "tag:io", "x"))),
        "pipeline index is a list": (root + "p:run", replace(
            root + "p:run", lambda c: c.rpush(root + "p:run", "x"))),
        "running index is a string": (root + "ix:running:3:job", replace(
            root + "ix:running:3:job", lambda c: c.set(root + "ix:running:3:job", "x"))),
        "succeeded index is a hash": (root + "ix:succeeded:3:job", replace(
            root + "ix:succeeded:3:job", lambda c: c.hset(root + "ix:succeeded:3:job", "a", "b"))),
        "name counts are a string": (root + "nm:running:3", replace(
            root + "nm:running:3", lambda c: c.set(root + "nm:running:3", "x"))),
        "a counter is not a number": (k.counts, lambda c: c.hset(k.counts, "running", "many")),
        "feed chunk is a list": (root + "fc:0", replace(
            root + "fc:0", lambda c: c.rpush(root + "fc:0", "x"))),
        "feed head is not a number": (root + "feed", lambda c: c.hset(root + "feed", "head", "x")),
    }  # fmt: skip


def writes(store: RedisTaskStore) -> dict[str, Callable[[], object]]:
    """The writes, from a state of: ``old`` RUNNING (bucket 3, tag io, pipeline run), ``done``
    SUCCEEDED (bucket 3), ``new`` PENDING (bucket 3)."""
    now = T0 + timedelta(seconds=5)
    old = task("old", status=R, status_version=2, bucket=3, tags=frozenset({"io"}),
               pipeline_run_id="run")  # fmt: skip
    finished = dataclasses.replace(old, status=S, status_version=3, updated_at=now)
    return {
        "create": lambda: store.create(
            task("x", status=R, bucket=3, tags=frozenset({"io"}), pipeline_run_id="run")
        ),
        "save": lambda: store.save(finished, expect_version=2),
        "commit_tasks (create)": lambda: raise_first(
            store.commit_tasks(
                [
                    (
                        task(
                            "y", status=R, bucket=3, tags=frozenset({"io"}), pipeline_run_id="run"
                        ),
                        None,
                        [],
                    )
                ]
            )
        ),
        "commit_tasks (save)": lambda: raise_first(
            store.commit_tasks([(finished, 2, [Transition("old", 3, R, S, now)])])
        ),
        "start_tasks": lambda: store.start_tasks(
            owner="w", now=now, lease_until=now + timedelta(seconds=30), buckets=[3]
        ),
        "prune": lambda: store.prune(keep_terminal=0),
    }


def raise_first(results: list[object]) -> None:
    for result in results:
        if isinstance(result, Exception):
            raise result


def seed(store: RedisTaskStore) -> None:
    store.create(task("old", status=R, status_version=2, bucket=3, tags=frozenset({"io"}),
                      pipeline_run_id="run"))  # fmt: skip
    store.create(task("done", status=S, bucket=3))
    store.create(task("new", bucket=3, created_at=T0 + timedelta(seconds=1)))
    store.prepare_start_order()  # once per namespace, before its first start (not under test)


def touched(write: str, broken: str) -> bool:
    """Does ``write`` (from the seeded state) write to the key ``broken`` names?"""
    if broken in ("feed chunk is a list", "feed head is not a number"):
        return True  # every write moves a task in the feed (prune: to a tombstone)
    if broken == "a counter is not a number":
        return write != "prune"  # the running counter: prune only counts terminal tasks
    table = {
        "tag index is a string": {"create", "commit_tasks (create)"},
        "pipeline index is a list": {"create", "commit_tasks (create)"},
        "running index is a string": {"create", "commit_tasks (create)", "save",
                                      "commit_tasks (save)", "start_tasks"},
        "succeeded index is a hash": {"save", "commit_tasks (save)", "prune"},
        "name counts are a string": {"create", "commit_tasks (create)", "save",
                                     "commit_tasks (save)", "start_tasks"},
    }  # fmt: skip
    return write in table[broken]


CASES = [
    (w, b)
    for w in ("create", "save", "commit_tasks (create)", "commit_tasks (save)", "start_tasks",
              "prune")
    for b in ("tag index is a string", "pipeline index is a list", "running index is a string",
              "succeeded index is a hash", "name counts are a string",
              "a counter is not a number", "feed chunk is a list", "feed head is not a number")
    if touched(w, b)
]  # fmt: skip


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    opened = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield opened
    opened.close()


@pytest.fixture
def client(redis_proc: RedisProc) -> Iterator[redis.Redis]:
    opened = redis_proc.client()
    yield opened
    opened.close()


@pytest.mark.parametrize(("write", "broken"), CASES)
def test_a_write_that_would_touch_a_broken_key_is_corrupt_and_writes_nothing(
    store: RedisTaskStore, client: redis.Redis, namespace: str, write: str, broken: str
) -> None:
    seed(store)
    key, breaks = breakers(store)[broken]
    breaks(client)
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord) as caught:
        writes(store)[write]()
    assert caught.value.key == key
    assert dump_namespace(client, namespace) == before, "byte-identical: nothing written"


def test_the_next_write_after_a_refused_one_gets_a_fresh_feed_position(
    store: RedisTaskStore, client: redis.Redis
) -> None:
    """A tagged create refused for a broken tag index must not take (and so hand out twice)
    the next feed position."""
    store.create(task("first"))
    client.set(store.keys.root + "tag:bad", "x")
    with pytest.raises(CorruptRecord):
        store.create(task("tagged", tags=frozenset({"bad"})))
    store.create(task("second"))
    store.create(task("third"))
    positions = [client.hget(store.keys.task(t), "fs") for t in ("first", "second", "third")]
    assert len(set(positions)) == 3
    assert store.counts()[P] == 3
    page = store.changes("0")
    assert [item.task_id for item in page.tasks] == ["first", "second", "third"]


@pytest.mark.parametrize(
    ("write", "field", "value"),
    [("prune", "tombs", "x"), ("start_tasks", "running", "007"), ("save", "running", "-0"),
     ("create", "running", "00")],
)  # fmt: skip
def test_counters_redis_would_refuse_are_caught_before_the_first_write(
    store: RedisTaskStore,
    client: redis.Redis,
    namespace: str,
    write: str,
    field: str,
    value: str,
) -> None:
    """``HINCRBY`` refuses leading zeros and ``-0``; the feed's tombstone count is a counter
    too: each is CORRUPT before anything is written, not a failure halfway."""
    seed(store)
    key = store.keys.root + "feed" if field == "tombs" else store.keys.counts
    client.hset(key, field, value)
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord) as caught:
        writes(store)[write]()
    assert caught.value.key == key
    assert dump_namespace(client, namespace) == before


def test_a_corrupt_feed_position_is_corrupt_and_writes_nothing(
    store: RedisTaskStore, client: redis.Redis, namespace: str
) -> None:
    seed(store)
    client.hset(store.keys.task("old"), "fs", "abc")
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord) as caught:
        writes(store)["save"]()
    assert caught.value.key == store.keys.task("old")
    assert dump_namespace(client, namespace) == before


def test_a_start_with_nothing_to_start_does_not_look_at_the_feed(
    store: RedisTaskStore, client: redis.Redis
) -> None:
    """A broken feed key fails the writes that would touch it, not an idle worker's polls."""
    client.set(store.keys.root + "fcs", "x")
    now = T0 + timedelta(seconds=5)
    assert store.start_tasks(owner="w", now=now, lease_until=now + timedelta(seconds=30),
                             buckets=[3]) == []  # fmt: skip
