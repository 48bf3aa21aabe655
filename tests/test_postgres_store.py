"""What only ``PostgresTaskStore`` has, on a real PostgreSQL: the schema (its name checked and
quoted, created and versioned, a newer version refused, a prepared schema used without DDL by a
role that may not create), a ``COMMIT`` whose reply is lost (told apart by asking the server),
and a server restart under an open store (the pool finds its dead connections and recovers).

The contracts run in tests/test_contract_postgres.py; the SIGKILL under load in
stress/test_postgres_faults.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from chongming_redis import (
    Command,
    CommandKind,
    ConcurrencyConflict,
    StoreClosed,
    StoreError,
    StoreUnavailable,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
)
from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.embedded.redis_server import free_port
from chongming_redis.errors import UnsupportedSchema
from chongming_redis.stores._sql.pg_connection import POSTGRES, _bound
from chongming_redis.stores._sql.query import select_tasks
from chongming_redis.stores._sql.schema import SCHEMA_VERSION, format_placeholders
from chongming_redis.stores.postgres import PostgresTaskStore

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def task(task_id: str, version: int = 1, status: TaskStatus = TaskStatus.PENDING) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task_id,
        name="job",
        status=status,
        status_version=version,
        created_at=T0,
        updated_at=T0,
        params={"v": version},
    )


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(postgres_proc: PostgresProc, schema: str) -> Iterator[PostgresTaskStore]:
    made = PostgresTaskStore(postgres_proc.dsn, schema=schema)
    yield made
    made.close()


def admin(server: PostgresProc) -> psycopg.Connection[Any]:
    return psycopg.connect(server.dsn, autocommit=True)


# -- the schema ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["", "a" * 64, 'x"y', "a b", "a;b", "pg_catalog", "PG_x", "ü", "a\x00", "x%s", "a?"],
)
def test_a_bad_schema_name_is_refused_before_connecting(bad: str) -> None:
    # The DSN points nowhere: a refusal must not need a server.
    with pytest.raises(ValueError, match="schema"):
        PostgresTaskStore("postgresql://nobody@127.0.0.1:1/none", schema=bad)


def test_a_schema_that_is_not_a_str_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="schema"):
        PostgresTaskStore("postgresql://nobody@127.0.0.1:1/none", schema=b"x")  # type: ignore[arg-type]


def test_a_dsn_libpq_cannot_parse_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="DSN"):
        PostgresTaskStore("host=x port", schema="ok")


def test_an_unreachable_server_is_store_unavailable() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailable):
        PostgresTaskStore(f"postgresql://nobody@127.0.0.1:{port}/none", schema="ok", timeout=1.0)


def test_names_that_need_quoting_are_separate_schemas(postgres_proc: PostgresProc) -> None:
    """Case, dots and dashes are kept (always quoted): ``A.b-1`` and ``a.b-1`` are two."""
    suffix = uuid.uuid4().hex[:8]
    upper = PostgresTaskStore(postgres_proc.dsn, schema=f"A.b-{suffix}")
    lower = PostgresTaskStore(postgres_proc.dsn, schema=f"a.b-{suffix}")
    try:
        upper.create(task("t1"))
        assert lower.get("t1") is None
        with admin(postgres_proc) as conn:
            found = {
                row[0]
                for row in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", [f"%b-{suffix}"]
                )
            }
        assert found == {f"A.b-{suffix}", f"a.b-{suffix}"}
    finally:
        upper.drop_schema()
        lower.drop_schema()
        upper.close()
        lower.close()


def test_the_schema_is_created_and_its_version_recorded(
    store: PostgresTaskStore, postgres_proc: PostgresProc, schema: str
) -> None:
    assert store.schema_version() == SCHEMA_VERSION
    with admin(postgres_proc) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]
            )
        }
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s", [schema]
            )
        }
    assert {"tasks", "task_tags", "history", "commands", "schema_version", "meta"} <= tables
    assert {"tasks_by_bucket", "tasks_by_status", "commands_open"} <= indexes


def _plan(server: PostgresProc, schema: str, query: TaskQuery) -> str:
    """PostgreSQL's plan for ``query`` as the store sends it (statistics fresh)."""
    sql, params = select_tasks(POSTGRES, query)
    with admin(server) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("ANALYZE tasks")
        rows = conn.execute("EXPLAIN " + format_placeholders(sql), _bound(params))
        return "\n".join(row[0] for row in rows)


