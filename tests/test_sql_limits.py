"""The limits on the SQL stores (``LimitsStore``), on SQLite and PostgreSQL: the rules of the
``LimitsStore`` docstring judged on the stores' own tables (``_sql/limits.py``), where the
shipped contract cannot look:

* ``max`` never exceeded; every way out frees the slot (a save to a final status, ``LOST``,
  back to ``PENDING``; ``commit_tasks``; prune), ``PAUSED`` keeps it, a save into ``RUNNING``
  takes one unrefused;
* first come, first served within a key; a flooded key (300 waiters) holds back nothing with
  small start limits, and while its line is blocked its backlog is not walked again;
* rate: burst, refill, a clock that goes back refills nothing;
* a ref no recorded limit names limits nothing; definitions conflict unless replaced;
* ``limit_usage``; a version-3 database upgrades and limits its old pending tasks' successors;
* PostgreSQL: four stores on their own connections starting and finishing tasks of one ref
  with ``max=2`` in a loop never hold more than 2.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.limits import Concurrency, LimitConflict, LimitUsage, RateLimit, to_json
from chongming_redis.stores.extensions import extensions_of
from chongming_redis.testing.contract.support import (
    LOST,
    PAUSED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    at,
    raises,
)
from tests.test_sql_task_policies import Database, _old_database

TWO = to_json(Concurrency(max=2, per="customer"))
A, B = "export.concurrency=A", "export.concurrency=B"


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    made = Database(request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def store(database: Database) -> Iterator[Any]:
    made = database.open()
    made.record_limits({"export.concurrency": TWO}, {"export": ["export.concurrency"]})
    yield made
    made.close()


def task(task_id: str, created: float, *refs: str, **fields: Any) -> TaskSnapshot:
    fields.setdefault("status", PENDING)
    return TaskSnapshot(task_id=task_id, name="export", status_version=1, created_at=at(created),
                        updated_at=at(created), bucket=0, limits=refs, **fields)  # fmt: skip


def start(store: Any, now: float, limit: int = 50) -> list[str]:
    started = store.start_tasks(owner="w", now=at(now), lease_until=at(now + 30), buckets=[0],
                                limit=limit)  # fmt: skip
    return [s.task_id for s in started]


def moved(store: Any, task_id: str, status: TaskStatus) -> TaskSnapshot:
    current = store.get(task_id)
    assert current is not None
    return replace(current, status=status, status_version=current.status_version + 1)


def finish(store: Any, task_id: str, status: TaskStatus = SUCCEEDED) -> None:
    new = moved(store, task_id, status)
    store.save(new, expect_version=new.status_version - 1)


def holders(database: Database, ref: str) -> int:
    ((count,),) = database.raw("SELECT COUNT(*) FROM limit_holders WHERE ref = ?", [ref])
    return int(count)


def test_a_full_key_holds_back_its_own_tasks_in_order_and_nothing_else(store: Any) -> None:
    assert "LimitsStore" in extensions_of(store)
    for i in range(5):
        store.create(task(f"a{i}", i, A))
    store.create(task("b0", 10, B))
    store.create(task("free", 11))
    store.create(task("undefined", 12, "nobody=A"))  # a ref no limit is recorded for
    assert start(store, 100) == ["a0", "a1", "b0", "free", "undefined"]
    held_back = [store.get(f"a{i}") for i in (2, 3, 4)]
    assert all(t is not None and t.status == PENDING and t.status_version == 1 for t in held_back)
    assert store.history("a2") == [], "a held-back task spends nothing"
    assert start(store, 101) == []
    assert store.limit_usage() == [LimitUsage(A, 2, 3), LimitUsage(B, 1, 0),
                                   LimitUsage("nobody=A", 1, 0)]  # fmt: skip
    finish(store, "a1")
    assert start(store, 102) == ["a2"], "the slot frees with the end; the oldest waiter takes it"
    finish(store, "a0", STOPPED)
    finish(store, "a2", PAUSED)  # a paused task keeps its slot
    assert start(store, 103) == ["a3"]
    assert start(store, 104) == []
    assert store.limit_usage(limit=1) == [LimitUsage(A, 2, 1)]


@pytest.mark.parametrize("way_out", [SUCCEEDED, STOPPED, LOST, PENDING])
def test_every_save_out_of_running_frees_the_slot(store: Any, way_out: TaskStatus) -> None:
    for i in range(3):
        store.create(task(f"a{i}", i, A))
    assert start(store, 100) == ["a0", "a1"]
    finish(store, "a0", way_out)
    assert start(store, 101) == (["a0"] if way_out == PENDING else ["a2"])


def test_commit_tasks_frees_and_takes_slots_and_a_save_into_running_is_never_refused(
    store: Any, database: Database
) -> None:
    for i in range(4):
        store.create(task(f"a{i}", i, A))
    assert start(store, 100) == ["a0", "a1"]
    done = moved(store, "a0", SUCCEEDED)
    assert store.commit_tasks([(done, done.status_version - 1, [])]) == [None]
    assert holders(database, A) == 1
    forced = moved(store, "a3", RUNNING)  # a write into RUNNING takes a slot, unrefused
    store.save(forced, expect_version=1)
    assert holders(database, A) == 2 and start(store, 101) == []
    store.create(task("c0", 20, A, status=RUNNING))  # so does a create
    assert holders(database, A) == 3
    for task_id in ("a1", "a3", "c0"):
        finish(store, task_id)
    assert start(store, 102) == ["a2"]
    finish(store, "a2")
    assert store.prune(keep_terminal=0) == 5 and holders(database, A) == 0
    assert database.raw("SELECT COUNT(*) FROM limit_waiters") == [(0,)]


def test_a_flooded_key_holds_back_nothing_and_is_not_walked_again(
    store: Any, database: Database
) -> None:
    for i in range(300):
        store.create(task(f"a{i:03}", i / 1000, A))
    for i in range(3):
        store.create(task(f"other{i}", 1 + i, f"export.concurrency=K{i}"))
    store.create(task("plain", 5))
    assert start(store, 100, limit=2) == ["a000", "a001"]
    assert start(store, 100, limit=2) == ["other0", "other1"]
    assert start(store, 100, limit=1) == ["other2"]
    assert start(store, 100, limit=1) == ["plain"]
    assert store.limit_usage(limit=1) == [LimitUsage(A, 2, 298)]
    assert database.raw("SELECT ref, blocked FROM limit_lines") == [(_bound(database, A), 1)]
    store.create(task("late", 50))
    assert start(store, 101, limit=1) == ["late"]
    finish(store, "a000")
    assert start(store, 102, limit=5) == ["a002"], "one slot: the head of the line"
    # The rest stay parked, out of the start order: the next start walks none of them.
    assert database.raw("SELECT COUNT(*) FROM tasks WHERE parked IS NOT NULL") == [(297,)]
    assert start(store, 103, limit=5) == []
    assert database.raw("SELECT blocked FROM limit_lines") == [(1,)], "full again"
    assert store.limit_usage(limit=1) == [LimitUsage(A, 2, 297)]


def _bound(database: Database, value: str) -> object:
    return value if database.kind == "sqlite" else value.encode()


def test_a_flooded_key_keeps_its_order_across_priorities(store: Any) -> None:
    store.create(task("low", 0, A))
    store.create(task("high", 5, A, priority=3))
    store.create(task("mid", 1, A, priority=1))
    assert start(store, 100, limit=1) == ["high"]
    assert start(store, 100, limit=1) == ["mid"]
    assert start(store, 100) == []
    finish(store, "mid")
    assert start(store, 101) == ["low"]


def test_a_task_with_several_refs_needs_room_in_each_and_blocks_only_the_full_one(
    database: Database,
) -> None:
    store = database.open()
    try:
        one = to_json(Concurrency(max=1, per="customer"))
        store.record_limits({"c": one, "api": to_json(RateLimit(rate=2, per=10))}, {})
        store.create(task("x0", 0, "c=A", "api"))
        store.create(task("x1", 1, "c=A", "api"))  # c=A full: waits under it alone
        store.create(task("y0", 2, "c=B", "api"))  # takes the second token
        store.create(task("y1", 3, "c=C", "api"))  # no token left: waits under api
        store.create(task("z0", 4, "c=D"))
        assert start(store, 100) == ["x0", "y0", "z0"]
        usage = [LimitUsage("c=A", 1, 1), LimitUsage("api", 0, 1), LimitUsage("c=B", 1, 0),
                 LimitUsage("c=D", 1, 0)]  # fmt: skip
        assert store.limit_usage() == usage
        finish(store, "x0")
        assert start(store, 101) == [], "x1 has its slot back but no token"
        assert start(store, 105) == ["x1"], "half a period: one token, to the oldest waiter"
        assert start(store, 110) == ["y1"]
    finally:
        store.close()


def test_a_rate_limit_has_its_burst_refills_on_the_clock_and_never_counts_back(
    database: Database,
) -> None:
    store = database.open()
    try:
        rate = to_json(RateLimit(rate=1, per=10, burst=2))
        store.record_limits({"api": rate}, {"export": ["api"]})
        for i in range(6):
            store.create(task(f"r{i}", i, "api"))
        assert start(store, 100) == ["r0", "r1"], "the burst"
        assert start(store, 105) == [], "half a token"
        assert start(store, 110) == ["r2"], "one token per 10 s"
        assert start(store, 50) == [], "a clock behind the last start refills nothing"
        assert start(store, 115) == [], "nor is the time counted back and given twice"
        assert start(store, 120) == ["r3"]
        assert store.limit_usage() == [LimitUsage("api", 0, 2)]
        assert start(store, 10**6) == ["r4", "r5"], "refilled to the burst, never above"
    finally:
        store.close()


def test_definitions_conflict_unless_replaced_and_an_unrecorded_ref_limits_nothing(
    store: Any,
) -> None:
    other = to_json(Concurrency(max=1, per="customer"))
    raises(LimitConflict, store.record_limits, {"x": TWO, "export.concurrency": other}, {})
    assert store.limit_definitions() == (
        {"export.concurrency": TWO}, {"export": ("export.concurrency",)}
    ), "nothing written by the refused call"  # fmt: skip
    raises(ValueError, store.record_limits, {}, {"t": ["missing"]})
    for i in range(3):
        store.create(task(f"n{i}", i, "nobody=A"))
    assert start(store, 100) == ["n0", "n1", "n2"]
    store.record_limits({"export.concurrency": other}, {}, replace=True)
    for i in range(3):
        store.create(task(f"a{i}", 10 + i, A))
    assert start(store, 101) == ["a0"], "the replaced definition holds"


def test_a_version_3_database_upgrades_and_limits_new_tasks(database: Database) -> None:
    _old_database(database, 3)
    store = database.open()
    try:
        assert store.limit_definitions() == ({}, {})
        store.record_limits({"export.concurrency": TWO}, {"export": ["export.concurrency"]})
        for i in range(3):
            store.create(task(f"a{i}", 10 + i, A))
        assert start(store, 100) == ["old-pending", "a0", "a1"]
        assert store.limit_usage() == [LimitUsage(A, 2, 1)]
    finally:
        store.close()


def test_postgres_concurrent_starts_never_exceed_max(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    on_postgres = SimpleNamespace(param="postgres", getfixturevalue=request.getfixturevalue)
    database = Database(on_postgres, tmp_path)  # type: ignore[arg-type]
    stores = [database.open() for _ in range(4)]
    try:
        stores[0].record_limits({"export.concurrency": TWO}, {"export": ["export.concurrency"]})
        for i in range(40):
            stores[0].create(task(f"a{i:02}", i, A))
        seen: list[int] = []
        errors: list[BaseException] = []

        def work(store: Any) -> None:
            try:
                for step in range(15):
                    now = at(100 + step)
                    for snapshot in store.start_tasks(owner="w", now=now, lease_until=at(200),
                                                      buckets=[0]):  # fmt: skip
                        seen.append(holders(database, A))
                        done = replace(snapshot, status=SUCCEEDED,
                                       status_version=snapshot.status_version + 1)  # fmt: skip
                        assert store.commit_tasks([(done, snapshot.status_version, [])]) == [None]
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert seen and max(seen) <= 2
        running = stores[0].query()
        assert sum(1 for t in running if t.status == RUNNING) <= 2
    finally:
        for s in stores:
            s.close()
        database.close()


def test_the_limit_statements_run_on_indexes_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement of the limits' paths (SQLite's plans) seeks an index: no holder count,
    wait or blocked-line check scans a table, so a backlog costs a start nothing."""
    from chongming_redis.stores import sqlite as sqlite_module
    from chongming_redis.stores.sqlite import SqliteTaskStore

    ran: list[tuple[str, list[object]]] = []
    for name in ("rows", "run"):
        real = getattr(sqlite_module._Tx, name)

        def traced(self: Any, sql: str, params: Any = (), _real: Any = real) -> Any:
            ran.append((sql, list(params)))
            return _real(self, sql, params)

        monkeypatch.setattr(sqlite_module._Tx, name, traced)
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    try:
        store.record_limits({"export.concurrency": TWO, "api": to_json(RateLimit(rate=5))}, {})
        for i in range(6):
            store.create(task(f"a{i}", i, A, "api"))
        ran.clear()
        assert start(store, 100) == ["a0", "a1"]
        finish(store, "a0")
        finish(store, "a2", PENDING)  # back to waiting
        assert start(store, 101) == ["a2"]
        store.limit_usage()
        plans = {sql: _plan(store, sql, params) for sql, params in ran if "limit_" in sql}
    finally:
        store.close()
    assert any("limit_waiters" in sql for sql in plans) and len(plans) > 5
    # limit_usage's GROUP BY reads every holder and waiter (a report, not a start), and the
    # definitions are read whole (a few rows); nothing else scans a table.
    big = ("tasks", "limit_holders", "limit_waiters", "limit_buckets", "w")
    scans = {sql: plan for sql, plan in plans.items() if "GROUP BY" not in sql
             and any(p.startswith("SCAN") and p.split()[1] in big for p in plan)}  # fmt: skip
    assert scans == {}
    used = " ".join(" ".join(plan) for plan in plans.values())
    assert "limit_waiters_by_task" in used
    # The start walks the partial index that leaves the parked tasks out, and the unpark finds
    # a ref's oldest parked tasks through their own.
    assert "tasks_start_free" in used and "tasks_parked" in used


