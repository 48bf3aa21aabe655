"""``bench.store_ops`` on the SQL stores: ``SqliteTaskStore`` and ``PostgresTaskStore``, each call
against the store's own bare round trip, measured in the same run (``bench.store_calls``).

The bare round trips:

* **SQLite**: one trivial compare-and-set transaction on a connection of its own to the same
  database file, with the store's settings (WAL, the store's default ``synchronous``):
  ``BEGIN IMMEDIATE; UPDATE bench_bare SET v = ? WHERE v = ?; COMMIT``. Like every store write
  it waits for the file's write lock and, under ``synchronous=FULL``, for an ``fsync``.
* **PostgreSQL**: one single-statement compare-and-set, ``UPDATE bench_bare SET v = %s WHERE
  v = %s``, in autocommit, on a connection of its own to the same server: one round trip and
  one commit (with the server's defaults, one WAL flush).

Both succeed every time (``cas_values``). The PostgreSQL server is private to the run
(``chongming_redis/embedded/postgres_server.py``: ``initdb`` in a temporary directory, a free
loopback port) with the distribution's defaults a user gets: ``fsync`` on, ``synchronous_commit``
on.
The SQLite file is in a temporary directory, whose file system the output names.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from rich.console import Console

from bench.store_calls import (
    OpsRow,
    cas_values,
    measure_ops,
    ops_table,
    scale_and_prune,
)
from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore

#: What ``SHOW`` prints about the server: the settings a commit's cost depends on.
PG_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
               "shared_buffers")  # fmt: skip


# -- SQLite -------------------------------------------------------------------------------------


def sqlite_bare(store: SqliteTaskStore) -> tuple[Callable[[int], object], sqlite3.Connection]:
    """A compare-and-set transaction on a new connection to the store's file, with its
    settings (the file is in WAL mode already: the mode is kept in the file)."""
    connection = sqlite3.connect(store.path, timeout=store.busy_timeout, isolation_level=None)
    connection.execute(f"PRAGMA synchronous={store.synchronous}")
    connection.execute("CREATE TABLE bench_bare (v INTEGER NOT NULL)")
    connection.execute("INSERT INTO bench_bare (v) VALUES (0)")
    values = cas_values()

    def bare(i: int) -> object:
        expected, new = next(values)
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("UPDATE bench_bare SET v = ? WHERE v = ?", (new, expected))
        return connection.execute("COMMIT")

    return bare, connection


def sqlite_bytes(path: str) -> int:
    """The database's size on disk once the WAL is checkpointed into it (and truncated)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(path + "-wal")
    return os.path.getsize(path) + (wal.stat().st_size if wal.exists() else 0)


def run_sqlite(console: Console, n_ops: int, small: int, large: int) -> list[OpsRow]:
    with tempfile.TemporaryDirectory(prefix="chongming-bench-sqlite-") as tmp:
        store = SqliteTaskStore(Path(tmp) / "ops.sqlite3")
        bare, connection = sqlite_bare(store)
        try:
            rows = measure_ops(store, bare, n_ops)
        finally:
            connection.close()
            store.close()
        title = (f"SQLite (WAL, synchronous={store.synchronous}): protocol calls, "
                 f"one connection, {n_ops} calls each")  # fmt: skip
        console.print(ops_table(title, rows, "BEGIN IMMEDIATE; UPDATE; COMMIT"))

        store = SqliteTaskStore(Path(tmp) / "space.sqlite3")
        try:
            summary = scale_and_prune(
                "SQLite", store, small, large, batched=True,
                size=lambda: sqlite_bytes(store.path),
                size_name="file growth per pending task, WAL checkpointed (2 tags)",
            )  # fmt: skip
        finally:
            store.close()
        console.print(summary)
        console.print(f"SQLite {sqlite3.sqlite_version}, the file on {filesystem(tmp)}")
    return rows


# -- PostgreSQL ---------------------------------------------------------------------------------


@contextmanager
def postgres_server() -> Iterator[PostgresProc]:
    """A private server with the distribution's defaults (not the tests' ``fsync=off``)."""
    server = PostgresProc(test_settings=False)
    try:
        yield server
    finally:
        server.close()


def postgres_bare(dsn: str) -> tuple[Callable[[int], object], psycopg.Connection[Any]]:
    """A single-statement compare-and-set in autocommit on a new connection to the server."""
    connection = psycopg.connect(dsn, autocommit=True)
    connection.execute("CREATE TABLE public.bench_bare (v bigint NOT NULL)")
    connection.execute("INSERT INTO public.bench_bare (v) VALUES (0)")
    values = cas_values()

    def bare(i: int) -> object:
        expected, new = next(values)
        return connection.execute(
            "UPDATE public.bench_bare SET v = %s WHERE v = %s", (new, expected)
        )

    return bare, connection


def schema_bytes(dsn: str, schema: str) -> int:
    """``pg_total_relation_size`` (heap, indexes, TOAST) summed over the schema's tables."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


def analyze_schema(dsn: str, schema: str) -> None:
    """``ANALYZE`` the schema's tables (what autovacuum does after a bulk load)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        tables = connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            connection.execute(
                psycopg.sql.SQL("ANALYZE {}.{}").format(
                    psycopg.sql.Identifier(schema), psycopg.sql.Identifier(table)
                )
            )


def run_postgres(console: Console, n_ops: int, small: int, large: int) -> list[OpsRow]:
    with postgres_server() as server:
        store = PostgresTaskStore(server.dsn, schema="bench_ops")
        bare, connection = postgres_bare(server.dsn)
        try:
            rows = measure_ops(store, bare, n_ops)
            settings = {name: connection.execute(f"SHOW {name}").fetchone() for name in
                        (*PG_SETTINGS, "server_version")}  # fmt: skip
        finally:
            connection.close()
            store.close()
        title = f"PostgreSQL: protocol calls, one pooled connection, {n_ops} calls each"
        console.print(ops_table(title, rows, "UPDATE ... WHERE v = %s, autocommit"))

        store = PostgresTaskStore(server.dsn, schema="bench_space")
        try:
            summary = scale_and_prune(
                "PostgreSQL", store, small, large, batched=True,
                size=lambda: schema_bytes(server.dsn, "bench_space"),
                analyze=lambda: analyze_schema(server.dsn, "bench_space"),
                size_name="table growth per pending task, indexes incl. (2 tags)",
            )  # fmt: skip
        finally:
            store.close()
        console.print(summary)
        shown = ", ".join(f"{k} {v[0] if v else '?'}" for k, v in settings.items())
        console.print(f"PostgreSQL, a private server with the distribution's defaults: {shown}")
    return rows


def filesystem(path: str) -> str:
    """The type and device of the file system ``path`` is on (``/proc/mounts``)."""
    best, real = ("?", "?", ""), os.path.realpath(path)
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount, kind = line.split()[:3]
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[2]):
                    best = (kind, device, mount)
    except OSError:
        pass
    return f"{best[0]} ({best[1]})"
