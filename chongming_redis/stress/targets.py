"""Where a stress run's store is (``Target``), per kind of store: the driver's connection, the
workers' (through the fault proxy where it can be), the server the run started itself (which
the nemesis may kill -9), the faults that do not apply and why, and what is left at the end.

* **Redis** (no ``--store``, or ``--redis URL``, ``--cluster``): a private ``redis-server``
  with appendfsync always, or the user's Redis in an empty namespace; the RESP fault proxy in
  front of it. The stress app's records are lists in the same Redis.
* **SQLite** (``--store sqlite:///path/new.sqlite3``, or ``--store sqlite``: a new file in the
  run's directory): the workers open the file directly, so there is no server to kill and no
  connection to drop or delay; and the store's clock is the machine's, so one worker's skewed
  clock is a second machine, which SQLite cannot have (``clock_skew`` skipped). The file must
  not exist yet, and is deleted at the end unless ``--keep``.
* **PostgreSQL** (``--store postgresql``: a private server the run starts, which
  ``server_restart`` and the final restart kill -9; or ``--store postgresql://...``: that
  server, in a new schema named after the namespace, dropped at the end unless ``--keep``): the
  workers reach it through the fault proxy in raw mode (bytes, no parsing), which delays and
  resets their connections mid-call; ``drop_reply`` needs a parsed protocol and is skipped.

On a SQL store the app's unfenced records (runs, began, clocks) go to a private side Redis the
run starts and never faults; the fenced effects go to the store's own database
(``sql_records``), in one transaction with the read of the task's row.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.urls import StoreKind, open_store_url, parse_store_url
from chongming_redis.stress import app as stress_app
from chongming_redis.stress import sql_records
from chongming_redis.stress.clients import client_for
from chongming_redis.stress.fault_proxy import FaultProxy
from chongming_redis.stress.faults import KINDS, PROXY_KINDS, SERVER_RESTART, Restartable
from chongming_redis.stress.ground_truth import GroundTruth, RedisTruth, SqlTruth
from chongming_redis.stress.namespace import StressError, delete_namespace, require_empty
from chongming_redis.stress.plumbing import Upstream, upstream_of
from chongming_redis.stress.stress_store import StressStore

DRIVER = "stress-driver"
#: Why the proxy's faults are skipped on Redis Cluster.
ON_CLUSTER = ("on Redis Cluster the workers reach every node at the address it announces: a "
              "proxy in front of one node is not in their way")  # fmt: skip
#: Why a SQLite run skips what needs a server or a connection.
SQLITE_NO_SERVER = ("SQLite has no server; a worker SIGKILLed mid-transaction is its "
                    "equivalent and is in the run (worker_kill)")  # fmt: skip
SQLITE_NO_CONNECTION = ("SQLite is a file each worker opens itself: there is no connection "
                        "for a proxy to delay or drop")  # fmt: skip
SQLITE_NO_FINAL_RESTART = ("SQLite has no server to restart: everything acknowledged is "
                           "read back from the file by a new connection once every worker "
                           "ended")  # fmt: skip
SQLITE_ONE_CLOCK = ("SQLite runs on one machine, whose processes share one wall clock, and the "
                    "store's clock is each process's own (SqliteTaskStore.server_time): a worker "
                    "whose clock alone is 300 s off fakes a second machine, which a SQLite file "
                    "cannot have (tried: a worker 300 s ahead took every bucket, stamped its "
                    "history 300 s late and, once killed, held its buckets for 300 s)")  # fmt: skip
PG_NO_DROP_REPLY = ("the PostgreSQL proxy forwards raw bytes and cannot tell where a reply "
                    "ends; reset_connections drops the connections mid-call instead")  # fmt: skip
GIVEN_SERVER = "--store URL given: the run never kills a server it did not start"
GIVEN_FINAL = "--store URL given: acknowledged writes are read back without a kill -9 and restart"
SQLITE_FILE = "stress.sqlite3"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass
class Target:
    """One run's store. ``namespace`` is the store's (SQLite: ``default``; PostgreSQL: the
    schema); the app's records use the same name."""

    kind: StoreKind
    namespace: str
    direct_url: str  # the driver's and the report's connection
    worker_url: str  # the workers' (through the proxy where it can be)
    proxy: FaultProxy | None = None
    server: Restartable | None = None  # the run's own server: the nemesis may kill it
    side: EmbeddedRedis | None = None  # SQL: the private Redis of the app's records
    skipped: dict[str, str] = field(default_factory=dict)
    cluster: bool = False
    given: bool = False  # the user's store: the run's namespace is deleted at the end
    _records: Any = None

    def kinds(self) -> tuple[str, ...]:
        """The fault kinds that apply, in ``KINDS``' order (a SQL store's server restart in
        ``redis_restart``'s place, so a seed's schedule keeps its shape)."""
        restart = "redis_restart" if self.kind == "redis" else SERVER_RESTART
        named = (restart if k == "redis_restart" else k for k in KINDS)
        return tuple(k for k in named if k not in self.skipped)

    def app_env(self) -> dict[str, str]:
        """The stress app's environment in the workers (``stress_app.URL_ENV``, ...)."""
        if self.side is None:
            return {stress_app.URL_ENV: self.worker_url, stress_app.NS_ENV: self.namespace}
        return {stress_app.URL_ENV: self.side.url, stress_app.NS_ENV: self.namespace,
                stress_app.STORE_ENV: self.worker_url}  # fmt: skip

    def open_store(self) -> StressStore:
        """The driver's store. Redis: enough retries (about 6 s of backoff) that a call rides
        out the run's own ``redis_restart`` (down for up to about 1.5 s) instead of ending
        indeterminate. SQL: the store as ``--store`` opens it, and the run's effects table."""
        if self.kind == "redis":
            store: StressStore = RedisTaskStore.from_url(
                self.direct_url, namespace=self.namespace, socket_timeout=5, retries=8,
                audit=True, audit_owner=DRIVER, cluster=self.cluster,
            )  # fmt: skip
            return store
        opened: Any = open_store_url(self.direct_url, namespace=self.namespace)
        sql_records.create_effects_table(self.direct_url, self.namespace)
        return opened  # type: ignore[no-any-return]

    def records(self, store: StressStore) -> Any:
        """The Redis client of the app's records: the store's own, or the side Redis's."""
        if self.side is None:
            return store.client  # type: ignore[attr-defined]
        if self._records is None:
            self._records = client_for(self.side.url, cluster=False, socket_timeout=5)
        return self._records

    def truth(self, store: StressStore) -> GroundTruth:
        if self.kind == "redis":
            return RedisTruth(self.namespace, self.records(store), store=store)
        return SqlTruth(self.namespace, self.records(store), store_url=self.direct_url,
                        schema=self.namespace)  # fmt: skip

    def final_restart(self, store: StressStore) -> tuple[StressStore, bool]:
        """kill -9 and restart of the run's own server, then the store opened again; whether
        it was done (not on a given server, nor on SQLite)."""
        if self.server is None:
            return store, False
        store.close()
        self.server.kill9()
        self.server.restart()
        return self.open_store(), True

    def finish(self, store: StressStore, keep: bool) -> dict[str, str]:
        """Delete what the run wrote (unless ``keep``), close everything it opened; what was
        kept, for the report."""
        kept: dict[str, str] = {}
        if self.proxy is not None:
            self.proxy.close()
        if self.kind == "postgresql" and self.given and not keep:
            store.drop_schema()  # type: ignore[attr-defined]
        store.close()
        if self._records is not None:
            self._records.close()
        if self.side is not None:
            self.side.stop()
        if self.kind == "redis":
            kept.update(self._finish_redis(keep))
        elif self.kind == "sqlite":
            kept.update(self._finish_sqlite(keep))
        elif self.server is not None:
            kept.update(self._finish_postgres(keep))
        return kept

    def _finish_redis(self, keep: bool) -> dict[str, str]:
        if isinstance(self.server, EmbeddedRedis):
            if keep:
                self.server.terminate()
                return {"redis_dir": str(self.server.dir)}
            self.server.stop()
        elif not keep:
            delete_namespace(self.direct_url, self.namespace, self.cluster)
        return {}

    def _finish_sqlite(self, keep: bool) -> dict[str, str]:
        path = parse_store_url(self.direct_url).path or ""
        if keep:
            return {"sqlite_file": path}
        for suffix in ("", *SQLITE_SIDE_FILES):  # the store is closed: its files can go
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
        return {}

    def _finish_postgres(self, keep: bool) -> dict[str, str]:
        server: Any = self.server
        if keep:
            server.stop()
            return {"postgres_dir": str(server.dir)}
        server.close()
        return {}


