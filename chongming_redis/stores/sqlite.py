"""``SqliteTaskStore``: the ``TaskStore`` protocol, the runtime's extensions and the change feed
on one SQLite database file, through the standard library's ``sqlite3``.

Everything but the connection side is the shared SQL core (``_sql.store.SqlTaskStore`` and the
``_sql`` modules, shared with ``PostgresTaskStore``). This module owns:

* **Connections:** one per thread (thread-local), opened on first use, all closed by
  ``close()``; a process that forked opens its own (a SQLite connection must never cross a
  ``fork``).
* **Locking:** the database is in WAL mode, so readers never wait for the writer. Every write
  (each compare-and-set, claim, start, prune batch, and every other method that writes) runs in
  ``BEGIN IMMEDIATE``: it takes the database's write lock before reading what it checks, so
  "check, then write" is atomic across threads and processes. Reads run in ``BEGIN`` (one
  consistent snapshot).
* **Durability:** ``synchronous=FULL`` by default: every commit is synced to the WAL file
  before it is acknowledged, so an acknowledged write survives a power cut, not only a crash of
  the process (``NORMAL`` may lose the last commits on power loss, never corrupt the file).
* **Failures:** the write lock still held by another connection when the busy timeout ends is
  ``StoreUnavailable`` ("nothing was written": the transaction is rolled back); an I/O error
  while committing is ``StoreUnavailable`` whose outcome is unknown (it says so); a database
  that does not decode (a damaged file, a row written by another client) is ``CorruptRecord``.
* **Schema:** created on first open and versioned (``schema_version``); a file written by a
  newer release is refused (``UnsupportedSchema``).

``":memory:"`` and ``file:`` URIs are refused: a private in-memory database is not shared
between threads or processes, so everything written would silently vanish from the others.
One machine only: SQLite's locks and WAL's shared memory do not work across a network file
system.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from typing import Any

from chongming_redis.errors import (
    CorruptRecord,
    StoreClosed,
    StoreError,
    StoreUnavailable,
)
from chongming_redis.stores._sql.schema import SQLITE, migrate
from chongming_redis.stores._sql.store import SqlTaskStore
from chongming_redis.stores.codec import encode_dt
from chongming_redis.validation import check_positive_seconds

__all__ = ["SqliteTaskStore"]

SYNCHRONOUS = ("FULL", "NORMAL")
MAX_BUSY_TIMEOUT = 3600.0


class _Connection(sqlite3.Connection):
    """A connection the store can hold weakly (``sqlite3.Connection`` itself cannot be).
    ``busy`` is held for each transaction: ``close`` from another thread waits for it, since
    closing a connection while another thread runs a statement on it crashes the process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.busy = threading.Lock()


class _Tx:
    """One transaction on a connection (``_sql.schema.Tx``): ``?`` placeholders as they are."""

    dialect = SQLITE

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._connection.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._connection.execute(sql, params).rowcount


