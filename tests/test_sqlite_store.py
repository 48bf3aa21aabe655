"""What only ``SqliteTaskStore`` promises, beyond the shipped suites (contract, extensions, feed,
bad input, cross-process races and the stateful equivalence run elsewhere):

* a file path only: ``:memory:``, ``file:`` URIs and the empty path are refused, a relative path
  is made absolute; WAL and ``synchronous`` as documented;
* the schema: created and versioned on first open, reopened as is, a newer version refused with
  nothing written;
* the write lock: a writer that cannot get it within the busy timeout fails with
  ``StoreUnavailable`` and writes nothing, while readers go on; a writer SIGKILLed inside its
  transaction leaves nothing behind and blocks no one;
* corrupt data (a row written by another client, a file that is not a database) is
  ``CorruptRecord`` naming the key and the column, and changes nothing;
* connections: one per thread, all closed by ``close()``; a forked child opens its own;
* filters and claims run on indexes (``EXPLAIN QUERY PLAN``), large bucket sets included;
* what no protocol method returns: the first outcome of a completed command stays.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from chongming_redis import (
    Command,
    CommandKind,
    CorruptRecord,
    InMemoryTaskStore,
    StoreClosed,
    StoreUnavailable,
    TaskQuery,
    TaskStatus,
)
from chongming_redis.errors import ConcurrencyConflict, UnsupportedSchema
from chongming_redis.stores._sql.query import prefix_successor, select_tasks
from chongming_redis.stores._sql.schema import SCHEMA_VERSION, SQLITE
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.testing.contract.support import at, snapshot


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "tasks.sqlite3"


@pytest.fixture
def store(path: Path) -> Any:
    s = SqliteTaskStore(path)
    yield s
    s.close()


def raw(path: Path) -> sqlite3.Connection:
    """Another client of the same file (autocommit: each statement is its own transaction)."""
    return sqlite3.connect(path, isolation_level=None)


def table_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with closing(raw(path)) as db:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: sorted(db.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}


# -- the path and the pragmas ----------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [":memory:", "", "file::memory:", "file:x.db?mode=memory&cache=shared", "file:x.db"]
)
def test_an_in_memory_database_or_a_uri_is_refused_before_anything_is_opened(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="in-memory database is private"):
        SqliteTaskStore(bad)
    assert list(tmp_path.iterdir()) == []  # no file was created for it


def test_a_path_must_be_text_and_a_relative_one_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TypeError):
        SqliteTaskStore(b"tasks.sqlite3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        SqliteTaskStore("a\x00b")
    monkeypatch.chdir(tmp_path)
    store = SqliteTaskStore("relative.sqlite3")
    try:
        assert store.path == str(tmp_path / "relative.sqlite3")
    finally:
        store.close()


@pytest.mark.parametrize(("setting", "code"), [("FULL", 2), ("NORMAL", 1)])
def test_the_journal_is_wal_and_synchronous_is_as_asked(
    path: Path, setting: str, code: int
) -> None:
    store = SqliteTaskStore(path, synchronous=setting)
    try:
        connection = store._connection()
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA synchronous").fetchone() == (code,)
    finally:
        store.close()
    with pytest.raises(ValueError, match="synchronous"):
        SqliteTaskStore(path, synchronous="OFF")
    with pytest.raises(ValueError):
        SqliteTaskStore(path, busy_timeout=0)


def _open_new_files_in_step(directory: str, files: int, barrier: Any, results: Any) -> None:
    """One of the processes below: for each new file, wait for the others, then open it."""
    failures = []
    for k in range(files):
        barrier.wait(timeout=60)
        try:
            SqliteTaskStore(os.path.join(directory, f"{k}.sqlite3")).close()
        except StoreUnavailable as exc:
            failures.append(str(exc))
    results.put(failures)


def test_processes_opening_a_new_file_at_the_same_moment_all_open_it(tmp_path: Path) -> None:
    """Making a new file WAL upgrades a read lock to a write lock, for which SQLite never calls
    the busy handler: without a retry about one open in forty failed at once here (two worker
    children of one parent starting on a new file)."""
    context = multiprocessing.get_context("spawn")  # no fork of the test process's threads
    processes, files = 4, 40
    barrier, results = context.Barrier(processes), context.Queue()
    openers = [context.Process(target=_open_new_files_in_step,
                               args=(str(tmp_path), files, barrier, results))
               for _ in range(processes)]  # fmt: skip
    for opener in openers:
        opener.start()
    failures = [results.get(timeout=120) for _ in openers]
    for opener in openers:
        opener.join(30)
    assert failures == [[]] * processes
    for k in range(files):
        with closing(raw(tmp_path / f"{k}.sqlite3")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (SCHEMA_VERSION,)


def test_a_new_file_locked_past_the_busy_timeout_is_unavailable_and_left_as_it_was(
    path: Path,
) -> None:
    with closing(raw(path)) as other:
        other.execute("CREATE TABLE theirs (x)")
        other.execute("BEGIN EXCLUSIVE")  # another client holds the file (not WAL yet)
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"busy timeout .*while opening"):
            SqliteTaskStore(path, busy_timeout=0.3)
        assert time.monotonic() - began >= 0.3  # it waited for the lock, then gave up
        other.execute("COMMIT")
        assert other.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        names = other.execute("SELECT name FROM sqlite_master").fetchall()
        assert names == [("theirs",)]  # no schema written


# -- the schema ------------------------------------------------------------------------------


def test_the_schema_is_created_once_and_its_version_recorded(path: Path) -> None:
    SqliteTaskStore(path).close()
    with closing(raw(path)) as db:
        versions = db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    again = SqliteTaskStore(path)  # reopening migrates nothing and keeps the data
    again.create(snapshot("a"))
    again.close()
    reopened = SqliteTaskStore(path)
    try:
        assert reopened.get("a") == snapshot("a")
    finally:
        reopened.close()
    with closing(raw(path)) as db:
        assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (SCHEMA_VERSION,)


def test_a_database_of_a_newer_schema_is_refused_and_left_as_it_was(path: Path) -> None:
    SqliteTaskStore(path).close()
    with closing(raw(path)) as db:
        db.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    before = table_rows(path)
    with pytest.raises(UnsupportedSchema) as caught:
        SqliteTaskStore(path)
    assert (caught.value.found, caught.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert str(path) in str(caught.value)
    assert table_rows(path) == before


# -- the write lock --------------------------------------------------------------------------


def test_a_writer_that_cannot_get_the_lock_is_unavailable_and_writes_nothing(path: Path) -> None:
    store = SqliteTaskStore(path, busy_timeout=0.2)
    store.create(snapshot("a"))
    store.submit_command(Command("c1", "a", CommandKind.STOP, at(0)))
    before = table_rows(path)
    holder = raw(path)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, mid-transaction
    try:
        writes = [
            lambda: store.save(snapshot("a", version=2), expect_version=1),
            lambda: store.create(snapshot("b")),
            lambda: store.claim_commands(now=at(1), lease_seconds=5),
            lambda: store.touch("a", heartbeat_at=at(2)),
        ]
        for write in writes:
            with pytest.raises(StoreUnavailable, match="nothing was written"):
                write()
        assert store.get("a") == snapshot("a")  # WAL: readers never wait for the writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert table_rows(path) == before
    store.save(snapshot("a", version=2), expect_version=1)  # the lock is free again
    with pytest.raises(ConcurrencyConflict):
        store.save(snapshot("a", version=3), expect_version=1)
    store.close()


def test_a_writer_killed_inside_its_transaction_leaves_nothing_and_blocks_no_one(
    path: Path, store: Any
) -> None:
    store.create(snapshot("a"))
    before = table_rows(path)
    script = (
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "db.execute('UPDATE tasks SET status_version = 99 WHERE task_id = ?', ('a',))\n"
        "db.execute('DELETE FROM task_tags')\n"
        "print('inside', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"inside\n"
    finally:
        child.kill()  # SIGKILL, holding the write lock with half its writes done
        child.wait(10)
        assert child.stdout is not None
        child.stdout.close()
    assert table_rows(path) == before  # the dead transaction is gone
    store.save(snapshot("a", version=2), expect_version=1)  # and so is its lock
    assert store.get("a") == snapshot("a", version=2)


@pytest.mark.parametrize(
    ("error", "says"),
    [("disk I/O error", "the outcome is unknown"), ("database is locked", "nothing was written")],
)
def test_a_failed_commit_says_whether_the_write_may_have_landed(
    store: Any, error: str, says: str
) -> None:
    store.create(snapshot("a"))
    connection = store._connection()
    execute = connection.execute

    def failing_commit(sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError(error)
        return execute(sql, *args)

    connection.execute = failing_commit
    with pytest.raises(StoreUnavailable, match=says):
        store.save(snapshot("a", version=2), expect_version=1)
    connection.execute = execute
    assert store.get("a") == snapshot("a")  # rolled back: here it did not land


# -- corrupt data ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [("status", "bogus"), ("status_version", "abc"), ("tags", "{"), ("params", b"\xc1"),
     ("lease_until", -5), ("created_at", 2**60), ("name", b"\xff\xfe")],
)  # fmt: skip
def test_a_corrupt_task_row_is_corrupt_record_naming_key_and_column(
    path: Path, store: Any, column: str, value: object
) -> None:
    store.create(snapshot("a", lease_owner="w", lease_until=at(5)))
    with closing(raw(path)) as db:
        db.execute(f'UPDATE tasks SET "{column}" = ?', (value,))
    before = table_rows(path)
    calls = (lambda: store.get("a"), lambda: store.query(), lambda: store.changes())
    if column == "status":  # counts() and bucket_counts() read it without reading the row
        calls += (lambda: store.counts(), lambda: store.bucket_counts())
    for call in calls:
        with pytest.raises(CorruptRecord) as caught:
            call()
        assert (caught.value.key, caught.value.field) == ("tasks/a", column)
    assert table_rows(path) == before


def test_a_corrupt_command_makes_claim_raise_and_change_nothing(path: Path, store: Any) -> None:
    store.submit_command(Command("c0", "a", CommandKind.STOP, at(0)))
    store.submit_command(Command("c1", "a", CommandKind.STOP, at(1)))
    with closing(raw(path)) as db:
        db.execute("UPDATE commands SET kind = 'explode' WHERE command_id = 'c1'")
    before = table_rows(path)
    with pytest.raises(CorruptRecord) as caught:
        store.claim_commands(now=at(2), lease_seconds=5)
    assert (caught.value.key, caught.value.field) == ("commands/c1", "kind")
    assert table_rows(path) == before  # c0 was leased, then rolled back with the failure


def test_a_file_that_is_not_a_database_is_corrupt_record(path: Path) -> None:
    path.write_bytes(b"this is not a SQLite database, just text" * 100)
    with pytest.raises(CorruptRecord) as caught:
        SqliteTaskStore(path)
    assert caught.value.key == str(path)


# -- connections -----------------------------------------------------------------------------


def test_each_thread_has_its_own_connection_and_close_closes_them_all(store: Any) -> None:
    store.create(snapshot("a"))
    seen: dict[str, Any] = {}
    ready, release = threading.Barrier(4), threading.Event()

    def work(name: str) -> None:
        seen[name] = store._connection()
        assert store.get("a") == snapshot("a")
        ready.wait()
        release.wait()
        try:
            store.get("a")
        except StoreClosed:
            seen[name + " after"] = "closed"

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    ready.wait()
    connections = {id(c) for c in seen.values()} | {id(store._connection())}
    assert len(connections) == 4, "one connection per thread"
    store.close()
    release.set()
    for thread in threads:
        thread.join(10)
    assert [seen[f"t{i} after"] for i in range(3)] == ["closed"] * 3
    for connection in [c for c in seen.values() if isinstance(c, sqlite3.Connection)]:
        with pytest.raises(sqlite3.ProgrammingError):  # really closed, not only flagged
            connection.execute("SELECT 1")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_opens_its_own_connection(store: Any) -> None:
    store.create(snapshot("a"))
    parent_connection = store._connection()
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection must not be used here
        code = 0
        try:
            code = 3 if store._connection() is parent_connection else 0
            store.save(snapshot("a", version=2), expect_version=1)
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get("a") == snapshot("a", version=2)  # the parent still works, and sees it


# -- indexes ---------------------------------------------------------------------------------


def plan(path: Path, sql: str, params: list[object]) -> str:
    with closing(raw(path)) as db:
        return " | ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql, params))


@pytest.mark.parametrize(
    ("query", "index"),
    [(TaskQuery(), "tasks_by_created"),
     (TaskQuery(buckets=frozenset({1, 2})), "tasks_by_bucket"),
     (TaskQuery(buckets=frozenset(range(500))), "tasks_by_bucket"),
     (TaskQuery(statuses=frozenset({TaskStatus.PENDING})), "tasks_by_status"),
     (TaskQuery(name="job"), "tasks_by_name"),
     (TaskQuery(name_prefix="jo"), "tasks_by_name"),
     (TaskQuery(tag="io"), "task_tags"),
     (TaskQuery(pipeline_run_id="p"), "tasks_by_pipeline")],
)  # fmt: skip
def test_every_filter_runs_on_an_index(
    store: Any, path: Path, query: TaskQuery, index: str
) -> None:
    sql, params = select_tasks(SQLITE, query)
    found = plan(path, sql, params)
    assert index in found and "SCAN tasks " not in found.replace("SCAN tasks USING", ""), found


def test_claims_and_counts_read_indexes_not_every_row(store: Any, path: Path) -> None:
    claim = (
        "SELECT command_id FROM commands WHERE finished_at IS NULL AND (lease_until IS NULL"
        " OR lease_until <= ?) ORDER BY created_at, command_id LIMIT ?"
    )
    assert "commands_open" in plan(path, claim, [0, 1])
    counts = plan(path, "SELECT status, COUNT(*) FROM tasks GROUP BY status", [])
    assert "COVERING INDEX" in counts, counts


def test_large_bucket_sets_match_what_the_reference_matches(store: Any) -> None:
    reference = InMemoryTaskStore()
    for i in range(40):
        task = snapshot(f"t{i}", bucket=i * 17 % 1000, created=i)
        store.create(task)
        reference.create(task)
    owned = frozenset(range(0, 1000, 3))  # 334 buckets: one JSON parameter, not 334
    query = TaskQuery(buckets=owned, limit=7)
    assert store.query(query) == reference.query(query)
    started = store.start_tasks(owner="w", now=at(99), lease_until=at(120), buckets=sorted(owned))
    assert started == reference.start_tasks(
        owner="w", now=at(99), lease_until=at(120), buckets=sorted(owned)
    )
    assert started and all(t.bucket in owned for t in started)


@pytest.mark.parametrize(
    ("prefix", "successor"),
    [("a", "b"), ("ab", "ac"), ("\ud7ff", "\ue000"), ("a\U0010ffff", "b"), ("\U0010ffff", None)],
)
def test_a_name_prefix_ends_at_the_next_code_point_never_at_a_surrogate(
    prefix: str, successor: str | None
) -> None:
    assert prefix_successor(prefix) == successor


# -- what no protocol method returns ---------------------------------------------------------


def test_completing_twice_keeps_the_first_outcome_and_finish_time(store: Any) -> None:
    store.submit_command(Command("c1", "a", CommandKind.STOP, at(0)))
    store.complete_command("c1", now=at(1), outcome="stopped")
    store.complete_command("c1", now=at(2), outcome="again")
    stored = store.get_command("c1")
    assert (stored.finished_at, stored.outcome) == (at(1), "stopped")
    store.release_command("c1", now=at(3))
    assert store.get_command("c1") == stored  # a finished command stays as it is


def test_close_from_another_thread_waits_for_a_running_transaction(path: Path) -> None:
    """Closing a connection while another thread runs a statement on it crashes the process
    (seen in CI: a dashboard's feed thread inside COMMIT while its store was closed). close()
    waits for the transaction; the thread's next call is StoreClosed."""
    store = SqliteTaskStore(path)
    store.create(snapshot("t1"))
    inside, results = threading.Event(), []

    def long_transaction() -> None:
        with store._transaction(write=True) as tx:
            inside.set()
            time.sleep(0.5)  # close() is called meanwhile
            assert tx.rows("SELECT 1") == [(1,)]
        results.append("committed")
        try:
            store.get("t1")
        except StoreClosed:
            results.append("closed after")

    worker = threading.Thread(target=long_transaction)
    worker.start()
    assert inside.wait(10)
    store.close()
    assert results[:1] == ["committed"]  # close() returned only after the commit
    worker.join(10)
    assert results == ["committed", "closed after"]