def prepare(opts: Any, namespace: str, workdir: Path) -> Target:
    """The run's store from its options (``harness.Options``): started, checked empty, with
    the proxy in front of it where the workers can be proxied. ``StressError`` for a store the
    run cannot use."""
    if opts.store is None:
        return _redis_target(opts, namespace)
    kind = "postgresql" if opts.store == "postgresql" else "sqlite" if opts.store == "sqlite" \
        else parse_store_url(opts.store).kind  # fmt: skip
    if kind == "redis":
        raise StressError("give a Redis with --redis URL (--store is for SQLite and PostgreSQL)")
    unsafe = opts.unsafe or os.environ.get(stress_app.UNSAFE_ENV)
    if unsafe and unsafe not in SQL_CONTROLS:
        raise StressError(f"the negative control {unsafe!r} patches the Redis store; on "
                          f"{kind} only {', '.join(SQL_CONTROLS)} run")  # fmt: skip
    side = EmbeddedRedis(port=0, prefix="chongming-stress-records-").start()
    try:
        if kind == "sqlite":
            return _sqlite_target(opts, workdir, side)
        return _postgres_target(opts, namespace, side)
    except BaseException:
        side.stop()
        raise


#: The negative controls that patch no store (``stress_app``): the only ones a SQL run takes.
SQL_CONTROLS = ("double-run", "ignore-parents")


