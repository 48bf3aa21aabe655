"""The limits on the Redis store (``lua/lib/limits.lua``, ``lua/start_tasks.lua``): recorded
definitions, concurrency holders kept by every write that moves a task (never more than
``max``; every way out frees the slot in that write; ``PAUSED`` keeps it), first come first
served within a ref, token buckets on the earlier clock, and four stores racing on one ref.
Real redis-server (and Redis Cluster for the holders)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chongming_redis.limits import Concurrency, LimitConflict, RateLimit, to_json
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

P, R, PA = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED
EXP = "exports.per_customer"
TWO = to_json(Concurrency(max=2, per="customer"))
RATE = to_json(RateLimit(rate=2, per=1.0, burst=3))
EPOCH = datetime(2020, 1, 1, tzinfo=timezone.utc)  # past: the caller is the earlier clock


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def task(task_id: str, created: float, *refs: str, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id, fields.pop("name", "export"), fields.pop("status", P),
                        fields.pop("version", 1), at(created), updated_at=at(created),
                        limits=refs, **fields)  # fmt: skip


@pytest.fixture(params=["redis", "cluster"])
def store(request: pytest.FixtureRequest, namespace: str) -> Iterator[RedisTaskStore]:
    if request.param == "redis":
        proc: RedisProc = request.getfixturevalue("redis_proc")
        url, cluster = proc.url, False
    else:
        url, cluster = request.getfixturevalue("redis_cluster").url, True
    opened = RedisTaskStore.from_url(url, namespace=namespace, cluster=cluster)
    yield opened
    opened.drop_namespace()
    opened.close()


def go(store: RedisTaskStore, now: float = 100.0, limit: int = 50) -> list[str]:
    started = store.start_tasks(owner="w", now=at(now), lease_until=at(now + 30), buckets=[0],
                                limit=limit)  # fmt: skip
    return [s.task_id for s in started]


def move(store: RedisTaskStore, task_id: str, status: TaskStatus, *, commit: bool = False) -> None:
    current = store.get(task_id)
    assert current is not None
    new = replace(current, status=status, status_version=current.status_version + 1)
    if commit:
        assert store.commit_tasks([(new, current.status_version, [])]) == [None]
    else:
        store.save(new, expect_version=current.status_version)


def test_record_limits_reads_back_and_a_conflict_writes_nothing(store: RedisTaskStore) -> None:
    assert store.limit_definitions() == ({}, {})
    defs, types = {EXP: TWO, "api.rate": RATE}, {"export": (EXP, "api.rate")}
    store.record_limits(defs, types)
    assert store.limit_definitions() == (defs, types)
    other = to_json(Concurrency(max=3, per="customer"))
    with pytest.raises(LimitConflict) as caught:
        store.record_limits({"new": TWO, EXP: other}, {"fresh": ["new"]})
    assert caught.value.limit_id == EXP
    assert store.limit_definitions() == (defs, types)
    store.record_limits({EXP: other}, {"export": [EXP]}, replace=True)
    assert store.limit_definitions() == ({**defs, EXP: other}, {"export": (EXP,)})


def test_max_is_never_exceeded_and_every_way_out_frees_in_that_write(
    store: RedisTaskStore,
) -> None:
    store.record_limits({EXP: TWO}, {})
    for i in range(9):
        store.create(task(f"a{i}", i, f"{EXP}=c1"))
    store.create(task("b0", 20, f"{EXP}=c2"))
    assert go(store) == ["a0", "a1", "b0"]
    assert go(store, 101) == [], "a full key starts none more"
    running = ["a0", "a1"]
    ways = [(TaskStatus.SUCCEEDED, True), (TaskStatus.FAILED, True), (TaskStatus.FAILED, False),
            (TaskStatus.STOPPED, False), (TaskStatus.LOST, False), (P, False)]  # fmt: skip
    for n, (status, commit) in enumerate(ways):
        move(store, running.pop(0), status, commit=commit)
        started = go(store, 102 + n)
        assert len(started) == 1, (status, commit, started)
        running.append(started[0])
        assert go(store, 102 + n) == []


def test_paused_keeps_its_slot_and_a_created_holder_takes_one(store: RedisTaskStore) -> None:
    store.record_limits({EXP: TWO}, {})
    store.create(task("held", 0, f"{EXP}=c1", status=R, version=2, bucket=3))
    for i in range(3):
        store.create(task(f"a{i}", 1 + i, f"{EXP}=c1"))
    assert go(store) == ["a0"]
    move(store, "a0", PA)
    assert go(store, 101) == [], "PAUSED keeps its slot"
    move(store, "held", TaskStatus.SUCCEEDED)
    assert go(store, 102) == ["a1"]


def test_first_come_first_served_within_a_ref_and_others_go_on(store: RedisTaskStore) -> None:
    store.record_limits({EXP: to_json(Concurrency(max=1, per="c"))}, {})
    store.create(task("h", 0, f"{EXP}=k"))
    assert go(store) == ["h"]
    for name, created, ref in [("w1", 1, "k"), ("w2", 2, "k"), ("o", 3, "j")]:
        store.create(task(name, created, f"{EXP}={ref}"))
    store.create(task("free", 4))
    assert go(store, 101) == ["o", "free"]
    move(store, "h", TaskStatus.SUCCEEDED)
    assert go(store, 102) == ["w1"]
    move(store, "w1", TaskStatus.SUCCEEDED)
    assert go(store, 103) == ["w2"]


def test_an_unrecorded_limit_limits_nothing(store: RedisTaskStore) -> None:
    for i in range(3):
        store.create(task(f"u{i}", i, "nobody.recorded=x"))
    assert go(store) == ["u0", "u1", "u2"]


def test_rate_burst_refill_and_a_clock_going_back(store: RedisTaskStore) -> None:
    store.record_limits({"api.rate": RATE}, {})
    for i in range(8):
        store.create(task(f"r{i}", i / 10, "api.rate"))
    assert go(store, 0) == ["r0", "r1", "r2"], "a full bucket: burst starts"
    assert go(store, 0.25) == [], "half a token is none"
    assert go(store, 0.5) == ["r3"]
    assert go(store, 0.5) == [], "a token is spent once"
    assert go(store, 0.2) == [], "a clock going back gives nothing"
    assert go(store, 1.0) == ["r4"], "and counts nothing twice"
    assert go(store, 10.0) == ["r5", "r6", "r7"], "refilled up to burst"


def test_four_stores_racing_never_exceed_max(redis_proc: RedisProc, namespace: str) -> None:
    stores = [RedisTaskStore.from_url(redis_proc.url, namespace=namespace) for _ in range(4)]
    first = stores[0]
    first.record_limits({EXP: TWO}, {})
    for i in range(60):
        first.create(task(f"t{i:02}", i, f"{EXP}=hot"))
    over: list[int] = []

    def running() -> int:
        page = first.query(TaskQuery(statuses=frozenset({R}), limit=100))
        return len(page)

    def loop(store: RedisTaskStore) -> None:
        for n in range(40):
            for s in store.start_tasks(owner=f"w{id(store)}", now=at(100 + n),
                                       lease_until=at(200), buckets=[0], limit=3):  # fmt: skip
                held = running()
                if held > 2:
                    over.append(held)
                done = replace(s, status=TaskStatus.SUCCEEDED, status_version=s.status_version + 1)
                store.commit_tasks([(done, s.status_version, [])])

    threads = [threading.Thread(target=loop, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert over == [], over
        assert first.counts()[TaskStatus.SUCCEEDED] > 0
        assert first.client.scard(first.keys.limit_holders(f"{EXP}=hot")) == 0
    finally:
        first.drop_namespace()
        for s in stores:
            s.close()


def test_limit_usage_counts_holders_and_live_waiters_busiest_first(store: RedisTaskStore) -> None:
    one = to_json(Concurrency(max=1, per="c"))
    store.record_limits({EXP: one, "api.rate": RATE}, {})
    assert store.limit_usage() == []
    for i in range(4):
        store.create(task(f"a{i}", i, f"{EXP}=z"))
    store.create(task("b0", 10, f"{EXP}=m"))
    store.create(task("b1", 11, f"{EXP}=m"))
    store.create(task("c0", 20, f"{EXP}=c"))
    store.create(task("r0", 21, "api.rate"))
    assert go(store) == ["a0", "b0", "c0", "r0"]
    usage = [(u.ref, u.held, u.waiting) for u in store.limit_usage()]
    assert usage == [(f"{EXP}=z", 1, 3), (f"{EXP}=m", 1, 1), (f"{EXP}=c", 1, 0)], "rate holds 0"
    assert [u.ref for u in store.limit_usage(limit=1)] == [f"{EXP}=z"]
    move(store, "a3", TaskStatus.STOPPED)  # a moved waiter waits no more
    move(store, "c0", TaskStatus.SUCCEEDED)  # and a ref with nothing is dropped
    assert [(u.ref, u.waiting) for u in store.limit_usage()] == [(f"{EXP}=z", 2), (f"{EXP}=m", 1)]
    assert not store.client.sismember(store.keys.root + "lrefs", f"{EXP}=c")
    move(store, "a0", TaskStatus.SUCCEEDED)
    assert go(store, now=101) == ["a1"]
    usage = [(u.ref, u.held, u.waiting) for u in store.limit_usage()]
    assert usage == [(f"{EXP}=m", 1, 1), (f"{EXP}=z", 1, 1)], "started: none; ties by ref"
    with pytest.raises(ValueError):
        store.limit_usage(limit=0)


def test_a_flood_of_one_ref_parks_at_entry_and_other_keys_start_at_once(
    store: RedisTaskStore,
) -> None:
    store.record_limits({EXP: TWO}, {})
    for i in range(2):
        store.create(task(f"h{i}", 0, f"{EXP}=hot", status=R, version=2))
    for i in range(300):
        store.create(task(f"f{i:03}", 1 + i / 1000, f"{EXP}=hot"))
    store.create(task("free", 10))
    store.create(task("cold", 11, f"{EXP}=cold"))
    root = store.keys.root
    assert store.client.zcard(root + "lp:" + f"{EXP}=hot") == 300, "parked, not ready"
    assert store.client.zcard(root + "rq:0:export") == 2
    assert go(store, limit=2) == ["free", "cold"], "the flood costs a start nothing"
    assert store.counts()[P] == 300


def test_a_stopped_parked_waiter_leaves_and_the_next_is_promoted(store: RedisTaskStore) -> None:
    store.record_limits({EXP: to_json(Concurrency(max=1, per="c"))}, {})
    store.create(task("h", 0, f"{EXP}=k"))
    assert go(store) == ["h"]
    for i in range(3):
        store.create(task(f"w{i}", 1 + i, f"{EXP}=k"))
    lp = store.keys.root + "lp:" + f"{EXP}=k"
    assert store.client.zrange(lp, 0, -1) == [b"w0", b"w1", b"w2"]
    move(store, "w0", TaskStatus.STOPPED)
    assert store.client.zrange(lp, 0, -1) == [b"w1", b"w2"], "left parking in that write"
    move(store, "h", TaskStatus.SUCCEEDED, commit=True)
    assert go(store, now=101) == ["w1"], "a freed slot promotes the next parked task"
    assert store.client.zrange(lp, 0, -1) == [b"w2"]
    assert [(u.ref, u.held, u.waiting) for u in store.limit_usage()] == [(f"{EXP}=k", 1, 1)]


def test_promotion_after_a_holder_ends_keeps_first_come_first_served(
    store: RedisTaskStore,
) -> None:
    store.record_limits({EXP: TWO}, {})
    for i in range(6):
        store.create(task(f"a{i}", i, f"{EXP}=c1"))
    assert go(store) == ["a0", "a1"]
    assert store.client.zcard(store.keys.root + "lp:" + f"{EXP}=c1") == 4, "refused: parked"
    assert go(store, now=101) == [], "no slot freed: nothing promoted"
    move(store, "a1", TaskStatus.FAILED)
    move(store, "a0", P)  # handed back: parked behind nobody older, it goes first
    assert go(store, now=102) == ["a0", "a2"]
    assert go(store, now=103) == []


def test_a_raised_max_starts_parked_tasks_without_waiting_for_a_holder_to_end(
    store: RedisTaskStore,
) -> None:
    one = to_json(Concurrency(max=1, per="c"))
    store.record_limits({EXP: one}, {})
    for i in range(4):
        store.create(task(f"t{i}", i, f"{EXP}=k"))
    store.create(task("other", 10))
    assert go(store) == ["t0", "other"]
    assert go(store, now=101) == [], "parked behind the holder"
    store.record_limits({EXP: one}, {})  # the same definition again: nothing moves
    assert not store.client.exists(store.keys.root + "lf"), "nothing marked"
    assert go(store, now=102) == []
    store.record_limits({EXP: to_json(Concurrency(max=3, per="c"))}, {}, replace=True)
    assert go(store, now=103) == ["t1", "t2"], "room for two more, first come first served"
    assert store.client.zrange(store.keys.root + "lp:" + f"{EXP}=k", 0, -1) == [b"t3"]
    assert [(u.ref, u.held, u.waiting) for u in store.limit_usage()] == [(f"{EXP}=k", 3, 1)]
    assert go(store, now=104) == []
