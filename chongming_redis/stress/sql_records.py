"""The stress run's SQL side: the fenced effect of the stress app on a SQL store, and the raw
rows ``ground_truth`` reads back after the run.

**The fenced effect** must be atomic with the task state it is fenced by, so on a SQL store it
is one transaction in the store's own database (the file, or the run's schema): read the task
row's ``status``, ``attempt`` and ``lease_owner`` and insert the effect record only if the task
is still ``running`` in this attempt under this owner. SQLite: ``BEGIN IMMEDIATE`` takes the
database's write lock before the read, as the store's own writes do; PostgreSQL: ``SELECT ...
FOR UPDATE`` locks the row, so a store write that moves the task on waits for the commit (or
commits first, and the read sees it). The records go to ``stress_effects``, a table of the run's
own beside the store's tables (``record`` is the primary key: a retry after a lost commit reply
inserts nothing twice, and the checkers count distinct nonces anyway).

**The ground truth**: the command rows (as the fields of the Redis command hash, ``t k c lu f
o``) and the limit holders (``limit_holders``: ``ref -> task ids``), read with a connection of
its own once the run is quiet. The table layout is the SQL stores' (``stores/_sql/schema.py``):
on PostgreSQL every text column of the store is ``bytea`` (UTF-8), decoded here.

Nothing here imports the stores' private SQL modules (the import contract forbids it): the few
column names used are the schema's, which is versioned.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any, TypeVar

from chongming_redis.stores.urls import StoreUrl, parse_store_url

EFFECTS_TABLE = "stress_effects"
#: How long a fenced insert rides out a busy database or a dropped connection (seconds).
RETRY_SECONDS = 15.0
SQLITE_BUSY_SECONDS = 5.0
#: ``idle_in_transaction_session_timeout`` of the run's PostgreSQL connections (the store's
#: ``IDLE_IN_TRANSACTION``, 1 s: its module is private to the stores).
IDLE_MS = 1000

T = TypeVar("T")


class SqlRecordsError(RuntimeError):
    """The stress run's own SQL could not be run (the store's database refused it)."""


def _psycopg() -> Any:
    import psycopg  # the [postgres] extra: only a PostgreSQL run gets here

    return psycopg


def _text(value: object) -> str:
    """A text column as the store wrote it (PostgreSQL: ``bytea`` of UTF-8)."""
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


def _param(target: StoreUrl, value: str) -> object:
    """A text parameter compared with a store column: UTF-8 bytes on PostgreSQL."""
    return value.encode() if target.kind == "postgresql" else value


def _table(target: StoreUrl, namespace: str, table: str) -> str:
    return f'"{namespace}".{table}' if target.kind == "postgresql" else table


@contextmanager
def _transaction(target: StoreUrl) -> Iterator[Any]:
    """A cursor in one write transaction on a new connection (closed at the end)."""
    if target.kind == "sqlite":
        conn = sqlite3.connect(target.path or "", timeout=SQLITE_BUSY_SECONDS,
                               isolation_level=None)  # fmt: skip
        with closing(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn.cursor()
            except BaseException:
                conn.rollback()
                raise
            conn.execute("COMMIT")
        return
    with _psycopg().connect(target.url, connect_timeout=5) as conn, conn.cursor() as cur:
        # As the store's own connections: a worker stopped inside this transaction must not
        # hold the task's row lock (and every writer behind it) while it is stopped.
        cur.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_MS}ms'")
        yield cur  # psycopg's connection block commits, or rolls back on an error


def create_effects_table(store_url: str, namespace: str) -> None:
    """The run's effects table, before the workers start (the store's schema exists)."""
    target = parse_store_url(store_url)
    table = _table(target, namespace, EFFECTS_TABLE)
    with _transaction(target) as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (record TEXT PRIMARY KEY, "
                    "task_id TEXT NOT NULL, attempt BIGINT NOT NULL)")  # fmt: skip


def fenced_insert(
    store_url: str, namespace: str, task_id: str, attempt: int, owner: str, record: str
) -> bool:
    """Insert ``record`` only while the task is ``running`` in ``attempt`` under ``owner``, in
    one transaction with that read; whether it was inserted (or was already there). Retried
    through a busy database or a dropped connection for up to ``RETRY_SECONDS``."""
    target = parse_store_url(store_url)
    tasks = _table(target, namespace, "tasks")
    effects = _table(target, namespace, EFFECTS_TABLE)
    mark = "?" if target.kind == "sqlite" else "%s"
    lock = " FOR UPDATE" if target.kind == "postgresql" else ""

    def attempt_once() -> bool:
        with _transaction(target) as cur:
            cur.execute(f"SELECT status, attempt, lease_owner FROM {tasks} "
                        f"WHERE task_id = {mark}{lock}", [_param(target, task_id)])  # fmt: skip
            row = cur.fetchone()
            state = None if row is None else (_text(row[0]), int(row[1]), _text(row[2]))
            if state != ("running", attempt, owner):
                return False
            cur.execute(f"INSERT INTO {effects} (record, task_id, attempt) VALUES "
                        f"({mark}, {mark}, {mark}) ON CONFLICT (record) DO NOTHING",
                        [record, task_id, attempt])  # fmt: skip
            return True

    return _retrying(target, attempt_once)


def _passing(target: StoreUrl) -> tuple[type[BaseException], ...]:
    """What a retry rides out: a busy SQLite file; a PostgreSQL connection reset, refused
    (the server restarting) or a transaction the server rolled back."""
    if target.kind == "sqlite":
        return (sqlite3.OperationalError,)
    return (_psycopg().OperationalError,)


def _retrying(target: StoreUrl, call: Callable[[], T]) -> T:
    passing = _passing(target)
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return call()
        except passing:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _rows(store_url: str, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    """The rows of one query (``?`` placeholders; text parameters as ``_param`` makes them)."""
    target = parse_store_url(store_url)
    if target.kind == "postgresql":
        sql = sql.replace("?", "%s")
    with _transaction(target) as cur:
        cur.execute(sql, list(params))
        return list(cur.fetchall())


def read_effects(store_url: str, namespace: str) -> list[str]:
    """Every fenced effect record, in insertion order."""
    target = parse_store_url(store_url)
    order = "rowid" if target.kind == "sqlite" else "ctid"
    table = _table(target, namespace, EFFECTS_TABLE)
    with _transaction(target) as cur:
        cur.execute(f"SELECT record FROM {table} ORDER BY {order}")
        return [_text(r[0]) for r in cur.fetchall()]


#: The command row's columns as the Redis command hash's fields (``checkers.check_commands``).
COMMAND_FIELDS = (("t", "task_id"), ("k", "kind"), ("c", "created_at"),
                  ("lu", "lease_until"), ("f", "finished_at"), ("o", "outcome"))  # fmt: skip


def read_commands(
    store_url: str, namespace: str, command_ids: Sequence[str]
) -> dict[str, dict[str, str]]:
    """Each command's row as the Redis hash's fields (``{}`` for a command not there); a NULL
    column is left out, as the script leaves out an unset field."""
    target = parse_store_url(store_url)
    table = _table(target, namespace, "commands")
    columns = ", ".join(column for _, column in COMMAND_FIELDS)
    found: dict[str, dict[str, str]] = {cid: {} for cid in command_ids}
    for cid in command_ids:
        sql = f"SELECT {columns} FROM {table} WHERE command_id = ?"
        for row in _rows(store_url, sql, [_param(target, cid)]):
            found[cid] = {"id": cid} | {
                name: _text(value)
                for (name, _), value in zip(COMMAND_FIELDS, row, strict=True)
                if value is not None
            }
    return found


def read_open_commands(store_url: str, namespace: str) -> tuple[list[str], list[str]]:
    """The unfinished commands: without a lease (``queued``) and with one (``leased``)."""
    target = parse_store_url(store_url)
    sql = (f"SELECT command_id, lease_until FROM {_table(target, namespace, 'commands')} "
           "WHERE finished_at IS NULL")  # fmt: skip
    rows = _rows(store_url, sql)
    queued = [_text(cid) for cid, lease in rows if lease is None]
    leased = [_text(cid) for cid, lease in rows if lease is not None]
    return queued, leased


def read_limit_holders(store_url: str, namespace: str) -> dict[str, set[str]]:
    """``limit_holders`` as ``ref -> task ids`` (a ref without holders has no rows)."""
    target = parse_store_url(store_url)
    holders: dict[str, set[str]] = {}
    sql = f"SELECT ref, task_id FROM {_table(target, namespace, 'limit_holders')}"
    for ref, task_id in _rows(store_url, sql):
        holders.setdefault(_text(ref), set()).add(_text(task_id))
    return holders


def schema_exists(store_url: str, namespace: str) -> bool:
    """Whether the PostgreSQL schema ``namespace`` exists (a given server's run needs a new one)."""
    sql = "SELECT 1 FROM information_schema.schemata WHERE schema_name = ?"
    try:
        return bool(_rows(store_url, sql, [namespace]))
    except _psycopg().Error as exc:
        raise SqlRecordsError(f"cannot read the schemas of the PostgreSQL given: {exc}") from exc
