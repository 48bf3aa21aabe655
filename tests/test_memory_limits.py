"""The in-memory reference of the limits: recorded definitions, and ``start_tasks`` admitting
only what each task's concurrency and rate refs allow, first come first served within a ref,
holding back nothing outside it, freeing a slot with every write that ends the holder."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chongming_redis import InMemoryTaskStore, TaskSnapshot, TaskStatus
from chongming_redis.limits import Concurrency, LimitConflict, RateLimit, to_json
from chongming_redis.testing.contract.support import (
    PAUSED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    at,
    raises,
)

TWO = to_json(Concurrency(max=2, per="customer"))


def task(task_id: str, created: float, *refs: str, name: str = "export") -> TaskSnapshot:
    return TaskSnapshot(task_id=task_id, name=name, status=PENDING, status_version=1,
                        created_at=at(created), updated_at=at(created), bucket=0,
                        limits=refs)  # fmt: skip


def start(store: InMemoryTaskStore, now: float, limit: int = 50) -> list[str]:
    started = store.start_tasks(owner="w", now=at(now), lease_until=at(now + 30), buckets=[0],
                                limit=limit)  # fmt: skip
    return [s.task_id for s in started]


def finish(store: InMemoryTaskStore, task_id: str, status: TaskStatus = SUCCEEDED) -> None:
    current = store.get(task_id)
    assert current is not None
    store.save(replace(current, status=status, status_version=current.status_version + 1),
               expect_version=current.status_version)  # fmt: skip


@pytest.fixture
def store() -> InMemoryTaskStore:
    made = InMemoryTaskStore()
    made.record_limits({"export.concurrency": TWO}, {"export": ["export.concurrency"]})
    return made


def test_a_full_key_holds_back_its_own_tasks_in_order_and_nothing_else(
    store: InMemoryTaskStore,
) -> None:
    for i in range(5):
        store.create(task(f"a{i}", i, "export.concurrency=A"))
    store.create(task("b0", 10, "export.concurrency=B"))
    store.create(task("free", 11))
    store.create(task("undefined", 12, "nobody=A"))  # a ref no limit is recorded for
    assert start(store, 100) == ["a0", "a1", "b0", "free", "undefined"]
    held_back = [store.get(f"a{i}") for i in (2, 3, 4)]
    assert all(t is not None and t.status == PENDING and t.status_version == 1 for t in held_back)
    assert [h.version for h in store.history("a2")] == [], "a held-back task spends nothing"
    assert start(store, 101) == [], "a second call with the key still full starts nothing"
    finish(store, "a1")
    assert start(store, 102) == ["a2"], "the slot frees with the end; the oldest waiter takes it"
    finish(store, "a0", STOPPED)
    finish(store, "a2", PAUSED)  # a paused task keeps its slot
    assert start(store, 103) == ["a3"]
    assert start(store, 104) == []


def test_the_limit_is_shared_by_one_start_call(store: InMemoryTaskStore) -> None:
    for i in range(4):
        store.create(task(f"a{i}", i, "export.concurrency=A"))
    assert start(store, 100, limit=1) == ["a0"]
    assert start(store, 100, limit=50) == ["a1"]
    assert start(store, 100) == []


def test_a_rate_limit_spends_a_token_per_start_and_refills_on_the_clock() -> None:
    store = InMemoryTaskStore()
    rate = to_json(RateLimit(rate=1, per=1.0, burst=2))
    store.record_limits({"api": rate}, {"export": ["api"]})
    for i in range(6):
        store.create(task(f"t{i}", i, "api"))
    assert start(store, 100) == ["t0", "t1"], "a full bucket: burst starts at once"
    assert start(store, 100.5) == []
    assert start(store, 101) == ["t2"]
    assert start(store, 90) == [], "a clock behind the last start refills nothing"
    assert start(store, 101.9) == []
    assert start(store, 104) == ["t3", "t4"], "refilled up to burst, never above"
    assert start(store, 104) == []


def test_definitions_are_recorded_and_a_different_one_is_refused_unless_replaced(
    store: InMemoryTaskStore,
) -> None:
    defs, types = store.limit_definitions()
    assert defs == {"export.concurrency": TWO} and types == {"export": ("export.concurrency",)}
    store.record_limits({"export.concurrency": TWO}, {"export": ["export.concurrency"]})
    three = to_json(Concurrency(max=3, per="customer"))
    error = raises(LimitConflict, store.record_limits, {"export.concurrency": three, "x": TWO},
                   {"export": ["export.concurrency"]})  # fmt: skip
    assert error.limit_id == "export.concurrency"
    assert store.limit_definitions()[0] == defs, "a refused record writes nothing"
    store.record_limits({"export.concurrency": three}, {}, replace=True)
    assert store.limit_definitions()[0] == {"export.concurrency": three}
    raises(ValueError, store.record_limits, {}, {"t": ["missing"]})
    raises(ValueError, store.record_limits, {"bad": "{}"}, {})
    for i in range(4):
        store.create(task(f"a{i}", i, "export.concurrency=A"))
    assert start(store, 100) == ["a0", "a1", "a2"], "the new definition holds from now on"


def test_a_task_with_several_refs_needs_room_in_each() -> None:
    store = InMemoryTaskStore()
    one = to_json(Concurrency(max=1))
    store.record_limits({"x": one, "y": one}, {})
    store.create(task("xy", 0, "x", "y"))
    store.create(task("y", 1, "y"))
    store.create(task("x", 2, "x"))
    assert start(store, 100) == ["xy"]
    finish(store, "xy")
    assert start(store, 101) == ["y", "x"]
    assert store.get("x") is not None and store.get("x").status == RUNNING  # type: ignore[union-attr]