class SqliteTaskStore(SqlTaskStore):
    """A ``TaskStore`` in one SQLite file, shared by the threads and processes of one machine.

    ``busy_timeout``: seconds a write waits for another connection's write lock before it
    fails with ``StoreUnavailable``. ``synchronous``: ``"FULL"`` (default, durable across power
    loss) or ``"NORMAL"``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
    ) -> None:
        self.path = _check_path(path)
        self.where = f"SQLite database {self.path!r}"
        self.busy_timeout = check_positive_seconds(
            busy_timeout, "busy_timeout", maximum=MAX_BUSY_TIMEOUT
        )
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self.synchronous = synchronous
        self._closed = False
        self._lock = threading.Lock()
        self._reset_connections()
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise

    def _prepare(self) -> None:
        """WAL mode (persistent in the file) and the schema, on the first connection."""
        mode = self._use_wal(self._connection())
        if mode != "wal":
            raise StoreUnavailable(f"{self.where}: cannot use WAL journal mode (got {mode!r})")
        with self._transaction(write=True) as tx:
            migrate(tx, encode_dt(datetime.now(timezone.utc)), self.where)

    def _use_wal(self, connection: sqlite3.Connection) -> str:
        """The file's journal mode, set to WAL first if it is not yet. Setting it upgrades the
        connection's read lock to a write lock, for which SQLite never calls the busy handler
        (it could deadlock): when other processes open a new file at the same moment, the
        change fails with ``SQLITE_BUSY`` at once, so it is retried until the busy timeout.
        Once the file is WAL (the mode persists in it), the read alone answers."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
                if str(mode).lower() != "wal":
                    (mode,) = connection.execute("PRAGMA journal_mode=WAL").fetchone()
                return str(mode).lower()
            except sqlite3.Error as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise _failure(self, exc, "opening") from exc
            time.sleep(0.005)

    # -- connections -----------------------------------------------------------------------

    def _reset_connections(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()
        #: Every connection a thread of this process opened (a dead thread's one goes with it).
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()

    def _connection(self) -> sqlite3.Connection:
        self._check_open()
        if os.getpid() != self._pid:  # forked: the parent's connections are not ours to use
            self._reset_connections()
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._open_connection()
            with self._lock:
                if self._closed:
                    connection.close()
                    raise StoreClosed()
                self._connections.add(connection)  # type: ignore[arg-type]
            self._local.connection = connection
        return connection

    def _open_connection(self) -> sqlite3.Connection:
        with _errors(self, "opening"):
            connection = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # no implicit transactions: BEGIN/COMMIT are ours
                check_same_thread=False,  # close() closes every thread's connection
                cached_statements=256,
                factory=_Connection,
            )
            try:
                connection.execute(f"PRAGMA synchronous={self.synchronous}")
            except BaseException:
                connection.close()
                raise
        return connection

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Tx]:
        connection = self._connection()
        with connection.busy:  # type: ignore[attr-defined]
            self._check_open()  # closed while this thread waited: the connection is gone
            with self._in_transaction(connection, write=write) as tx:
                yield tx

    @contextmanager
    def _in_transaction(self, connection: sqlite3.Connection, *, write: bool) -> Iterator[_Tx]:
        with _errors(self, "beginning"):
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield _Tx(connection)
        except BaseException as exc:
            _rollback(connection)
            if isinstance(exc, sqlite3.Error):
                raise _failure(self, exc, "running") from exc
            raise
        try:
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(connection)
            raise _failure(self, exc, "committing") from exc

    # -- what only this store does ---------------------------------------------------------

    def server_time(self) -> datetime:
        """``ServerClockStore``: this machine's clock, which every process sharing the file
        shares (a SQLite database is never shared between machines)."""
        self._check_open()
        return datetime.now(timezone.utc)

    def close(self) -> None:
        """Close every thread's connection; idempotent. Later calls raise ``StoreClosed``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
            self._connections = weakref.WeakSet()
        for connection in connections:
            # After the transaction running on it, if any (its thread's own close() would
            # wait forever: a bounded wait, then the connection is left to the collector).
            if connection.busy.acquire(timeout=self.busy_timeout + 5):
                try:
                    with suppress(sqlite3.Error):
                        connection.close()
                finally:
                    connection.busy.release()

    def __repr__(self) -> str:
        return f"SqliteTaskStore({self.path!r})"


def _check_path(path: object) -> str:
    """A filesystem path, made absolute (so every process opens the same file whatever its
    working directory). In-memory databases and URIs are refused."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if type(path) is not str:
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    if path in ("", ":memory:") or path.startswith("file:") or "mode=memory" in path:
        raise ValueError(
            f"SqliteTaskStore needs a file path, not {path!r}: an in-memory database is private"
            " to one connection, so other threads and processes would never see its writes"
        )
    if "\x00" in path:
        raise ValueError("path must not contain NUL")
    return os.path.abspath(path)


def _rollback(connection: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):
        if connection.in_transaction:
            connection.execute("ROLLBACK")


def _busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")  # Python 3.11+
    if name:
        return str(name).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    return "locked" in str(exc) or "busy" in str(exc)


def _failure(store: SqliteTaskStore, exc: sqlite3.Error, stage: str) -> StoreError:
    """The ``StoreError`` for a ``sqlite3`` failure while ``stage`` (the transaction was rolled
    back, if one was open)."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, sqlite3.ProgrammingError) and store._closed:
        return StoreClosed()  # closed by another thread mid-call
    if _busy(exc):
        return StoreUnavailable(
            f"{store.where} is locked by another writer: still locked after the busy timeout"
            f" ({store.busy_timeout:g}s) while {stage}; nothing was written"
        )
    if stage == "committing":
        return StoreUnavailable(
            f"{store.where}: the commit failed ({detail}); the outcome is unknown"
        )
    if isinstance(exc, sqlite3.OperationalError):  # I/O, permissions, a full disk
        return StoreUnavailable(f"{store.where}: {detail} (while {stage}; nothing was written)")
    if isinstance(exc, sqlite3.DatabaseError):  # malformed file, constraint on foreign data
        return CorruptRecord(store.path, None, detail)
    return StoreError(f"{store.where}: {detail}")


@contextmanager
def _errors(store: SqliteTaskStore, stage: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _failure(store, exc, stage) from exc
