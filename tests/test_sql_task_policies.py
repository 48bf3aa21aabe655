"""The task policies on the SQL stores (``TaskPoliciesStore``), on SQLite and PostgreSQL, where
the shipped contract cannot look: the schema behind them and what it must agree with.

* the five policy fields round-trip through every read and write path;
* unique ids: taken by a create, refused with nothing written (nor a feed position issued),
  let go by the write that finishes the holder, taken again by a retry by hand or refused, gone
  with prune; ``commit_tasks`` refuses per item, judged against the state before the call; the
  database itself refuses a second unfinished holder, also to racing writers;
* ``start_tasks`` writes the deadline in the same statement;
* ``expire_finished`` / ``expiry_backlog``: the same ids, order, tombstones and backlog as the
  in-memory reference over one script; history, tags and the command listing gone;
* the lookups run on the new indexes (SQLite's query plans);
* a version-1 or version-2 database upgrades in place and keeps its rows.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chongming_redis import (
    InMemoryTaskStore,
    StoreClosed,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Tombstone,
)
from chongming_redis.errors import (
    ConcurrencyConflict,
    ParentNotFound,
    TaskAlreadyExists,
    UniqueTaken,
)
from chongming_redis.policy import RetryPolicy
from chongming_redis.stores._sql.pg_connection import POSTGRES, _bound
from chongming_redis.stores._sql.rows import values_of
from chongming_redis.stores._sql.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SQLITE,
    format_placeholders,
    version_table,
)
from chongming_redis.stores.codec import (
    PARENT_COLUMNS,
    SNAPSHOT_COLUMNS,
    command_to_row,
    encode_dt,
    snapshot_to_row,
    transition_to_row,
)
from chongming_redis.stores.extensions import extensions_of
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.testing.contract.support import (
    FAILED,
    LOST,
    PAUSED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    at,
    command,
    raises,
    snapshot,
    transition,
)

US2 = timedelta(microseconds=2)
POLICY = RetryPolicy(max_attempts=5, base_delay=0.5, retry_on=(KeyError, "app.errors.Flaky"))


class Database:
    """One SQLite file or PostgreSQL schema: stores opened on it, and statements run on it by
    another client (``raw``: autocommit, shared ``?`` SQL, ``str`` bound as the store binds it)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind: str = request.param
        self.dialect = SQLITE if self.kind == "sqlite" else POSTGRES
        if self.kind == "sqlite":
            self._path = tmp_path / "tasks.sqlite3"
            self._sqlite = sqlite3.connect(self._path, isolation_level=None)
        else:
            self._dsn = request.getfixturevalue("postgres_proc").dsn
            self._schema = f"p_{uuid.uuid4().hex[:12]}"
            self._pg = psycopg.connect(self._dsn, autocommit=True)
            self._pg.execute(f'CREATE SCHEMA "{self._schema}"')
            self._pg.execute(f'SET search_path TO "{self._schema}"')

    def open(self) -> Any:
        if self.kind == "sqlite":
            return SqliteTaskStore(self._path)
        return PostgresTaskStore(self._dsn, schema=self._schema)

    def raw(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            return self._sqlite.execute(sql, params).fetchall()
        cursor = self._pg.execute(format_placeholders(sql), _bound(params))
        return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        if self.kind == "sqlite":
            self._sqlite.close()
        else:
            self._pg.execute(f'DROP SCHEMA "{self._schema}" CASCADE')
            self._pg.close()


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


def held(task_id: str, unique: str, status: Any = PENDING, **fields: Any) -> TaskSnapshot:
    return snapshot(task_id, status=status, unique=unique, **fields)


def moved(task: TaskSnapshot, status: Any, **fields: Any) -> TaskSnapshot:
    """``task`` one version on, in ``status``."""
    return replace(task, status=status, status_version=task.status_version + 1, **fields)


def described(results: list[Any]) -> list[tuple[type, str]]:
    """``commit_tasks`` results, comparable (errors are not equal to equal errors)."""
    return [(type(r), str(r)) for r in results]


# -- the fields --------------------------------------------------------------------------------


def test_the_five_policy_fields_round_trip_on_every_path(store: Any) -> None:
    assert extensions_of(store) >= {"TaskPoliciesStore"}
    full = snapshot("a", retry=POLICY, timeout=2.25, deadline=at(7.000001), retention=86400.5,
                    unique="NUL\x00'quote\"-任务")  # fmt: skip
    store.create(full)
    assert store.get("a") == full
    assert store.query() == [full] and store.query_page() == [full]
    assert store.changes().tasks == (full,)
    again = moved(full, PAUSED, retry=None, timeout=None, deadline=None, retention=None)
    store.save(again, expect_version=1)
    assert store.get("a") == again  # a save clears them as it writes them
    made = snapshot("b", retry=POLICY, retention=1.0, unique="u-b", created=1)
    assert store.commit_tasks([(made, None, [])]) == [None] and store.get("b") == made
    finished = moved(made, SUCCEEDED, timeout=0.001)
    assert store.commit_tasks([(finished, 1, [])]) == [None] and store.get("b") == finished
    assert store.query() == [again, finished]


def test_start_tasks_writes_the_deadline_of_a_task_with_a_timeout_and_keeps_the_others(
    store: Any,
) -> None:
    reference = InMemoryTaskStore()
    for s in (store, reference):
        s.create(snapshot("timed", timeout=2.5, deadline=at(-50)))
        s.create(snapshot("untimed", deadline=at(-60), created=1))
        s.create(snapshot("plain", created=2))
    started = store.start_tasks(owner="w", now=at(10), lease_until=at(20), buckets=[0])
    assert {t.task_id: t.deadline for t in started} == {
        "timed": at(12.5),  # this attempt's: the start + the timeout
        "untimed": at(-60),
        "plain": None,
    }
    assert [store.get(t.task_id) for t in started] == started
    expected = reference.start_tasks(owner="w", now=at(10), lease_until=at(20), buckets=[0])
    assert started == expected


# -- unique ids ------------------------------------------------------------------------------


def test_a_unique_id_is_taken_refused_released_taken_again_and_gone_with_prune(
    store: Any,
) -> None:
    a = held("a", "u")
    store.create(a)
    assert store.unique_holder("u") == "a" and store.unique_holder("v") is None
    head = store.feed_stats().head
    taken = raises(UniqueTaken, store.create, held("b", "u"))
    assert (taken.unique, taken.holder) == ("u", "a")
    assert store.get("b") is None and store.feed_stats().head == head  # nothing written
    assert isinstance(raises(TaskAlreadyExists, store.create, held("a", "u")), TaskAlreadyExists)
    store.create(held("final", "u", status=SUCCEEDED))  # a finished task holds nothing
    running = moved(a, RUNNING)
    store.save(running, expect_version=1)
    assert store.unique_holder("u") == "a"  # unfinished to unfinished: still held
    done = moved(running, FAILED)
    store.save(done, expect_version=2)  # the very write that finishes it lets the id go
    assert store.unique_holder("u") is None
    store.create(held("b", "u"))
    retried = moved(done, PENDING)
    stale = raises(ConcurrencyConflict, store.save, retried, expect_version=1)
    assert stale.actual == 3  # the version is judged before the unique id
    refused = raises(UniqueTaken, store.save, retried, expect_version=3)
    assert (refused.unique, refused.holder) == ("u", "b") and store.get("a") == done
    store.save(moved(store.get("b"), STOPPED), expect_version=1)
    store.save(retried, expect_version=3)  # the retry by hand takes it again
    assert store.unique_holder("u") == "a"
    store.save(moved(retried, LOST), expect_version=4)
    assert store.prune(keep_terminal=0) == 3 and store.unique_holder("u") is None
    store.create(held("c", "u"))
    assert store.unique_holder("u") == "c"


def test_commit_tasks_takes_unique_ids_in_item_order(store: Any) -> None:
    """The item that finishes ``h`` lands, and frees ``h``'s id for the item after it, which
    takes it, as the reference judges it; ``w``'s holder keeps ``w``."""
    reference = InMemoryTaskStore()
    holder = held("h", "u")
    items = [
        (moved(holder, SUCCEEDED), 1, [transition("h", 2, to=SUCCEEDED)]),
        (held("b", "u"), None, [transition("b", 1, to=PENDING)]),  # h just let it go
        (held("c", "v"), None, [transition("c", 1, to=PENDING)]),
        (held("h2", "w", status=SUCCEEDED), None, []),
    ]
    for s in (store, reference):
        s.create(holder)
        s.create(held("w-holder", "w"))
    results = store.commit_tasks(items)
    assert described(results) == described(reference.commit_tasks(items))
    assert [type(r) for r in results] == [type(None)] * 4
    assert store.history("b") == [transition("b", 1, to=PENDING)]
    assert store.history("c") == [transition("c", 1, to=PENDING)]
    assert store.unique_holder("u") == "b" and store.unique_holder("v") == "c"
    assert store.unique_holder("w") == "w-holder"  # h2 is finished: it takes nothing
    again = store.commit_tasks([(held("b2", "u"), None, [])])
    assert isinstance(again[0], UniqueTaken) and again[0].holder == "b"
    assert store.get("b2") is None


def test_the_database_keeps_one_unfinished_holder_even_within_one_commit(store: Any) -> None:
    """Two creates of one unique id in one call: the second is refused, naming the first (and
    the unique index would refuse it anyway)."""
    results = store.commit_tasks([(held("x", "u"), None, []), (held("y", "u"), None, [])])
    assert results[0] is None and isinstance(results[1], UniqueTaken)
    assert (results[1].unique, results[1].holder) == ("u", "x")
    assert store.get("y") is None and store.unique_holder("u") == "x"


def test_racing_creates_of_one_unique_id_leave_exactly_one_holder(store: Any) -> None:
    go = threading.Barrier(6)

    def submit(n: int) -> str:
        go.wait()
        try:
            store.create(held(f"r{n}", "shared"))
            return "created"
        except UniqueTaken as exc:
            return "taken:" + exc.holder

    with ThreadPoolExecutor(6) as pool:
        outcomes = sorted(pool.map(submit, range(6)))
    assert outcomes == ["created"] + [f"taken:{store.unique_holder('shared')}"] * 5


# -- retention -------------------------------------------------------------------------------


def _expiry_script(s: Any) -> list[object]:
    """One script of finished, unfinished and kept tasks, expired step by step: what it
    returns, and the feed, must be the reference's."""
    made = [
        snapshot("a", status=SUCCEEDED, retention=10.0, created=100, tags=frozenset({"t"})),
        snapshot("b", status=FAILED, retention=5.0, created=100),
        snapshot("c", status=STOPPED, retention=5.0, created=100),  # ties b: by id
        snapshot("d", status=LOST, retention=0.5, created=200),
        snapshot("tiny", status=SUCCEEDED, retention=2.5e-6, created=300),  # rounding of µs
        snapshot("kept", status=SUCCEEDED, created=0),  # no retention: kept forever
        snapshot("late", status=SUCCEEDED, retention=1000.0, created=100),
        *(snapshot(f"live-{st.value}", status=st, retention=1.0) for st in (PENDING, RUNNING)),
    ]
    for task in made:
        s.create(task)
    s.append(transition("b", 1, to=FAILED))
    s.submit_command(command("cb", task_id="b"))
    s.save(moved(s.get("late"), PENDING), expect_version=1)  # retried by hand: kept again
    s.touch("a", heartbeat_at=at(500))  # a touch never moves an expiry
    log: list[object] = [s.expiry_backlog(now=at(104.999999)), s.expire_finished(now=at(104))]
    log += [s.expiry_backlog(now=at(150)), s.expire_finished(now=at(150), limit=2)]
    log += [s.expire_finished(now=at(150)), s.expire_finished(now=at(150))]
    log += [s.expire_finished(now=at(300) + US2)]
    log += [s.expiry_backlog(now=at(10**6)), s.expire_finished(now=at(10**6), limit=1000)]
    log += [s.history("b"), s.task_commands("b"), s.get_command("cb"), s.query()]
    log += [s.changes(limit=100).tasks, s.counts()]
    return log


def test_expire_finished_removes_what_the_reference_removes_in_its_order(store: Any) -> None:
    log = _expiry_script(store)
    assert log == _expiry_script(InMemoryTaskStore())
    assert log[:9] == [
        (0, at(105)),
        [],
        (3, at(200.5)),
        ["b", "c"],  # earliest expiry first, bounded by limit, ties by id
        ["a"],
        [],
        ["d", "tiny"],
        (0, None),
        [],
    ]
    history, listing, kept_command = log[9:12]
    assert history == [] and listing == [] and kept_command is not None
    graves = [i for i in log[13] if isinstance(i, Tombstone)]  # type: ignore[attr-defined]
    assert [(g.task_id, g.removed_at) for g in graves] == [
        ("b", at(150)), ("c", at(150)), ("a", at(150)),
        ("d", at(300) + US2), ("tiny", at(300) + US2),
    ]  # fmt: skip
    kept = {t.task_id for t in log[12]}  # type: ignore[attr-defined]
    assert kept == {"kept", "late", "live-pending", "live-running"}


def test_the_policy_methods_check_their_arguments_and_a_closed_store(store: Any) -> None:
    naive = at(0).replace(tzinfo=None)
    bad: list[Callable[[], object]] = [
        *(lambda n=n: store.expire_finished(now=at(0), limit=n) for n in (0, 1001, True, 1.0)),
        lambda: store.expire_finished(now=naive),
        lambda: store.expiry_backlog(now=naive),
        lambda: store.unique_holder(""),
        lambda: store.unique_holder(5),
    ]
    for call in bad:
        with pytest.raises((TypeError, ValueError)):
            call()
    store.close()
    raises(StoreClosed, store.expire_finished, now=at(0))
    raises(StoreClosed, store.expiry_backlog, now=at(0))
    raises(StoreClosed, store.unique_holder, "u")


# -- the schema --------------------------------------------------------------------------------


def test_the_database_itself_refuses_a_second_unfinished_holder(
    store: Any, database: Database
) -> None:
    store.create(held("a", "u", status=RUNNING))
    store.create(held("b", "v"))
    store.create(held("gone", "w", status=SUCCEEDED))
    steal = "UPDATE tasks SET unique_id = ? WHERE task_id = ?"  # another client, no checks
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):
        database.raw(steal, ["u", "b"])
    database.raw(steal, ["u", "gone"])  # a finished row holds nothing: not in the index
    assert store.unique_holder("u") == "a" and store.get("b") == held("b", "v")