def _redis_target(opts: Any, namespace: str) -> Target:
    if opts.cluster and not opts.redis:
        raise StressError("--cluster needs --redis: the URL of a node of the cluster")
    if opts.redis:
        require_empty(opts.redis, namespace, opts.cluster)
    server: EmbeddedRedis | None = None
    if opts.redis:
        upstream = upstream_of(opts.redis)
    else:
        server = EmbeddedRedis(port=0, prefix="chongming-stress-redis-").start()
        upstream = upstream_of(server.url)
    skipped: dict[str, str] = {}
    if server is None:
        skipped["redis_restart"] = "--redis given: the run never kills a server it did not start"
        skipped["final_restart"] = (
            "--redis given: acknowledged writes are read back without a kill -9 and restart"
        )
    if opts.cluster:
        upstream = Upstream(upstream.url, None, 0, ON_CLUSTER)
    if upstream.host is None:
        skipped.update({k: upstream.why_not_proxied for k in PROXY_KINDS})
    proxy = None
    if upstream.host is not None:
        proxy = FaultProxy(upstream.host, upstream.port, allow_remote=server is None)
    worker_url = upstream.through(proxy.port) if proxy is not None else upstream.url
    return Target("redis", namespace, upstream.url, worker_url, proxy, server, None, skipped,
                  cluster=opts.cluster, given=server is None)  # fmt: skip


def _sqlite_target(opts: Any, workdir: Path, side: EmbeddedRedis) -> Target:
    url = f"sqlite://{workdir / SQLITE_FILE}" if opts.store == "sqlite" else opts.store
    path = Path(parse_store_url(url).path or "")
    check_new_sqlite(path)
    skipped = {k: SQLITE_NO_CONNECTION for k in PROXY_KINDS}
    skipped[SERVER_RESTART] = SQLITE_NO_SERVER
    skipped["clock_skew"] = SQLITE_ONE_CLOCK
    skipped["final_restart"] = SQLITE_NO_FINAL_RESTART
    return Target("sqlite", "default", url, url, side=side, skipped=skipped)


def check_new_sqlite(path: Path) -> None:
    """The run makes its own file (and deletes it at the end): never one that exists."""
    if path.exists():
        raise StressError(f"{path} exists: the stress run makes its own SQLite database "
                          "and deletes it at the end (name a file that does not exist "
                          "yet)")  # fmt: skip
    if not path.parent.is_dir():
        raise StressError(f"no directory {path.parent} for the SQLite database {path.name}")


def _postgres_target(opts: Any, namespace: str, side: EmbeddedRedis) -> Target:
    from chongming_redis.embedded.postgres_server import PostgresProc

    # The driver's pool logs every failed reconnection while the nemesis has the server down
    # (expected, and in the fault log): not on the run's terminal, whose table is the report.
    logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())
    server = None
    if opts.store == "postgresql":
        try:
            server = PostgresProc()
        except RuntimeError as exc:  # not installed, initdb failed, did not start
            raise StressError(f"cannot start a private PostgreSQL: {exc}") from None
        url = server.dsn
    else:
        url = opts.store
        if sql_records.schema_exists(url, namespace):
            raise StressError(f"schema {namespace!r} already exists; the stress run needs a "
                              "schema of its own (it drops it at the end)")  # fmt: skip
    skipped = {"drop_reply": PG_NO_DROP_REPLY}
    if server is None:
        skipped.update({SERVER_RESTART: GIVEN_SERVER, "final_restart": GIVEN_FINAL})
    try:
        return _proxied_postgres(url, namespace, server, side, skipped)
    except BaseException:
        if server is not None:
            server.close()
        raise


def _proxied_postgres(url: str, namespace: str, server: Any, side: EmbeddedRedis,
                      skipped: dict[str, str]) -> Target:  # fmt: skip
    """The workers' URL through the raw proxy (not for a unix socket's host)."""
    parts = urlsplit(url)
    proxy = None
    worker_url = url
    if parts.hostname and not parts.hostname.startswith("/"):
        proxy = FaultProxy(parts.hostname, parts.port or 5432, allow_remote=server is None,
                           raw=True)  # fmt: skip
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
        worker_url = urlunsplit(parts._replace(netloc=netloc))
    else:
        reason = "the workers reach PostgreSQL on a unix socket; the fault proxy speaks TCP"
        skipped.update({k: reason for k in PROXY_KINDS})
    return Target("postgresql", namespace, url, worker_url, proxy, server, side, skipped,
                  given=server is None)  # fmt: skip
