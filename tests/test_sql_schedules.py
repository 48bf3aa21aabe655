"""The schedule records on the SQL stores (``SchedulesStore``, ``_sql/schedules.py``), on SQLite
and PostgreSQL, where the shipped contract cannot look:

* a tick's task is created by ``create``'s own statements: its tags index, its feed position,
  its limit holds; a refused write (version, unique id) issues no feed position;
* the state is kept exactly as given (NUL, a lone surrogate, non-ASCII), as text in the table;
* a version-4 database upgrades to the ``schedules`` table and keeps its rows;
* PostgreSQL: stores on their own connections firing one tick from one version, round after
  round, make one task and one version per round, while other writers create tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from chongming_redis import TaskQuery, TaskSnapshot
from chongming_redis.errors import ScheduleConflict, UniqueTaken
from chongming_redis.limits import Concurrency, to_json
from chongming_redis.stores._sql.schema import SCHEMA_VERSION
from chongming_redis.testing.contract.support import PENDING, RUNNING, at, raises
from tests.test_sql_task_policies import OLD_ROWS, Database, _old_database


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    made = Database(request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def store(database: Database) -> Iterator[Any]:
    made = database.open()
    yield made
    made.close()


def tick(task_id: str, **fields: Any) -> TaskSnapshot:
    return replace(TaskSnapshot(task_id, "report", PENDING, 1, at(10), at(10)), **fields)


def test_a_tick_task_is_created_as_create_creates_it(store: Any, database: Database) -> None:
    store.record_limits({"one": to_json(Concurrency(max=1))}, {"report": ["one"]})
    store.write_schedule("nightly", "v1", expect_version=0)
    head = store.feed_stats().head
    made = tick("t1", tags=frozenset({"nightly", "x"}), limits=("one",), bucket=3)
    assert store.write_schedule("nightly", "v2", expect_version=1, task=made) == (2, True)
    assert store.get("t1") == made
    assert [t.task_id for t in store.query(TaskQuery(tag="nightly"))] == ["t1"]
    assert store.feed_stats().head == head + 1
    assert [c.task_id for c in store.changes(str(head)).tasks] == ["t1"]
    started = store.start_tasks(owner="w", now=at(20), lease_until=at(50), buckets=[3])
    assert [s.task_id for s in started] == ["t1"]
    ((held,),) = database.raw("SELECT COUNT(*) FROM limit_holders WHERE task_id = ?", ["t1"])
    assert held == 1


def test_a_refused_write_issues_no_feed_position_and_writes_nothing(store: Any) -> None:
    store.create(tick("holder", unique="day"))
    store.write_schedule("s", "v1", expect_version=0)
    head = store.feed_stats().head
    raises(UniqueTaken, store.write_schedule, "s", "v2", expect_version=1,
           task=tick("t", unique="day"))  # fmt: skip
    raises(ScheduleConflict, store.write_schedule, "s", "v2", expect_version=2, task=tick("t"))
    assert store.feed_stats().head == head and store.get("t") is None
    assert store.schedule_record("s") == (1, "v1")
    # an existing task id: not written again, no position issued, the state still written
    store.create(tick("t", status=RUNNING, status_version=2))
    head = store.feed_stats().head
    assert store.write_schedule("s", "v2", expect_version=1, task=tick("t")) == (2, False)
    assert store.feed_stats().head == head and store.get("t").status == RUNNING


def test_the_state_is_kept_exactly_as_given(store: Any, database: Database) -> None:
    states = {"nul": "a\x00b", "lone": "x\ud800y", "wide": "Grüße ☃ \U0001f600", "empty": ""}
    for name, state in states.items():
        assert store.write_schedule(name, state, expect_version=0) == (1, False)
    assert store.schedule_records() == {name: (1, s) for name, s in states.items()}
    assert store.schedule_record("lone") == (1, "x\ud800y")
    assert store.write_schedule("lone", "fine", expect_version=1) == (2, False)
    assert store.schedule_record("lone") == (2, "fine")
    if database.kind == "sqlite":  # valid text is stored as text
        assert database.raw("SELECT state FROM schedules WHERE id = ?", ["wide"]) == [
            (states["wide"],)
        ]


def test_a_version_4_database_upgrades_and_keeps_its_rows(database: Database) -> None:
    _old_database(database, 4)
    store = database.open()
    try:
        versions = [v for (v,) in database.raw("SELECT version FROM schema_version")]
        assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 5
        assert store.query() == OLD_ROWS
        assert store.schedule_records() == {}
        assert store.write_schedule("s", "v1", expect_version=0, task=tick("new")) == (1, True)
        assert store.feed_stats().head == len(OLD_ROWS) + 1
    finally:
        store.close()
    again = database.open()  # reopening migrates nothing more
    try:
        assert again.schedule_records() == {"s": (1, "v1")} and again.get("new") == tick("new")
    finally:
        again.close()


def test_postgres_racing_firings_make_one_task_per_version(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    on_postgres = SimpleNamespace(param="postgres", getfixturevalue=request.getfixturevalue)
    database = Database(on_postgres, tmp_path)  # type: ignore[arg-type]
    stores = [database.open() for _ in range(4)]
    rounds = 15
    try:
        stores[0].write_schedule("every", "v1", expect_version=0)
        wins: list[tuple[int, int]] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(stores) + 1)

        def fire(n: int, store: Any) -> None:
            try:
                for version in range(1, rounds + 1):
                    barrier.wait(30)
                    try:
                        store.write_schedule("every", f"{version} by {n}", expect_version=version,
                                             task=tick(f"every@{version}-{n}"))  # fmt: skip
                        wins.append((version, n))
                    except ScheduleConflict as exc:
                        assert exc.actual == version + 1
                    barrier.wait(30)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        def other() -> None:  # plain creates meanwhile: the feed head is taken by both
            try:
                for version in range(1, rounds + 1):
                    barrier.wait(30)
                    stores[0].create(tick(f"plain-{version}", name="plain"))
                    barrier.wait(30)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=fire, args=(n, s)) for n, s in enumerate(stores)]
        threads.append(threading.Thread(target=other))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert sorted(v for v, _ in wins) == list(range(1, rounds + 1))
        made = sorted(t.task_id for t in stores[0].query(TaskQuery(name="report")))
        assert made == sorted(f"every@{v}-{n}" for v, n in wins)
        last = max(wins)
        assert stores[0].schedule_record("every") == (rounds + 1, f"{rounds} by {last[1]}")
        assert stores[0].feed_stats().head == 2 * rounds
    finally:
        for s in stores:
            s.close()
        database.close()