def test_the_expiry_follows_every_write_of_the_row(store: Any, database: Database) -> None:
    def expiry() -> object:
        ((value,),) = database.raw("SELECT expires_at FROM tasks WHERE task_id = ?", ["t"])
        return value

    task = snapshot("t", retention=1.5, timeout=3.0)
    store.create(task)
    assert expiry() is None  # unfinished
    done = moved(task, SUCCEEDED, updated_at=at(10))
    store.save(done, expect_version=1)
    assert expiry() == encode_dt(at(11.5))
    store.touch("t", heartbeat_at=at(99))
    assert expiry() == encode_dt(at(11.5))
    back = moved(done, PENDING, updated_at=at(20))
    assert store.commit_tasks([(back, 2, [])]) == [None] and expiry() is None
    (started,) = store.start_tasks(owner="w", now=at(30), lease_until=at(40), buckets=[0])
    assert expiry() is None and started.deadline == at(33)
    store.save(moved(started, LOST, updated_at=at(50)), expect_version=4)
    assert expiry() == encode_dt(at(51.5))


def test_the_policy_statements_run_on_the_new_indexes_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement of the policy paths (SQLite's plans): the unique lookups on
    ``tasks_unique``, the expiry on ``tasks_expiry``, and nothing scans a table."""
    from chongming_redis.stores import sqlite as sqlite_module

    ran: list[tuple[str, list[object]]] = []
    for name in ("rows", "run"):
        real = getattr(sqlite_module._Tx, name)

        def traced(self: Any, sql: str, params: Any = (), _real: Any = real) -> Any:
            ran.append((sql, list(params)))
            return _real(self, sql, params)

        monkeypatch.setattr(sqlite_module._Tx, name, traced)
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    try:
        ran.clear()
        store.create(held("a", "u"))
        raises(UniqueTaken, store.create, held("b", "u"))
        store.save(moved(held("a", "u"), SUCCEEDED, retention=1.0), expect_version=1)
        store.save(moved(held("a", "u", version=2), PENDING), expect_version=2)
        store.commit_tasks([(held("c", "v"), None, []), (held("d", "u"), None, [])])
        store.unique_holder("u")
        store.save(moved(held("a", "u", version=3), FAILED, retention=1.0), expect_version=3)
        store.expiry_backlog(now=at(100))
        store.expire_finished(now=at(100))
        plans = {sql: _plan(store, sql, params) for sql, params in ran}
    finally:
        store.close()
    scans = {sql: plan for sql, plan in plans.items() if any(p.startswith("SCAN") for p in plan)}
    assert scans == {}
    used = " ".join(" ".join(plan) for plan in plans.values())
    assert "INDEX tasks_unique" in used and "INDEX tasks_expiry" in used
    unique_lookups = [plan for sql, plan in plans.items() if "unique_id = ?" in sql]
    assert unique_lookups and all("tasks_unique" in " ".join(p) for p in unique_lookups)


def _plan(store: SqliteTaskStore, sql: str, params: list[object]) -> list[str]:
    if sql.startswith(("BEGIN", "COMMIT", "INSERT INTO tasks", "INSERT INTO history")):
        return []
    found = store._connection().execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    return [str(row[-1]) for row in found]


# -- the upgrade -----------------------------------------------------------------------------

OLD_ROWS = [
    snapshot("old-done", status=SUCCEEDED, created=1, tags=frozenset({"x"}), params={"n": 1}),
    snapshot("old-pending", created=2, key="k", not_before=at(3)),
]


def _old_database(database: Database, version: int) -> None:
    """A database as the release at ``version`` left it: its migrations only, rows written
    with its columns, a history entry, a tag and a command."""
    database.raw(version_table(database.dialect))
    for step in range(1, version + 1):
        for statement in MIGRATIONS[step](database.dialect):
            database.raw(statement)
        _insert(database, "schema_version", {"version": step, "applied_at": 0})
    old = [c for c in SNAPSHOT_COLUMNS if c not in _NEWER[version]]
    for position, task in enumerate(OLD_ROWS, start=1):
        row = snapshot_to_row(task)
        _insert(
            database, "tasks", {**dict(zip(old, values_of(row, old))), "feed_position": position}
        )
    _insert(database, "task_tags", {"tag": "x", "task_id": "old-done"})
    _insert(database, "meta", {"name": "feed_head", "value": len(OLD_ROWS)})
    entry = transition_to_row(transition("old-done", 1, to=SUCCEEDED, reason="made"))
    _insert(database, "history", entry)
    _insert(
        database, "commands", {**command_to_row(command("c-old", task_id="old-done")), "listed": 1}
    )


def _insert(database: Database, table: str, row: dict[str, Any]) -> None:
    columns = ", ".join(f'"{c}"' for c in row)
    database.raw(
        f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )


_POLICY_COLUMNS = ("retry_policy", "timeout_s", "deadline", "retention_s", "unique_id")
#: The columns a database of each old version lacks (version 4 added ``limit_refs``, version 7
#: ``parents`` and ``on_parent_failure``).
_NEWER = {
    1: ("priority", *_POLICY_COLUMNS, "limit_refs", *PARENT_COLUMNS),
    2: (*_POLICY_COLUMNS, "limit_refs", *PARENT_COLUMNS),
    3: ("limit_refs", *PARENT_COLUMNS),
    4: PARENT_COLUMNS,  # version 5 added a table (schedules), no column
    6: PARENT_COLUMNS,  # version 6 added ``parked``, which no snapshot carries
    7: (),  # version 8 added a table (task_schemas), no column
}


@pytest.mark.parametrize("version", [1, 2, 3, 4, 6, 7])
def test_an_old_database_upgrades_in_place_and_keeps_its_rows(
    database: Database, version: int
) -> None:
    _old_database(database, version)
    store = database.open()
    try:
        assert [v for (v,) in database.raw("SELECT version FROM schema_version")] == list(
            range(1, SCHEMA_VERSION + 1)
        )
        assert store.query() == OLD_ROWS  # no policies, priority 0: as they were written
        assert [t.task_id for t in store.query(TaskQuery(tag="x"))] == ["old-done"]
        assert store.history("old-done") == [transition("old-done", 1, to=SUCCEEDED, reason="made")]
        assert store.feed_stats().head == len(OLD_ROWS)
        assert [c.command_id for c in store.task_commands("old-done")] == ["c-old"]
        assert store.expiry_backlog(now=at(10**6)) == (0, None)  # kept forever: no retention
        store.create(held("new", "u", created=3))
        raises(UniqueTaken, store.create, held("newer", "u"))
        assert store.expire_finished(now=at(10**6)) == []
        assert store.prune(keep_terminal=0) == 1 and store.get("old-done") is None
        assert store.task_commands("old-done") == [] and store.get_command("c-old") is not None
        # The dependencies' columns and tables (version 7) work on the upgraded rows.
        store.create(snapshot("after-new", status=TaskStatus.WAITING, parents=("new",)))
        raises(ParentNotFound, store.create, snapshot("orphan", status=TaskStatus.WAITING,
                                                      parents=("old-done",)))  # fmt: skip
        assert store.get("after-new").status is TaskStatus.WAITING  # type: ignore[union-attr]
    finally:
        store.close()
    again = database.open()  # reopening migrates nothing more
    try:
        assert again.get("new") == held("new", "u", created=3)
    finally:
        again.close()