def test_the_bucket_query_is_answered_from_the_bucket_index(
    store: PostgresTaskStore, postgres_proc: PostgresProc, schema: str
) -> None:
    """The guide's hot query ("the PENDING tasks of my buckets, oldest first"), as the store
    sends it, on a pool's worth of tasks (4,000 in 64 buckets, half of them finished):

    * one bucket: ``tasks_by_bucket`` (bucket, status, created_at, task_id) hands the rows out
      in order, so the first page reads only that page — no sort, no other bucket's rows;
    * a few buckets that hold few tasks among many: ``tasks_by_bucket`` again.

    (For a few busy buckets the planner may rather walk ``tasks_by_status`` in order and stop
    at the limit, which is cheaper there; either way no query reads the table.)"""
    statuses = (TaskStatus.PENDING, TaskStatus.SUCCEEDED)
    busy = [replace(task(f"t{i}", 1, statuses[i % 2]), bucket=(i // 2) % 64) for i in range(4000)]
    rare = [replace(task(f"r{i}"), bucket=100 + i % 3) for i in range(9)]
    everything = busy + rare
    for start in range(0, len(everything), 100):
        store.commit_tasks([(t, None, []) for t in everything[start : start + 100]])
    pending = frozenset({TaskStatus.PENDING})

    one = TaskQuery(statuses=pending, buckets=frozenset({5}), limit=10)
    plan = _plan(postgres_proc, schema, one)
    assert "Index Scan using tasks_by_bucket" in plan and "Sort" not in plan, plan
    mine = [t for t in busy if t.bucket == 5 and t.status is TaskStatus.PENDING]
    # All were created at T0: the order is the task ids' (code-point order).
    assert [t.task_id for t in store.query(one)] == sorted(t.task_id for t in mine)[:10]

    few = TaskQuery(statuses=pending, buckets=frozenset({100, 101, 102}), limit=10)
    plan = _plan(postgres_proc, schema, few)
    assert "tasks_by_bucket" in plan, plan
    assert {t.task_id for t in store.query(few)} == {t.task_id for t in rare}


def test_two_stores_opening_a_new_schema_at_once_both_succeed(
    postgres_proc: PostgresProc, schema: str
) -> None:
    with ThreadPoolExecutor(4) as pool:
        stores = list(
            pool.map(lambda _: PostgresTaskStore(postgres_proc.dsn, schema=schema), range(4))
        )
    try:
        stores[0].create(task("t1"))
        assert all(s.get("t1") == task("t1") for s in stores)
        assert stores[1].schema_version() == SCHEMA_VERSION
    finally:
        stores[0].drop_schema()
        for s in stores:
            s.close()


def test_a_newer_schema_version_is_refused_and_left_alone(
    store: PostgresTaskStore, postgres_proc: PostgresProc, schema: str
) -> None:
    store.create(task("t1"))
    with admin(postgres_proc) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".schema_version (version, applied_at) VALUES (%s, 0)',
            [SCHEMA_VERSION + 1],
        )
    with pytest.raises(UnsupportedSchema) as caught:
        PostgresTaskStore(postgres_proc.dsn, schema=schema)
    assert (caught.value.found, caught.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert store.get("t1") == task("t1")  # nothing was written or dropped


def test_a_role_without_create_uses_a_prepared_schema(
    store: PostgresTaskStore, postgres_proc: PostgresProc, schema: str
) -> None:
    """Once an owner created the schema, a role that may read and write its tables but create
    nothing opens it (no DDL at all) and works; on a new schema it gets a clear error."""
    role = f"r_{uuid.uuid4().hex[:8]}"
    with admin(postgres_proc) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {role}'
        )
        conn.execute(f"REVOKE CREATE ON DATABASE postgres FROM PUBLIC, {role}")
    dsn = postgres_proc.dsn.replace("chongming@", f"{role}@")
    limited = PostgresTaskStore(dsn, schema=schema)
    try:
        limited.create(task("t1"))
        limited.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)
        assert store.get("t1") == task("t1", 2, TaskStatus.RUNNING)
    finally:
        limited.close()
    with pytest.raises(StoreError, match="permission denied") as caught:
        PostgresTaskStore(dsn, schema=f"{schema}_new")
    assert type(caught.value) is StoreError  # not "unavailable": retrying will not help


# -- a lost COMMIT reply ---------------------------------------------------------------------


def _break_commit(monkeypatch: pytest.MonkeyPatch, *, land_first: bool) -> Callable[[], int]:
    """The next ``COMMIT`` of any connection fails as if the connection broke: after the server
    committed (``land_first``: the reply was lost) or before it was sent. Returns a counter of
    the commits broken."""
    real = psycopg.Connection.commit
    broken = 0

    def commit(self: psycopg.Connection[Any]) -> None:
        nonlocal broken
        if broken:
            return real(self)
        broken += 1
        if land_first:
            real(self)
        self.close()  # the session ends: an open transaction is rolled back by the server
        raise psycopg.OperationalError("server closed the connection unexpectedly (test)")

    monkeypatch.setattr(psycopg.Connection, "commit", commit)
    return lambda: broken


def test_a_commit_that_landed_but_whose_reply_was_lost_is_reported_done(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create(task("t1"))
    broken = _break_commit(monkeypatch, land_first=True)
    store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)  # no error: it landed
    assert broken() == 1
    assert store.get("t1") == task("t1", 2, TaskStatus.RUNNING)
    with pytest.raises(ConcurrencyConflict):  # and the version really moved
        store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)


