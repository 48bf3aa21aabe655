"""The bytes a finished task costs in Redis, pinned where the layout saves them: no ``g`` field
for a task without tags, 8-character write tokens, history entries in layout 2 (both statuses in
one byte) written by Python and by Lua alike, and data in the older shapes still read."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_redis import CorruptRecord, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._redis.rows import decode_entry, encode_entry
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
LETTERS = {"waiting": "W", "pending": "P", "running": "R", "paused": "Z", "succeeded": "S",
           "failed": "F", "stopped": "X", "lost": "L"}  # fmt: skip


def task(task_id: str, **fields: object) -> TaskSnapshot:
    base: dict[str, object] = {"name": "job", "status": TaskStatus.PENDING, "status_version": 1,
                               "created_at": T0, "updated_at": T0}  # fmt: skip
    base.update(fields)
    return TaskSnapshot(task_id, **base)  # type: ignore[arg-type]


def micros(when: datetime) -> int:
    return (when - EPOCH) // timedelta(microseconds=1)


def layout_one(t: Transition) -> bytes:
    """A history entry as the store wrote it before layout 2."""
    source = None if t.from_status is None else LETTERS[t.from_status.value]
    return bytes(msgpack.packb([t.version, source, LETTERS[t.to_status.value], micros(t.at),
                                t.reason], use_bin_type=True))  # fmt: skip


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


# -- history entries ----------------------------------------------------------------------------

transitions = st.builds(
    Transition,
    task_id=st.just("t"),
    version=st.integers(1, 2**53 - 1),
    from_status=st.none() | st.sampled_from(list(TaskStatus)),
    to_status=st.sampled_from(list(TaskStatus)),
    at=st.datetimes(
        min_value=datetime(1970, 1, 1),
        max_value=datetime(2255, 6, 4),
        timezones=st.just(timezone.utc),
    ),
    reason=st.none() | st.text(max_size=300),
)


@settings(max_examples=300)
@given(t=transitions)
def test_layout_two_round_trips_and_layout_one_is_still_read(t: Transition) -> None:
    entry = encode_entry(t)
    if TaskStatus.WAITING in (t.from_status, t.to_status):  # no number in layout 2
        assert entry == layout_one(t)
    else:
        assert entry[0] == (0x93 if t.reason is None else 0x94)
    assert decode_entry("t", "k", entry) == t
    assert decode_entry("t", "k", layout_one(t)) == t


def test_layout_two_spends_one_byte_on_both_statuses() -> None:
    at = T0 + timedelta(microseconds=123)
    plain = Transition("t", 3, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, at)
    assert encode_entry(plain) == b"\x93\x03\x14\xcf" + micros(at).to_bytes(8, "big")
    assert len(encode_entry(plain)) == len(layout_one(plain)) - 4
    first = Transition("t", 1, None, TaskStatus.PENDING, at, "submitted by me")
    assert encode_entry(first)[:3] == b"\x94\x01\x01"
    assert len(encode_entry(first)) == len(layout_one(first)) - 2


@pytest.mark.parametrize(
    "values",
    [[1, 0, 5], [1, 8, 5], [1, 64, 5], [1, -1, 5], [1, True, 5], [1, "R", 5], [1, 2.0, 5],
     [1, 2], [1, 2, 5, "r", None, 6], [1, None, "Q", 5, None]],
)  # fmt: skip
def test_an_entry_of_neither_layout_is_corrupt(values: list[object]) -> None:
    with pytest.raises(CorruptRecord):
        decode_entry("t", "k", msgpack.packb(values))


def test_entries_written_by_lua_and_by_python_and_in_layout_one_read_back_alike(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    created = T0 + timedelta(microseconds=77)
    store.create(task("t", created_at=created))
    submitted = Transition("t", 1, None, TaskStatus.PENDING, created, "submitted by me")
    client.zadd(store.keys.history("t"), {layout_one(submitted): 1})  # written before layout 2
    now = T0 + timedelta(seconds=3)
    store.start_tasks(owner="worker-é", now=now, lease_until=now + timedelta(seconds=5),
                      buckets=[0])  # fmt: skip
    done = Transition("t", 3, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, now + timedelta(seconds=1))
    store.append(done)
    started = Transition("t", 2, TaskStatus.PENDING, TaskStatus.RUNNING, now,
                         "started by worker-é (attempt 1)")  # fmt: skip
    assert store.history("t") == [submitted, started, done]
    members = client.zrange(store.keys.history("t"), 0, -1)
    assert [m[0] for m in members] == [0x95, 0x94, 0x93], "layout 1, Lua's layout 2, Python's"
    assert members[1][:3] == b"\x94\x02\x0a" and members[1][3:] == encode_entry(started)[3:]
