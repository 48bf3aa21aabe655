"""``PostgresTaskStore``: the ``TaskStore`` protocol, the runtime's extensions and the change feed
on one PostgreSQL schema, through psycopg 3 and a ``psycopg_pool.ConnectionPool``.

Everything but the connection side is the shared SQL core (``_sql.store.SqlTaskStore`` and the
``_sql`` modules, shared with ``SqliteTaskStore``); the connection side (pool, transactions,
text as ``bytea``, lost commits, a restarted server) is ``_sql.pg_connection``. This module owns:

* **The schema.** All tables live in one schema (``schema=``, the namespace), created with its
  tables on first use and versioned (``schema_version``); concurrent first opens are serialised
  by an advisory lock, and a schema written by a newer release is refused
  (``UnsupportedSchema``) before anything is written. A schema already at this version is only
  read, so a role without ``CREATE`` can use one that an owner prepared.
* **Concurrency.** ``save`` is one ``UPDATE ... WHERE task_id = ? AND status_version = ?`` (the
  row count says which happened); claims and starts pick rows with ``FOR UPDATE SKIP LOCKED``;
  every write that issues change-feed positions locks the feed's head row first, so positions
  are issued in commit order and no two writers wait for each other.
* **Limits.** The same head-row lock serializes every write that moves a task with the starts
  that judge its limits (``_sql/limits.py``): starts on many connections never admit more than
  ``max`` holders of a ref, and a rate bucket's tokens are spent once, on the server's clock.
* **Failures.** An unreachable server, a broken connection or a rolled-back transaction is
  ``StoreUnavailable``; a commit whose reply was lost is resolved with the server
  (``_sql.pg_connection``), so a write that landed is reported as done.

* **Nudges** (``NudgeStore``, ``_sql.pg_nudges``): a write that makes a task ``PENDING`` (a
  create, a retry or hand-back, a release of waiting children) sends ``NOTIFY`` in its own
  transaction, so idle workers hear of it at the commit and never of a rolled-back write; the
  runtime's other nudges (commands, the bucket pool) are ``NOTIFY`` too, and its listener holds
  one extra connection in ``LISTEN``. Polling stays the fallback. ``nudges=False`` (for a
  pooler that cannot ``LISTEN``, such as PgBouncer in transaction mode) sends none and leaves
  ``namespace`` empty, which the runtime reads as "poll".
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from chongming_redis.errors import StoreClosed, StoreError, UnsupportedSchema, extra_imports

with extra_imports("postgres", "a PostgreSQL store"):  # psycopg and its pool: the extra
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from chongming_redis.stores._sql.pg_connection import PgPool, PgTx

from chongming_redis.stores._sql.pg_nudges import PgNudgeClient, pg_channel
from chongming_redis.stores._sql.schema import SCHEMA_VERSION, Tx, migrate, recorded_version
from chongming_redis.stores._sql.store import SqlTaskStore
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.validation import check_int, check_positive_seconds

__all__ = ["PostgresTaskStore", "check_schema"]

#: ``server_version_num`` of PostgreSQL 13: ``pg_xact_status`` (a lost COMMIT's outcome).
MIN_SERVER_VERSION = 130000
#: The namespace alphabet (``RedisTaskStore``'s), within PostgreSQL's 63-byte identifiers.
_SCHEMA = re.compile(r"[A-Za-z0-9_.-]{1,63}")


def check_schema(schema: object) -> str:
    """A schema name this store can use: 1-63 letters, digits, ``_``, ``.``, ``-`` (always
    quoted, so case is kept), not ``pg_...`` (reserved by PostgreSQL)."""
    if type(schema) is not str:
        raise TypeError(f"schema must be a str, not {type(schema).__name__}")
    if not _SCHEMA.fullmatch(schema):
        raise ValueError(
            f"schema {schema!r} must be 1-63 characters of letters, digits, '_', '.', '-'"
        )
    if schema.lower().startswith("pg_"):
        raise ValueError(f"schema {schema!r}: names starting with 'pg_' are PostgreSQL's own")
    return schema


def _describe(dsn: object, schema: str) -> str:
    """``PostgreSQL schema 'x' in database 'app' on host:port`` (no password); ``ValueError``
    for a DSN libpq cannot parse."""
    if type(dsn) is not str:
        raise TypeError(f"dsn must be a str, not {type(dsn).__name__}")
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"bad PostgreSQL DSN: {exc}") from None
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    where = f"{host}:{parts.get('port') or 5432}"
    return f"PostgreSQL schema {schema!r} in database {parts.get('dbname', '')!r} on {where}"


class PostgresTaskStore(SqlTaskStore):
    """A ``TaskStore`` in one schema of a PostgreSQL database, shared by any number of
    processes on any number of machines.

    ``dsn``: a libpq URL or ``key=value`` string. Pool: ``min_size``..``max_size`` connections
    per store (each thread of a worker holds one only for the length of a call); ``timeout``:
    seconds a call waits for a connection (the server being down included) before it raises
    ``StoreUnavailable``; ``connect_timeout``: libpq's, unless the DSN sets one.
    """

    def __init__(
        self,
        dsn: str,
        schema: str = "chongming",
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 5.0,
        connect_timeout: float = 5.0,
        nudges: bool = True,
    ) -> None:
        self.schema = check_schema(schema)
        self.where = _describe(dsn, self.schema)
        self.dsn = dsn
        self.min_size = check_int(min_size, "min_size", maximum=1000)
        self.max_size = check_int(max_size, "max_size", minimum=max(1, min_size), maximum=1000)
        self.timeout = check_positive_seconds(timeout, "timeout", maximum=3600.0)
        self.connect_timeout = check_positive_seconds(
            connect_timeout, "connect_timeout", maximum=3600.0
        )
        if type(nudges) is not bool:
            raise TypeError(f"nudges must be a bool, not {type(nudges).__name__}")
        self.nudges = nudges
        self._work_channel = pg_channel("{" + self.schema + "}:nudge:work")  # notify.WORK
        self._nudge_client = PgNudgeClient(
            dsn, connect_timeout=self.connect_timeout, send=self._send_nudge
        )
        self._closed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pool = self._new_pool()
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise

    def _new_pool(self) -> PgPool:
        return PgPool(
            self.dsn,
            where=self.where,
            schema=self.schema,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
        )

    # -- the schema ------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Create or migrate the schema unless it is at this version already (then it is only
        read: no DDL, no lock)."""
        found = self.schema_version()
        if found == SCHEMA_VERSION:
            return
        if found > SCHEMA_VERSION:
            raise UnsupportedSchema(self.where, found, SCHEMA_VERSION)
        with self._transaction(write=True) as tx:
            # Migrators of one schema take turns (CREATE ... IF NOT EXISTS is not safe against
            # a concurrent CREATE); the migration re-reads the version under the lock.
            tx.rows("SELECT pg_advisory_xact_lock(?)", [_lock_key(self.schema)])
            tx.run(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')  # check_schema: no quotes
            migrate(tx, encode_dt(datetime.now(timezone.utc)), self.where)

    def schema_version(self) -> int:
        """The version recorded in the schema (0: none yet)."""
        with self._transaction(write=False) as tx:
            ((server,),) = tx.rows("SELECT current_setting('server_version_num')::int")
            if int(server) < MIN_SERVER_VERSION:  # pg_current_xact_id, pg_xact_status
                raise StoreError(f"{self.where}: PostgreSQL 13 or newer is needed ({server})")
            name = f'"{self.schema}".schema_version'
            (table,) = tx.rows("SELECT to_regclass(convert_from(?, 'UTF8'))", [name])[0]
            return 0 if table is None else recorded_version(tx)

    def drop_schema(self) -> None:
        """Drop the schema and everything in it (a test's or a demo's, at its end). Not part
        of ``TaskStore``: nothing else may be using it. The store stays open."""
        with self._transaction(write=True) as tx:
            tx.run(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    # -- connections -----------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[PgTx]:
        with self._current_pool().transaction(write=write) as tx:
            yield tx

    def _current_pool(self) -> PgPool:
        self._check_open()
        if os.getpid() != self._pid:
            # Forked: the parent's connections are not ours to use, nor to close (closing
            # would end the parent's sessions). The child opens its own.
            with self._lock:
                if os.getpid() != self._pid:
                    self._pid = os.getpid()
                    self._pool = self._new_pool()
        return self._pool

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    def server_time(self) -> datetime:
        """``ServerClockStore``: the database server's clock, the one every worker shares."""
        with self._transaction(write=False) as tx:
            ((micros,),) = tx.rows(
                "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
            )
        return decode_dt(int(micros))

    # -- nudges (NudgeStore) ---------------------------------------------------------------

    @property
    def namespace(self) -> str:
        """The nudges' namespace: the schema (empty with ``nudges=False``: the runtime polls)."""
        return self.schema if self.nudges else ""

    @property
    def client(self) -> PgNudgeClient:
        """``publish``/``pubsub`` on ``LISTEN``/``NOTIFY`` (for the runtime's listener)."""
        return self._nudge_client

    @property
    def publishes_work(self) -> bool:
        """The store's writes that make a task ``PENDING`` send the work nudge themselves."""
        return self.nudges

    def _nudge_work(self, tx: Tx) -> None:
        if self.nudges:  # delivered when the write commits, never when it rolls back
            _notify(tx, self._work_channel)

    def _send_nudge(self, channel: str) -> None:
        with self._transaction(write=True) as tx:
            _notify(tx, channel)

    def close(self) -> None:
        """Close the pool's connections; idempotent. Later calls raise ``StoreClosed``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() == self._pid:
            self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresTaskStore({self.where})"


def _notify(tx: Tx, channel: str) -> None:
    # Parameters are bound as bytea (_sql.pg_connection): the channel is ASCII.
    tx.rows("SELECT pg_notify(convert_from(?, 'UTF8'), '')", [channel])


def _lock_key(schema: str) -> int:
    """The advisory lock of a schema's migrations: a stable signed 64-bit number."""
    digest = hashlib.sha256(b"chongming-redis schema " + schema.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