def _plan(store: Any, sql: str, params: list[object]) -> list[str]:
    if sql.startswith("INSERT"):
        return []
    found = store._connection().execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    return [str(row[-1]) for row in found]


@pytest.mark.parametrize("seed", [1, 2])
def test_the_same_script_starts_what_the_in_memory_reference_starts(
    database: Database, seed: int
) -> None:
    """A seeded script of creates, starts and every way in and out of RUNNING, on the SQL store
    and the in-memory reference: the same tasks start, the same holders are reported."""
    import random

    from chongming_redis import InMemoryTaskStore

    rng = random.Random(seed)
    sql, memory = database.open(), InMemoryTaskStore()
    stores = (sql, memory)
    one = to_json(Concurrency(max=2, per="customer"))
    for s in stores:
        s.record_limits({"c": one, "r": to_json(RateLimit(rate=3, per=10, burst=2))}, {})
    now, made = 100.0, 0
    try:
        for _ in range(250):
            op = rng.random()
            if op < 0.4:
                refs = [f"c=K{rng.randrange(3)}"] + (["r"] if rng.random() < 0.3 else [])
                new = task(f"t{made:03}", now, *refs, priority=rng.randrange(2))
                made += 1
                for s in stores:
                    s.create(new)
            elif op < 0.7:
                now += rng.choice([0.0, 0.5, 2.0])
                size = rng.randrange(1, 4)
                assert start(sql, now, size) == start(memory, now, size)
            else:
                busy = [t.task_id for t in memory.query() if t.status in (RUNNING, PAUSED)]
                if busy:
                    task_id = rng.choice(busy)
                    status = rng.choice([SUCCEEDED, PAUSED, PENDING, LOST, RUNNING])
                    for s in stores:
                        finish(s, task_id, status)
            # The holders agree exactly; a waiter is counted under the refs that refused it
            # when it was last judged (a task left out by one blocked line is not judged against
            # its other refs in that call).
            assert _held(sql.limit_usage()) == _held(_as_sql_reports(memory.limit_usage()))
            assert _waiting(sql.limit_usage()) <= _waiting(memory.limit_usage())
    finally:
        sql.close()


