"""The connection side of ``PostgresTaskStore``: a ``psycopg_pool.ConnectionPool``, the ``Tx``
the shared SQL runs on (``_sql.schema.Tx``), and how driver failures become ``StoreError``.

* **Text as bytea.** Every ``str`` parameter is bound as its UTF-8 bytes and every text column
  is ``bytea`` (``POSTGRES``): PostgreSQL ``text`` cannot hold NUL, which an id may contain, and
  ``bytea`` compares bytes, so the order is code-point order with no collation involved. The
  codec decodes ``bytes`` text back.
* **Transactions.** A write runs in ``READ COMMITTED`` (the compare-and-set is one ``UPDATE``,
  claims lock with ``FOR UPDATE SKIP LOCKED``; a row another writer changed meanwhile is
  re-checked, never overwritten); a read runs in ``REPEATABLE READ READ ONLY``, so the several
  statements of a change-feed page see one snapshot.
* **A lost reply.** A write first reads its transaction id. If the connection breaks while
  ``COMMIT`` is in flight, the outcome is asked of the server (``pg_xact_status``) on another
  connection: committed is success (the call returns what it computed: a retried call is never
  told "conflict" by its own landed write), rolled back is ``StoreUnavailable`` saying nothing
  was written, and a server that cannot be asked in time is ``StoreUnavailable`` saying the
  outcome is unknown (the runtime then reads the task back). A failure before ``COMMIT`` was
  sent rolls back on the server: ``StoreUnavailable``, nothing written.
* **A stalled client.** Every connection sets ``idle_in_transaction_session_timeout``
  (``IDLE_IN_TRANSACTION``): a client that stops between the statements of a write (SIGSTOPped,
  frozen, swapped out) would otherwise hold its row locks, the feed's head row among them,
  and every writer of the schema would wait behind it for as long as it stays stopped (found by
  ``chongming-redis stress --store postgresql``: a worker SIGSTOPped for 6 s stopped every
  write for 6 s). The server ends such a session, rolling it back; the stalled client's next
  statement fails and its call is ``StoreUnavailable`` (nothing written), as after a reset.
* **A restarted server.** A connection whose socket the server closed is found before use (the
  socket is readable at rest) and dropped with every other broken idle one; the pool opens new
  ones. While the server is down, a call waits at most ``timeout`` for a connection, then
  raises ``StoreUnavailable``; once it is back, calls succeed again with no action.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg import IsolationLevel, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from chongming_redis.errors import StoreClosed, StoreError, StoreUnavailable
from chongming_redis.stores._sql.schema import SQLITE, Dialect, format_placeholders

#: Seconds a connection may sit idle inside a transaction before the server ends it: the store's
#: transactions run their statements back to back, so only a stalled client waits this long.
IDLE_IN_TRANSACTION = 1.0


def _large_set(column: str, values: Sequence[int]) -> tuple[str, list[object]]:
    return f"{column} = ANY(?::bigint[])", [list(values)]


def _literal(value: str) -> str:
    # Text columns are bytea; a plain word in bytea's escape input format is its own bytes.
    return f"{SQLITE.literal(value)}::bytea"


POSTGRES = Dialect(
    "postgresql",
    text="bytea",
    blob="bytea",
    bigint="bigint",
    real="double precision",
    literal=_literal,
    for_update=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    greatest="GREATEST",
    large_set=_large_set,
    clock_us="SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
)


def _bound(params: Sequence[object]) -> list[object]:
    return [p.encode("utf-8") if type(p) is str else p for p in params]


class PgTx:
    """One transaction on a pooled connection (``_sql.schema.Tx``)."""

    dialect = POSTGRES

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._cursor = connection.cursor()

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        self._cursor.execute(format_placeholders(sql), _bound(params))
        return self._cursor.fetchall()

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        self._cursor.execute(format_placeholders(sql), _bound(params))
        return self._cursor.rowcount


class PgPool:
    """The pool of one store, with the transactions the shared SQL runs in."""

    def __init__(
        self,
        dsn: str,
        *,
        where: str,
        schema: str,
        min_size: int,
        max_size: int,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self.where = where
        self.timeout = timeout
        self._schema = schema
        self._closed = False
        options: dict[str, Any] = {"autocommit": False}
        if "connect_timeout" not in conninfo_to_dict(dsn):
            options["connect_timeout"] = max(1, round(connect_timeout))
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            kwargs=options,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            # A failed reconnection is given up after this long; the next call that needs a
            # connection tries again at once (the pool's own retries back off to minutes).
            reconnect_timeout=timeout,
            configure=self._configure,
            open=False,
            name=where,
        )
        self._pool.open(wait=False)

    def _configure(self, connection: psycopg.Connection[Any]) -> None:
        """Every new connection: the store's schema first on the search path, and a stalled
        client's transaction ended by the server (``IDLE_IN_TRANSACTION``)."""
        connection.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))
        idle_ms = sql.Literal(f"{round(IDLE_IN_TRANSACTION * 1000)}ms")
        connection.execute(sql.SQL("SET idle_in_transaction_session_timeout = {}").format(idle_ms))
        connection.commit()

    def close(self) -> None:
        self._closed = True
        with suppress(Exception):
            self._pool.close(timeout=5.0)

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[PgTx]:
        """A write (``READ COMMITTED``) or read (``REPEATABLE READ READ ONLY``) transaction,
        committed when the block ends, rolled back when it raises."""
        connection = self._checkout()
        try:
            connection.isolation_level = (
                IsolationLevel.READ_COMMITTED if write else IsolationLevel.REPEATABLE_READ
            )
            connection.read_only = not write
            xid: str | None = None
            try:
                if write:  # the id that tells a lost COMMIT's outcome (_resolve_lost_commit)
                    xid = _first(connection.execute("SELECT pg_current_xact_id()::text"))
                yield PgTx(connection)
            except BaseException as exc:
                _rollback(connection)
                if isinstance(exc, psycopg.Error):
                    raise self._failure(exc, "nothing was written") from exc
                raise
            self._commit(connection, xid)
        finally:
            self._pool.putconn(connection)

    def _checkout(self) -> psycopg.Connection[Any]:
        """A pooled connection that is alive as far as can be told without a round trip."""
        for _ in range(self._pool.max_size + 1):
            if self._closed:
                raise StoreClosed()
            try:
                connection = self._pool.getconn()
            except PoolTimeout as exc:
                if self._closed:
                    raise StoreClosed() from None
                raise StoreUnavailable(
                    f"{self.where}: no connection within {self.timeout:g}s ({exc})"
                ) from exc
            if _alive(connection):
                return connection
            connection.close()  # the pool replaces a closed connection
            self._pool.putconn(connection)
            # A server that closed one connection (a restart) closed the others too.
            with suppress(Exception):
                self._pool.check()
        raise StoreUnavailable(f"{self.where}: every pooled connection was broken")

    def _commit(self, connection: psycopg.Connection[Any], xid: str | None) -> None:
        try:
            connection.commit()
        except psycopg.Error as exc:
            if xid is None:  # a read: what it read is one consistent snapshot all the same
                return
            if not (connection.closed or connection.broken):
                # The server answered, refusing the commit: it rolled the transaction back.
                raise self._failure(exc, "the commit was refused: nothing was written") from exc
            self._resolve_lost_commit(xid, exc)

    def _resolve_lost_commit(self, xid: str, cause: psycopg.Error) -> None:
        """The connection broke while ``COMMIT`` was in flight: ask the server whether the
        transaction committed. Returns if it did; raises ``StoreUnavailable`` otherwise."""
        deadline = time.monotonic() + self.timeout
        while True:
            status = self._xact_status(xid)
            if status == "committed":
                return
            if status == "aborted":
                raise StoreUnavailable(
                    f"{self.where}: the connection broke while committing ({cause}); the server"
                    " rolled the transaction back: nothing was written"
                ) from cause
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"{self.where}: the connection broke while committing ({cause}) and the"
                    " server could not say whether the commit landed: the outcome is unknown"
                ) from cause
            time.sleep(0.05)  # "in progress" (the old backend is finishing), or no server yet

    def _xact_status(self, xid: str) -> str | None:
        try:
            with self._pool.connection(timeout=self.timeout) as connection:
                connection.isolation_level = IsolationLevel.READ_COMMITTED
                connection.read_only = True
                status = _first(connection.execute("SELECT pg_xact_status(%s::xid8)", [xid]))
                return None if status is None else str(status)
        except psycopg.Error:
            return None

    def _failure(self, exc: psycopg.Error, outcome: str) -> StoreError:
        """The ``StoreError`` for a driver failure inside a transaction (rolled back)."""
        if self._closed:
            return StoreClosed()
        detail = str(exc).strip() or type(exc).__name__
        if isinstance(exc, psycopg.OperationalError):
            # Connection loss, a server shutting down, a deadlock or serialization failure
            # (TransactionRollback is one): the transaction was rolled back; the call may be
            # made again.
            return StoreUnavailable(f"{self.where}: {detail} ({outcome})")
        return StoreError(f"{self.where}: {detail} ({outcome})")


def _first(cursor: psycopg.Cursor[Any]) -> Any:
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def _alive(connection: psycopg.Connection[Any]) -> bool:
    """False for a connection that is closed, broken, or whose socket is readable at rest: a
    server that went away left an end-of-file there (anything else readable, such as a notice,
    is told apart by one round trip)."""
    if connection.closed or connection.broken:
        return False
    try:
        poller = select.poll()  # not select(): a descriptor above 1023 is fine
        poller.register(connection.fileno(), select.POLLIN)
        if poller.poll(0):
            ConnectionPool.check_connection(connection)
    except (OSError, ValueError, psycopg.Error):
        return False
    return True


def _rollback(connection: psycopg.Connection[Any]) -> None:
    with suppress(Exception):
        if not connection.closed:
            connection.rollback()