def test_a_commit_lost_before_it_reached_the_server_is_unavailable_and_wrote_nothing(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create(task("t1"))
    broken = _break_commit(monkeypatch, land_first=False)
    with pytest.raises(StoreUnavailable, match="nothing was written"):
        store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)
    assert broken() == 1
    assert store.get("t1") == task("t1")
    store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)  # the retry is the write
    assert store.get("t1") == task("t1", 2, TaskStatus.RUNNING)


def test_claims_whose_commit_reply_was_lost_return_the_leased_batch(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        store.submit_command(Command(f"c{i}", "t1", CommandKind.STOP, T0))
    _break_commit(monkeypatch, land_first=True)
    claimed = store.claim_commands(now=T0, lease_seconds=60, limit=10)
    assert [c.command_id for c in claimed] == ["c0", "c1", "c2"]
    assert store.claim_commands(now=T0, lease_seconds=60, limit=10) == []


# -- a restarted server ----------------------------------------------------------------------


def test_the_store_recovers_by_itself_after_the_server_restarts(
    fresh_postgres_proc: PostgresProc,
) -> None:
    server = fresh_postgres_proc
    store = PostgresTaskStore(server.dsn, schema="restart", max_size=4, timeout=1.0)
    try:
        store.create(task("t1"))
        assert store.get("t1") is not None  # a pooled connection is open
        server.kill9()
        with pytest.raises(StoreUnavailable):
            store.get("t1")
        with pytest.raises(StoreUnavailable):
            store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)
        server.restart()
        # Every pooled connection died with the server; none of them is handed out again.
        for _ in range(6):
            assert store.get("t1") == task("t1")
        store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)
        assert store.get("t1") == task("t1", 2, TaskStatus.RUNNING)
    finally:
        store.close()
    with pytest.raises(StoreClosed):
        store.get("t1")


def test_a_forked_child_opens_its_own_connections_and_leaves_the_parents_alone(
    store: PostgresTaskStore,
) -> None:
    store.create(task("t1"))  # the parent's pool holds an open connection now
    pid = os.fork()
    if pid == 0:  # the child: its own pool; exits without running the parent's cleanup
        code = 1
        try:
            store.save(task("t1", 2, TaskStatus.RUNNING), expect_version=1)
            code = 0 if store.get("t1") == task("t1", 2, TaskStatus.RUNNING) else 2
            store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connections were neither used nor closed by the child.
    assert store.get("t1") == task("t1", 2, TaskStatus.RUNNING)
    store.save(task("t1", 3, TaskStatus.SUCCEEDED), expect_version=2)