def _as_sql_reports(usage: list[LimitUsage]) -> list[LimitUsage]:
    """The reference's usage with the rate ref holding nothing (``LimitUsage``: 0 for a rate
    limit; the reference counts its tasks running), busiest first."""
    fixed = [LimitUsage(u.ref, 0 if u.ref == "r" else u.held, u.waiting) for u in usage]
    kept = [u for u in fixed if u.held or u.waiting]
    return sorted(kept, key=lambda u: (-(u.held + u.waiting), u.ref))


def _held(usage: list[LimitUsage]) -> dict[str, int]:
    return {u.ref: u.held for u in usage if u.held}


def _waiting(usage: list[LimitUsage]) -> int:
    return sum(u.waiting for u in usage)


def test_a_parked_task_written_again_is_judged_afresh_and_never_stranded(
    store: Any, database: Database
) -> None:
    for i in range(5):
        store.create(task(f"a{i}", i, A))
    assert start(store, 100, limit=5) == ["a0", "a1"]
    parked = database.raw("SELECT task_id FROM tasks WHERE parked IS NOT NULL ORDER BY task_id")
    assert parked == [(_bound(database, t),) for t in ("a2", "a3", "a4")]
    finish(store, "a4", STOPPED)  # a write of the row: unparked, out of the start order
    finish(store, "a4", PENDING)  # retried by hand: judged afresh by the next start
    assert database.raw("SELECT parked FROM tasks WHERE task_id = ?", ["a4"]) == [(None,)]
    assert start(store, 101, limit=5) == []  # the ref is full: a4 is parked again
    assert database.raw("SELECT parked FROM tasks WHERE task_id = ?", ["a4"]) == [
        (_bound(database, A),)
    ]
    order = []
    for _ in range(3):
        finish(store, order[-1] if order else "a0")
        order += start(store, 102, limit=5)
    assert order == ["a2", "a3", "a4"], "oldest parked first, none left behind"
