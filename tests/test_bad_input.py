"""Bad input (the guide's argument rules, awkward ids, corrupt data) on every built-in store.

Every refusal is checked twice: the typed error, and that the store is unchanged afterwards
(memory: its rows, ``query()``, ``counts()`` and history; Redis: the ``DUMP`` of every key of the
namespace, and, for refusals that must happen before any Redis call, the server's
``total_commands_processed`` and ``DBSIZE``; SQLite: every row of every table, read through a
second connection, and, for refusals that must happen before any I/O, the statements the
store's connection ran, counted by a trace callback). Corrupt SQLite rows:
tests/test_sqlite_store.py.

Where each item is proven (this file adds what the others do not):

====  =========================================================================================
B1    here: ``test_b1_*`` (refused ids at every store entry point, no Redis call; awkward ids
      round-trip and never collide, NFC vs NFD). Model level: tests/test_model.py
      ``test_unusable_identifiers_are_refused``, ``test_a_1024_byte_identifier_is_accepted``,
      ``test_awkward_but_valid_identifiers_are_accepted``.
B2    here: ``test_b2_*`` (end to end on a server: every key the store writes stays in the
      namespace's slot and matches its SCAN pattern; lookups by tag/name/pipeline are exact).
      Key builders: tests/test_redis_store.py
      ``test_every_key_of_any_identifier_stays_in_the_namespace_slot``.
B3    tests/test_redis_store.py ``test_keys_of_different_kinds_never_collide`` (⚑) and
      ``test_a_task_named_like_an_internal_suffix_is_its_own_task``; here ``x:history``-style
      ids are in the B1/B2 alphabets and must not collide end to end.
B4    here: ``test_b4_*``. Codec limit: tests/test_codec.py
      ``test_payload_of_exactly_the_limit_is_accepted_and_one_more_byte_is_refused``.
B5    here: ``test_b5_*`` (bytes ids refused, binary payloads byte-transparent, BOM and mixed
      normalisation). Non-UTF-8 data written by another client: tests/test_redis_store.py
      ``CORRUPT_CASES["name not utf-8"]``.
B6    here: ``test_b6_*`` (store entry points, offsets, range, microseconds). Model/codec:
      tests/test_model.py ``test_naive_datetimes_are_refused*``,
      ``test_out_of_range_datetimes_are_refused``; tests/test_codec.py
      ``test_property_datetimes_round_trip_to_the_microsecond_in_any_offset``.
B7    here: ``test_b7_*`` (versions, limits, keep_terminal, lease_seconds at the store).
      Model: tests/test_model.py ``test_bool_float_and_str_are_refused_where_an_int_is_meant``;
      contract: ``test_save_refuses_a_bool_or_negative_expect_version``.
B8    here: ``test_b8_*``; contract: ``test_save_with_a_stale_version_*``,
      ``test_save_allows_the_version_to_jump``; retried write ids: tests/test_redis_retry.py
      ``test_a_retried_save_whose_reply_was_lost_is_reported_applied`` (and create/submit).
B9    here: ``test_b9_*`` (history ahead of the task, leases out of range, extra fields,
      object/duplicate-key tags, corrupt command fields at claim). Wrong key types, bad
      versions, unknown status, truncated JSON: tests/test_redis_store.py ``CORRUPT_CASES``,
      ``test_corrupt_history_and_commands_*``, ``test_a_corrupt_task_found_by_query_or_prune_*``.
B10   here: ``test_b10_*``; contract ``test_prune_*``; batches: tests/test_redis_store.py
      ``test_prune_runs_in_bounded_batches_and_removes_every_key_of_a_task``.
B11   here: ``test_b11_*``; contract ``test_claim_refuses_a_lease_that_is_not_*``,
      ``test_complete_of_an_unknown_command_*``, ``test_release_of_a_finished_command_*``.
====  =========================================================================================
"""

from __future__ import annotations

import copy
import sqlite3
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql as pg_sql
from redis.crc import key_slot

from chongming_redis import (
    Command,
    CommandKind,
    CommandNotFound,
    ConcurrencyConflict,
    CorruptRecord,
    InMemoryTaskStore,
    Progress,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores.codec import MAX_PAYLOAD_BYTES, snapshot_to_row
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
BACKENDS = ["memory", "redis", "sqlite", "postgres"]
#: The session fixture of each backend's server (the others need none).
SERVERS = {"redis": "redis_proc", "postgres": "postgres_proc"}
BAD = (TypeError, ValueError)
PROP = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def task(task_id: str, **fields: object) -> TaskSnapshot:
    base: dict[str, object] = {"name": "job", "status": TaskStatus.PENDING, "status_version": 1,
                               "created_at": T0, "updated_at": T0}  # fmt: skip
    base.update(fields)
    return TaskSnapshot(task_id, **base)  # type: ignore[arg-type]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Harness:
    """One store plus a fingerprint of everything it holds."""

    def __init__(self, backend: str, server: Any, place: SqlPlace | None = None) -> None:
        self.backend = backend
        self.place = place
        self.client: redis.Redis | None = None
        self.store: Any
        # SQL statements the SQLite store's connection ran; on PostgreSQL, the transactions
        # the store opened (every call that reaches the server opens one).
        self.statements = 0
        # Set by ``refusals_harness``: the store is used through ``refuses`` only, so the
        # fingerprint after one refusal is the one before the next (``unchanged``).
        self.only_refusals = False
        self._known: Any = None
        if backend == "memory":
            self.store = InMemoryTaskStore()
            self.namespace = ""
        elif backend == "sqlite":
            if place is None:
                self._dir = tempfile.TemporaryDirectory(prefix="bad-input-")
                self.path = Path(self._dir.name) / "bad.sqlite3"
            else:
                self.path = place.path
            self.store = SqliteTaskStore(self.path)
            self.namespace = ""
            self.store._connection().set_trace_callback(self._count_statement)
        elif backend == "postgres":
            self.namespace = f"bad_{uuid.uuid4().hex[:12]}" if place is None else place.schema
            self.store = PostgresTaskStore(server.dsn, schema=self.namespace)
            self.reader = (
                psycopg.connect(server.dsn, autocommit=True) if place is None else place.reader
            )
            opened = self.store._transaction

            def counted(*, write: bool) -> Any:
                self._count_statement("transaction")
                return opened(write=write)

            self.store._transaction = counted
        else:
            assert server is not None
            self.namespace = f"bad-{uuid.uuid4().hex[:12]}"
            self.store = RedisTaskStore.from_url(
                server.url, namespace=self.namespace, check_server=False
            )
            self.client = server.client()

    @property
    def redis(self) -> redis.Redis:
        assert self.client is not None
        return self.client

    @property
    def keys(self) -> Keys:
        return self.store.keys  # type: ignore[no-any-return]

    def _count_statement(self, statement: str) -> None:
        self.statements += 1

    def close(self) -> None:
        if self.backend == "postgres" and self.place is None:
            self.store.drop_schema()
            self.reader.close()
        self.store.close()
        if self.client is not None:
            self.client.close()
        if self.backend == "sqlite" and self.place is None:
            self._dir.cleanup()

    def fingerprint(self) -> Any:
        if self.backend == "sqlite":
            return sqlite_rows(self.path)
        if self.backend == "postgres":
            return postgres_rows(self.reader, self.namespace)
        if self.client is None:
            s = self.store
            rows = copy.deepcopy((s._tasks, s._history, s._commands))
            histories = {t: s.history(t) for t in s._tasks}
            return rows, s.query(), s.counts(), histories
        # DBSIZE without the volatile keys (one INFO snapshot of both): other tests' claim
        # memos expire at any moment.
        db = self.client.info("keyspace").get("db0", {"keys": 0, "expires": 0})
        return dump_namespace(self.client, self.namespace), db["keys"] - db["expires"]

    def commands_processed(self) -> int:
        assert self.client is not None
        return int(self.client.info("stats")["total_commands_processed"])

    @contextmanager
    def unchanged(self, *, no_server_call: bool = False) -> Iterator[None]:
        """The block must leave the store byte-identical (and, if asked, send Redis nothing)."""
        known, self._known = self._known, None
        before = known if known is not None and self.only_refusals else self.fingerprint()
        calls = self.commands_processed() if no_server_call and self.client else 0
        statements = self.statements
        yield
        if no_server_call and self.client is not None:
            # INFO itself is the one command between the two readings.
            assert self.commands_processed() - calls == 1, "a refused call reached Redis"
        if no_server_call:
            assert self.statements == statements, f"a refused call reached {self.backend}"
        after = self.fingerprint()
        assert after == before
        self._known = after

    def refuses(
        self, error: type[BaseException] | tuple[type[BaseException], ...], call: Callable[[], Any]
    ) -> BaseException:
        with self.unchanged(no_server_call=True), pytest.raises(error) as caught:
            call()
        assert not isinstance(caught.value, RecursionError)
        return caught.value


def sqlite_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the database, read through a connection of its own."""
    with closing(sqlite3.connect(path)) as db:
        tables = [
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


def postgres_rows(db: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the schema, read through a connection of its own."""
    rows = {}
    tables = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema])
    for (table,) in tables.fetchall():
        select = pg_sql.SQL("SELECT * FROM {}").format(pg_sql.Identifier(schema, table))
        rows[table] = sorted(db.execute(select).fetchall(), key=repr)
    return rows


def dump_namespace(client: redis.Redis, namespace: str) -> dict[bytes, bytes | None]:
    pattern = Keys(namespace).pattern()[1:]  # the ACL pattern is '~' + a glob
    return {key: client.dump(key) for key in client.scan_iter(match=pattern, count=1000)}


def server_of(request: pytest.FixtureRequest, backend: str) -> Any:
    """The session's server ``backend`` runs on (``None``: it needs none)."""
    fixture = SERVERS.get(backend)
    return None if fixture is None else request.getfixturevalue(fixture)


@pytest.fixture(params=BACKENDS)
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = Harness(request.param, server_of(request, request.param))
    yield harness
    harness.close()


class SqlPlace:
    """The SQLite file or PostgreSQL schema that the examples of one @given test take turns on
    (``harness``), instead of each creating a database of its own (the schema's DDL was most of
    an example's cost). ``pristine``: every row of every table just after the first store
    created it, i.e. what a new database holds; ``empty`` puts exactly that back."""

    def __init__(self, backend: str, server: Any) -> None:
        self.backend = backend
        self.pristine: dict[str, list[tuple[Any, ...]]] | None = None
        if backend == "sqlite":
            self._dir = tempfile.TemporaryDirectory(prefix="bad-input-")
            self.path = Path(self._dir.name) / "bad.sqlite3"
        else:
            self.schema = f"bad_{uuid.uuid4().hex[:12]}"
            self.reader = psycopg.connect(server.dsn, autocommit=True)

    def rows(self) -> dict[str, list[tuple[Any, ...]]]:
        if self.backend == "sqlite":
            return sqlite_rows(self.path)
        return postgres_rows(self.reader, self.schema)

    def empty(self) -> None:
        """Delete every row the examples wrote and put back the pristine ones (meta, the
        schema version); then every table holds exactly what it held new (checked). No table
        has a sequence or an AUTOINCREMENT counter that a deleted row would leave behind."""
        assert self.pristine is not None
        if self.backend == "sqlite":
            with closing(sqlite3.connect(self.path)) as db, db:
                for table in self.rows():
                    db.execute(f'DELETE FROM "{table}"')
                for table, rows in self.pristine.items():
                    for row in rows:
                        marks = ", ".join("?" * len(row))
                        db.execute(f'INSERT INTO "{table}" VALUES ({marks})', row)
        else:
            with self.reader.transaction():
                for table in self.rows():
                    name = pg_sql.Identifier(self.schema, table)
                    self.reader.execute(pg_sql.SQL("DELETE FROM {}").format(name))
                for table, rows in self.pristine.items():
                    for row in rows:
                        values = pg_sql.SQL(", ").join(pg_sql.Placeholder() * len(row))
                        insert = pg_sql.SQL("INSERT INTO {} VALUES ({})").format(
                            pg_sql.Identifier(self.schema, table), values
                        )
                        self.reader.execute(insert, row)
        assert self.rows() == self.pristine, "the database is not back to what it held new"

    def close(self) -> None:
        if self.backend == "sqlite":
            self._dir.cleanup()
        else:
            drop = pg_sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
            self.reader.execute(drop.format(pg_sql.Identifier(self.schema)))
            self.reader.close()


@contextmanager
def harness(backend: str, request: pytest.FixtureRequest) -> Iterator[Harness]:
    """For @given tests: a fresh, empty store per example. Memory and Redis: a new store (a new
    namespace). SQLite and PostgreSQL: a new store object on the test's one database
    (``SqlPlace``), emptied back to exactly the rows a new one holds before every example but
    the first."""
    place: SqlPlace | None = None
    if backend in ("sqlite", "postgres"):
        node: Any = request.node
        place = getattr(node, "_bad_input_place", None)
        if place is None:
            place = node._bad_input_place = SqlPlace(backend, server_of(request, backend))
            request.addfinalizer(place.close)
        else:
            place.empty()
    made = Harness(backend, server_of(request, backend), place)
    if place is not None and place.pristine is None:
        place.pristine = place.rows()
    try:
        yield made
    finally:
        made.close()


def refusals_harness(
    backend: str, request: pytest.FixtureRequest, prepare: Callable[[Harness], object]
) -> Harness:
    """For @given tests whose examples make only refused calls: one store for every example of
    the test (made and ``prepare``d by the first). Each example still starts from exactly what
    a fresh store holds after ``prepare``: every refusal is checked to leave the store
    byte-identical and to reach no server (``Harness.refuses``), so a refusal that changed
    anything fails its own example, as it did on a fresh store. The fingerprint a refusal is
    checked against is the one taken after the refusal before it (``only_refusals``): the
    store was checked to be exactly that, and nothing else used it since."""
    node: Any = request.node
    made: Harness | None = getattr(node, "_refusals_harness", None)
    if made is None:
        made = Harness(backend, server_of(request, backend))
        request.addfinalizer(made.close)
        prepare(made)
        made.only_refusals = True
        node._refusals_harness = made
    return made


def populate(h: Harness) -> None:
    """Something to lose: tasks, history and a command."""
    h.store.create(task("a", tags=frozenset({"io"}), params={"p": 1}))
    h.store.create(task("b", status=TaskStatus.SUCCEEDED, created_at=at(1)))
    h.store.append(Transition("a", 1, None, TaskStatus.PENDING, T0))
    h.store.submit_command(Command("c1", "a", CommandKind.STOP, T0))


# -- B1 malformed ids ⚑ ----------------------------------------------------------------------

REFUSED_IDS = st.one_of(
    st.just(""),
    st.integers(min_value=1025, max_value=3000).map(lambda n: "x" * n),
    st.integers(min_value=342, max_value=600).map(lambda n: "€" * n),  # 3 bytes each: >1024
    st.text(max_size=5).flatmap(
        lambda s: st.sampled_from(["\ud800", "\udfff", "\udc80"]).map(lambda c: s + c + s)
    ),
    st.binary(min_size=0, max_size=10),
    st.integers(),
    st.none(),
    st.floats(allow_nan=False),
    st.just(["a"]),
)

SPECIALS = ["x:history", "h:x", "t:x", "x:h", "..", ".", " ", "   ", " a ", "\x00", "a\x00",
            "\n", "\r\n", "\t", "é", unicodedata.normalize("NFD", "é"), "\ufeff", "\ufeffx",
            "a:b", "{evil}", "x}y", "{", "}", "*", "?", "a[b]", "[", "]", "\\", "c:x", "ix:x",
            "tag:x", "p:x", "term", "counts", "cq", "cl", "€" * 341, "x" * 1024]  # fmt: skip
ALLOWED_IDS = st.one_of(
    st.sampled_from(SPECIALS),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
)


def id_entry_points(store: Any, bad: object) -> list[Callable[[], Any]]:
    required = [
        lambda: store.get(bad),
        lambda: store.history(bad),
        lambda: store.touch(bad, heartbeat_at=T0),
        lambda: store.complete_command(bad, now=T0),
        lambda: store.release_command(bad, now=T0),
        lambda: store.create(task(bad)),  # type: ignore[arg-type]
        lambda: store.create(task("ok", name=bad)),
        lambda: store.create(task("ok", tags=frozenset({bad}))),
        lambda: store.submit_command(Command(bad, "t", CommandKind.STOP, T0)),  # type: ignore[arg-type]
        lambda: store.append(Transition(bad, 1, None, TaskStatus.PENDING, T0)),  # type: ignore[arg-type]
    ]
    optional = [  # None means "no filter" / "none" here
        lambda: store.query(TaskQuery(tag=bad)),  # type: ignore[arg-type]
        lambda: store.query(TaskQuery(name=bad)),  # type: ignore[arg-type]
        lambda: store.query(TaskQuery(pipeline_run_id=bad)),  # type: ignore[arg-type]
        lambda: store.create(task("ok", pipeline_run_id=bad)),
        lambda: store.touch("a", lease_owner=bad),
    ]
    return required if bad is None else required + optional


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(bad=REFUSED_IDS)
def test_b1_a_refused_id_raises_a_typed_error_before_any_redis_call(
    backend: str, request: pytest.FixtureRequest, bad: object
) -> None:
    h = refusals_harness(backend, request, lambda made: made.store.create(task("a")))
    for call in id_entry_points(h.store, bad):
        h.refuses(BAD, call)


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(ids=st.lists(ALLOWED_IDS, min_size=1, max_size=8, unique=True))
def test_b1_allowed_but_awkward_ids_round_trip_exactly_and_never_collide(
    backend: str, request: pytest.FixtureRequest, ids: list[str]
) -> None:
    with harness(backend, request) as h:
        for i, ident in enumerate(ids):
            h.store.create(task(ident, created_at=at(i), params=ident))
            h.store.append(Transition(ident, 1, None, TaskStatus.PENDING, at(i), reason=ident))
        for i, ident in enumerate(ids):
            got = h.store.get(ident)
            assert got == task(ident, created_at=at(i), params=ident)
            assert h.store.history(ident)[0].reason == ident
        assert [s.task_id for s in h.store.query()] == ids
        if h.client is not None:
            root = len(h.keys.root)
            keys = dump_namespace(h.redis, h.namespace)
            kinds = [key[root:].split(b":", 1)[0] for key in keys]
            assert kinds.count(b"t") == len(ids) and kinds.count(b"h") == len(ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_b1_nfc_and_nfd_forms_of_one_name_are_two_different_ids(
    backend: str, request: pytest.FixtureRequest
) -> None:
    nfc, nfd = "café", unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    with harness(backend, request) as h:
        h.store.create(task(nfc, name=nfc, tags=frozenset({nfc})))
        h.store.create(task(nfd, name=nfd, tags=frozenset({nfd}), status_version=5))
        assert h.store.get(nfc).status_version == 1
        assert h.store.get(nfd).status_version == 5
        assert [s.task_id for s in h.store.query(TaskQuery(tag=nfd))] == [nfd]
        assert [s.task_id for s in h.store.query(TaskQuery(name=nfc))] == [nfc]


# -- B2 key-name injection ⚑ -----------------------------------------------------------------

INJECT = st.text(alphabet=":{}*?[]\\ab^-!", min_size=1, max_size=12)


def persistent_keys(client: redis.Redis) -> int:
    """Keys without a TTL in db 0, from one INFO snapshot."""
    db = client.info("keyspace").get("db0", {"keys": 0, "expires": 0})
    return int(db["keys"]) - int(db["expires"])


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(ids=st.lists(INJECT, min_size=2, max_size=4, unique=True), tag=INJECT, pid=INJECT)
def test_b2_injection_characters_stay_inside_the_namespace_and_never_collide(
    backend: str, request: pytest.FixtureRequest, ids: list[str], tag: str, pid: str
) -> None:
    with harness(backend, request) as h:
        before_db = persistent_keys(h.redis) if h.client is not None else 0
        for i, ident in enumerate(ids):
            h.store.create(task(ident, name=ident, tags=frozenset({tag, ident}),
                                pipeline_run_id=pid if i == 0 else ident,
                                status=TaskStatus.FAILED, created_at=at(i)))  # fmt: skip
            h.store.submit_command(Command(ident, ident, CommandKind.PAUSE, at(i)))
        first = ids[0]
        assert [s.task_id for s in h.store.query(TaskQuery(tag=tag))] == ids
        assert [s.task_id for s in h.store.query(TaskQuery(pipeline_run_id=pid))] == (
            [first] if pid not in ids[1:] else [first, *[x for x in ids[1:] if x == pid]]
        )
        for ident in ids:
            assert [s.task_id for s in h.store.query(TaskQuery(name=ident))] == [ident]
            assert [s.task_id for s in h.store.query(TaskQuery(name_prefix=ident))] == [
                x for x in ids if x.startswith(ident)
            ]
        claimed = h.store.claim_commands(now=at(9), lease_seconds=5)
        assert sorted(c.command_id for c in claimed) == sorted(ids)
        if h.client is not None:
            keys = dump_namespace(h.redis, h.namespace)
            # Everything written is found by the namespace's own (escaped) SCAN pattern (keys
            # without a TTL: other tests' claim memos expire at any moment) ...
            lasting = [key for key in keys if h.redis.pttl(key) == -1]
            assert persistent_keys(h.redis) - before_db == len(lasting)
            slot = key_slot(h.namespace.encode())
            for key in keys:
                # ... and lives in the namespace's slot, whatever '{' '}' the id held.
                assert key.startswith(h.keys.root.encode()) and key_slot(key) == slot, key


# -- B4 huge payloads -------------------------------------------------------------------------


def exact_size_bytes(total: int) -> bytes:
    """A ``bytes`` payload whose msgpack encoding is exactly ``total`` bytes (bin32 header)."""
    return b"x" * (total - 5)


def nested(depth: int, kind: str) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def test_b4_huge_payloads(h: Harness) -> None:
    small = {"blob": b"\x00" * 1024}
    h.store.create(task("small", params=small))
    assert h.store.get("small").params == small

    at_limit = exact_size_bytes(MAX_PAYLOAD_BYTES)
    below = exact_size_bytes(MAX_PAYLOAD_BYTES - 1)
    h.store.create(task("limit", params=at_limit, result=below))
    got = h.store.get("limit")
    assert got.params == at_limit and got.result == below

    over = exact_size_bytes(MAX_PAYLOAD_BYTES + 1)
    h.refuses(ValueError, lambda: h.store.create(task("over", params=over)))
    h.refuses(ValueError, lambda: h.store.save(task("limit", status_version=2, result=over),
                                               expect_version=1))  # fmt: skip
    h.refuses(ValueError, lambda: h.store.submit_command(
        Command("big", "limit", CommandKind.STOP, T0, payload=over)))  # fmt: skip

    huge = b"\x01" * (64 * 1024 * 1024)
    started = time.perf_counter()
    h.refuses(ValueError, lambda: h.store.create(task("huge", params=huge)))
    print(f"\n[B4 {h.backend}] 64 MiB refused in {time.perf_counter() - started:.3f}s")

    for kind in ("list", "dict"):
        deep = nested(10_000, kind)
        h.refuses(ValueError, lambda deep=deep: h.store.create(task("deep", params=deep)))


def test_b4_a_100k_field_dict_within_the_limit_is_stored_and_read_back(h: Harness) -> None:
    wide = {f"{i:05x}": 0 for i in range(100_000)}
    slowlog = h.client is not None
    if slowlog:
        old = h.redis.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
        h.redis.config_set("slowlog-log-slower-than", 0)
        h.redis.slowlog_reset()
    try:
        started = time.perf_counter()
        h.store.create(task("wide", params=wide, tags=frozenset({"t"})))
        elapsed = time.perf_counter() - started
        if slowlog:
            entries = [e for e in h.redis.slowlog_get(128) if b"EVALSHA" in e["command"].upper()]
            script_us = max(e["duration"] for e in entries)
            print(f"\n[B4 redis] create of a 100k-field dict: script {script_us} us, "
                  f"round trip {elapsed * 1000:.1f} ms")  # fmt: skip
        else:
            print(f"\n[B4 memory] create of a 100k-field dict: {elapsed * 1000:.1f} ms")
    finally:
        if slowlog:
            h.redis.config_set("slowlog-log-slower-than", old)
    assert h.store.get("wide").params == wide
    assert [s.task_id for s in h.store.query(TaskQuery(tag="t"))] == ["wide"]


# -- B5 non-UTF-8 and odd text ⚑ -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(
    raw=st.binary(min_size=1, max_size=64),
    text=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
    form=st.sampled_from(["NFC", "NFD", "NFKC", "NFKD"]),
)
def test_b5_bytes_ids_are_refused_and_odd_text_round_trips(
    backend: str, request: pytest.FixtureRequest, raw: bytes, text: str, form: str
) -> None:
    with harness(backend, request) as h:
        for call in id_entry_points(h.store, raw):
            h.refuses(TypeError, call)
        bom = "\ufeff" + text
        mixed = unicodedata.normalize(form, text) + unicodedata.normalize("NFD", text)
        ids = list(dict.fromkeys([text, bom, mixed]))
        for i, ident in enumerate(ids):
            h.store.create(task(ident, name=bom, params={"raw": raw, "t": mixed},
                                tags=frozenset({bom, mixed}), created_at=at(i)))  # fmt: skip
        for i, ident in enumerate(ids):
            got = h.store.get(ident)
            assert got == task(ident, name=bom, params={"raw": raw, "t": mixed},
                               tags=frozenset({bom, mixed}), created_at=at(i))  # fmt: skip
            assert got.params["raw"] == raw  # binary payloads are byte-transparent
        assert [s.task_id for s in h.store.query(TaskQuery(tag=mixed))] == ids
        assert [s.task_id for s in h.store.query(TaskQuery(name=bom))] == ids


# -- B6 datetimes ⚑ --------------------------------------------------------------------------

OFFSETS = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda m: timezone(timedelta(minutes=m))
)
MOMENTS = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(2255, 6, 1), timezones=st.just(timezone.utc)
)


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(moment=MOMENTS, tz1=OFFSETS, tz2=OFFSETS)
def test_b6_one_instant_in_any_offset_round_trips_to_the_same_utc_microsecond(
    backend: str, request: pytest.FixtureRequest, moment: datetime, tz1: timezone, tz2: timezone
) -> None:
    one, two = moment.astimezone(tz1), moment.astimezone(tz2)
    assert one == two
    with harness(backend, request) as h:
        h.store.create(task("a", created_at=one, updated_at=two, not_before=one))
        h.store.create(task("b", created_at=two, updated_at=one))
        h.store.touch("a", heartbeat_at=two, lease_owner="w", lease_until=one)
        a, b = h.store.get("a"), h.store.get("b")
        for value in (a.created_at, a.updated_at, a.not_before, a.heartbeat_at, a.lease_until,
                      b.created_at, b.updated_at):  # fmt: skip
            assert value == moment and value.tzinfo is timezone.utc
            assert value.microsecond == moment.microsecond
        assert a.created_at == b.created_at
        # Equal instants tie on created_at, then order by id, whatever offset they came in.
        assert [s.task_id for s in h.store.query()] == ["a", "b"]


BAD_MOMENTS = [
    datetime(2025, 1, 1),  # naive
    datetime(1, 1, 1, tzinfo=timezone.utc),
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),  # its UTC would be in year 0
    datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),  # ... in year 10000
    datetime(9999, 12, 31, tzinfo=timezone.utc),
    datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone.utc),
    datetime(1970, 1, 1, 5, tzinfo=timezone(timedelta(hours=6))),  # 1969 in UTC
    datetime(2255, 6, 6, tzinfo=timezone.utc),
    datetime(2300, 1, 1, tzinfo=timezone.utc),
]


def dt_entry_points(store: Any, bad: object) -> list[Callable[[], Any]]:
    return [
        lambda: store.touch("a", heartbeat_at=bad),
        lambda: store.touch("a", lease_until=bad, lease_owner="w"),
        lambda: store.claim_commands(now=bad, lease_seconds=5),
        lambda: store.complete_command("c1", now=bad),
        lambda: store.release_command("c1", now=bad),
        lambda: store.create(task("new", created_at=bad)),
        lambda: store.save(task("a", status_version=2, updated_at=bad), expect_version=1),
        lambda: store.append(Transition("a", 2, None, TaskStatus.PENDING, bad)),  # type: ignore[arg-type]
        lambda: store.submit_command(Command("c9", "a", CommandKind.STOP, bad)),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("bad", BAD_MOMENTS, ids=lambda d: d.isoformat())
def test_b6_naive_and_unstorable_datetimes_raise_value_error_before_any_call(
    h: Harness, bad: datetime
) -> None:
    populate(h)
    for call in dt_entry_points(h.store, bad):
        h.refuses(ValueError, call)


@pytest.mark.parametrize("bad", [1e309, float("nan"), 1_700_000_000, "2025-01-01T00:00:00Z", None])
def test_b6_numbers_and_strings_are_not_datetimes(h: Harness, bad: object) -> None:
    populate(h)
    calls = dt_entry_points(h.store, bad)
    # touch(heartbeat_at=None) means "leave it", not an error; the records refuse None.
    for call in calls[2:] if bad is None else calls:
        h.refuses(TypeError, call)


def test_b6_the_edges_of_the_range_are_stored_exactly(h: Harness) -> None:
    low = datetime(1970, 1, 1, tzinfo=timezone.utc)
    high = datetime(2255, 6, 5, tzinfo=timezone.utc)
    h.store.create(task("low", created_at=low, updated_at=low + timedelta(microseconds=1)))
    h.store.create(task("high", created_at=high, updated_at=high - timedelta(microseconds=1)))
    assert h.store.get("low").updated_at - low == timedelta(microseconds=1)
    assert high - h.store.get("high").updated_at == timedelta(microseconds=1)
    assert [s.task_id for s in h.store.query()] == ["low", "high"]


# -- B7 wrong types ⚑ ------------------------------------------------------------------------

WRONG_INTS = st.one_of(
    st.sampled_from([True, False, 1.0, "1", "01", None, 2**63, 2**53, Decimal("1"), b"1", [1]]),
    st.integers(max_value=-1),
    st.integers(min_value=2**53),
    st.floats(),
    st.text(max_size=5),
)


@pytest.mark.parametrize("backend", BACKENDS)
@PROP
@given(bad=WRONG_INTS)
def test_b7_wrong_types_for_versions_limits_and_counts_are_refused(
    backend: str, request: pytest.FixtureRequest, bad: object
) -> None:
    h = refusals_harness(backend, request, populate)
    calls = [
        lambda: h.store.save(task("a", status_version=2**52), expect_version=bad),
        lambda: h.store.history("a", since_version=bad),
        lambda: h.store.prune(keep_terminal=bad),
        lambda: h.store.claim_commands(now=T0, lease_seconds=5, limit=bad),
        lambda: h.store.create(task("n", status_version=bad)),
        lambda: h.store.create(task("n", bucket=bad)),
        lambda: h.store.create(task("n", attempt=bad)),
        lambda: h.store.append(Transition("a", bad, None, TaskStatus.PENDING, T0)),  # type: ignore[arg-type]
    ]
    if bad is not None:  # TaskQuery(limit=None) means "no limit"
        calls.append(lambda: h.store.query(TaskQuery(limit=bad)))  # type: ignore[arg-type]
    lease_ok = type(bad) in (int, float) and 0 < bad <= 7 * 24 * 3600  # type: ignore[operator]
    if not lease_ok:  # lease_seconds takes any positive finite number up to a week
        calls.append(lambda: h.store.claim_commands(now=T0, lease_seconds=bad))
    for call in calls:
        if call is calls[3] and type(bad) is int and 1 <= bad <= 1000:
            continue
        h.refuses(BAD, call)


@pytest.mark.parametrize("bad", [True, "5", None, Decimal("5"), b"5", 0, -1, 0.0, -0.5,
                                 float("nan"), float("inf"), float("-inf"), 2**63,
                                 7 * 24 * 3600 + 1, 1e300])  # fmt: skip
def test_b7_b11_lease_seconds_outside_a_finite_positive_week_is_refused(
    h: Harness, bad: object
) -> None:
    populate(h)
    error = TypeError if type(bad) not in (int, float) else ValueError
    h.refuses(error, lambda: h.store.claim_commands(now=T0, lease_seconds=bad))


# -- B8 version semantics ---------------------------------------------------------------------


def test_b8_mismatched_versions_are_clean_conflicts_and_a_gap_is_allowed(h: Harness) -> None:
    populate(h)
    h.store.save(task("a", status_version=2), expect_version=1)
    for expect in (0, 1, 3, 2**53 - 2):  # lower and higher than the stored version
        with h.unchanged(), pytest.raises(ConcurrencyConflict) as caught:
            h.store.save(task("a", status_version=2**53 - 1), expect_version=expect)
        assert (caught.value.expected, caught.value.actual) == (expect, 2)
    with h.unchanged(no_server_call=True), pytest.raises(ValueError, match="never go back"):
        h.store.save(task("a", status_version=2), expect_version=2)  # equal: no progress
    h.store.save(task("a", status_version=9), expect_version=2)  # equal expect + a gap
    assert h.store.get("a").status_version == 9
    with h.unchanged(), pytest.raises(ConcurrencyConflict) as caught:
        h.store.save(task("a", status_version=10), expect_version=2)  # the old version again
    assert caught.value.actual == 9


def test_b8_a_replayed_write_id_is_already_applied_and_another_id_conflicts(
    redis_proc: RedisProc,
) -> None:
    """The script-level view of tests/test_redis_retry.py: the same token twice is "applied";
    the same version with another token is a conflict."""
    h = Harness("redis", redis_proc)
    try:
        h.store.create(task("a"))
        args = h.store._task_args(snapshot_to_row(task("a", status_version=2)), 1)
        keys = [h.keys.task("a"), h.keys.root]
        assert h.store._eval("save", keys, args) == ["OK"]
        with h.unchanged():
            assert h.store._eval("save", keys, args)[:2] == ["OK", b"APPLIED"]
            args[1] = "another-token"
            assert h.store._eval("save", keys, args)[:2] == ["CONFLICT", b"2"]
    finally:
        h.close()


# -- B9 corrupt records written by another client --------------------------------------------


def test_b9_a_history_entry_ahead_of_the_task_is_legal_and_kept(h: Harness) -> None:
    """``append`` is independent of the task (write-through may append before it saves), so an
    entry ahead of the task is not corruption: it reads back, is never overwritten by a later
    append of that version, and a save up to it does not touch it."""
    h.store.create(task("a"))
    ahead = Transition("a", 7, TaskStatus.RUNNING, TaskStatus.FAILED, at(5), reason="ahead")
    h.store.append(ahead)
    with h.unchanged():
        h.store.append(Transition("a", 7, TaskStatus.PENDING, TaskStatus.RUNNING, at(6)))
    assert h.store.history("a") == [ahead]
    h.store.save(task("a", status_version=7, status=TaskStatus.FAILED), expect_version=1)
    assert h.store.history("a") == [ahead] and h.store.get("a").status_version == 7


@pytest.fixture
def rh(redis_proc: RedisProc) -> Iterator[Harness]:
    harness = Harness("redis", redis_proc)
    yield harness
    harness.close()


@pytest.mark.parametrize("value", ["-5", "9007199254740992", "99999999999999999999", "1e3", ""])
def test_b9_a_lease_out_of_range_raises_corrupt_record_on_read_and_changes_nothing(
    rh: Harness, value: str
) -> None:
    rh.store.create(task("a", lease_owner="w", lease_until=at(5)))
    rh.redis.hset(rh.keys.task("a"), "lu", value)
    with rh.unchanged():
        for call in (lambda: rh.store.get("a"), lambda: rh.store.query()):
            with pytest.raises(CorruptRecord) as caught:
                call()
            assert (caught.value.key, caught.value.field) == (rh.keys.task("a"), "lu")


def test_b9_a_lease_far_in_the_future_within_range_is_kept_exactly(rh: Harness) -> None:
    far = datetime(2255, 6, 5, tzinfo=timezone.utc)
    rh.store.create(task("a"))
    rh.store.touch("a", lease_owner="w", lease_until=far)
    assert rh.store.get("a").lease_until == far


def test_b9_unknown_extra_fields_survive_a_save_untouched(rh: Harness) -> None:
    rh.store.create(task("a"))
    rh.store.submit_command(Command("c1", "a", CommandKind.STOP, T0))
    rh.redis.hset(rh.keys.task("a"), mapping={"zz": b"\xff\x00", "v2": "x"})
    rh.redis.hset(rh.keys.command("c1"), "zz", "extra")
    rh.store.save(task("a", status_version=2), expect_version=1)
    assert rh.store.get("a") == task("a", status_version=2)
    assert rh.redis.hget(rh.keys.task("a"), "zz") == b"\xff\x00"
    assert [c.command_id for c in rh.store.claim_commands(now=T0, lease_seconds=5)] == ["c1"]


@pytest.mark.parametrize(
    "tags", ['{"a":1,"a":2}', '{"io":"x"}', "{}", '"io"', "[1]", '["io",""]', "[io", "null"]
)
def test_b9_tags_that_are_not_a_json_array_of_strings_are_corrupt_everywhere(
    rh: Harness, tags: str
) -> None:
    rh.store.create(task("a", tags=frozenset({"io"})))
    rh.store.create(task("b", status=TaskStatus.FAILED))
    rh.redis.hset(rh.keys.task("a"), "g", tags)
    with rh.unchanged():
        with pytest.raises(CorruptRecord, match="'g'"):
            rh.store.get("a")
        with pytest.raises(CorruptRecord):
            rh.store.save(task("a", status_version=2), expect_version=1)
        with pytest.raises(CorruptRecord):
            rh.store.query()


def test_b9_duplicate_tags_in_the_array_read_as_a_set(rh: Harness) -> None:
    rh.store.create(task("a", tags=frozenset({"io"})))
    rh.redis.hset(rh.keys.task("a"), "g", '["io","io"]')
    assert rh.store.get("a").tags == frozenset({"io"})
    rh.store.save(task("a", status_version=2, tags=frozenset({"x"})), expect_version=1)
    assert rh.store.query(TaskQuery(tag="io")) == []
    assert [s.task_id for s in rh.store.query(TaskQuery(tag="x"))] == ["a"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("c", "abc"), ("c", "-5"), ("c", "1e3"), ("k", "zzz"), ("k", None), ("t", None),
     ("id", None), ("id", "c2"), ("f", "x"),
     ("y", b"\xc1")],
)  # fmt: skip
def test_b9_a_corrupt_command_makes_claim_raise_and_change_nothing(
    rh: Harness, field: str, value: str | bytes | None
) -> None:
    rh.store.submit_command(Command("c0", "a", CommandKind.STOP, T0))
    rh.store.submit_command(Command("c1", "a", CommandKind.STOP, at(1), payload={"v": 1}))
    key = rh.keys.command("c1")
    if value is None:
        rh.redis.hdel(key, field)
    else:
        rh.redis.hset(key, field, value)
    with rh.unchanged(), pytest.raises(CorruptRecord) as caught:
        rh.store.claim_commands(now=at(2), lease_seconds=5)
    assert caught.value.key == key


def test_the_sqlite_harness_counts_the_statements_a_call_runs() -> None:
    """The "no SQLite statement" checks above can fail: a call that reaches the database is
    counted."""
    h = Harness("sqlite", None)
    try:
        before = h.statements
        h.store.get("a")
        assert h.statements > before
    finally:
        h.close()


def test_the_postgres_harness_counts_the_transactions_a_call_opens(
    postgres_proc: PostgresProc,
) -> None:
    """The "no PostgreSQL call" checks above can fail: a call that reaches the server opens a
    transaction, and it is counted; a write changes the fingerprint."""
    h = Harness("postgres", postgres_proc)
    try:
        before, rows = h.statements, h.fingerprint()
        h.store.get("a")
        assert h.statements == before + 1
        h.store.create(task("a"))
        assert h.fingerprint() != rows
    finally:
        h.close()


def test_b9_memory_store_has_no_other_client() -> None:
    """B9 is about data written by *another* client; an ``InMemoryTaskStore`` has none (its rows
    are private and written only by its own validated methods). Its share of B9, the history
    entry ahead of the task, runs on both stores above."""
    assert not hasattr(InMemoryTaskStore(), "client")


# -- B10 prune edge cases ---------------------------------------------------------------------


def test_b10_prune_edge_cases(h: Harness) -> None:
    h.store.create(task("ancient", created_at=datetime(1970, 1, 1, tzinfo=timezone.utc)))
    h.store.create(task("old-running", status=TaskStatus.RUNNING, created_at=at(-(10**8))))
    for i, status in enumerate([TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.LOST]):
        h.store.create(task(f"t{i}", status=status, created_at=at(i)))
        h.store.append(Transition(f"t{i}", 1, None, status, at(i)))
    for bad, error in [(-1, ValueError), (True, TypeError), (False, TypeError), (1.0, TypeError),
                       ("0", TypeError), (None, TypeError), (2**53, ValueError)]:  # fmt: skip
        h.refuses(error, lambda bad=bad: h.store.prune(keep_terminal=bad))
    with h.unchanged():
        assert h.store.prune(keep_terminal=4) == 0  # more than there are
        assert h.store.prune(keep_terminal=3) == 0
        assert h.store.prune(keep_terminal=2**53 - 1) == 0
    assert h.store.prune(keep_terminal=1) == 2
    assert [s.task_id for s in h.store.query()] == ["ancient", "old-running", "t2"]
    assert h.store.history("t0") == [] and len(h.store.history("t2")) == 1
    assert h.store.prune(keep_terminal=0) == 1
    with h.unchanged():
        assert h.store.prune(keep_terminal=0) == 0  # very old non-terminal tasks stay
    assert [s.task_id for s in h.store.query()] == ["ancient", "old-running"]


# -- B11 command misuse -----------------------------------------------------------------------


def test_b11_complete_or_release_of_an_unknown_command_changes_nothing(h: Harness) -> None:
    populate(h)
    for call in (
        lambda: h.store.complete_command("nope", now=T0, outcome="x"),
        lambda: h.store.release_command("nope", now=T0),
        lambda: h.store.complete_command("c1:x", now=T0),  # a key-like neighbour of c1
    ):
        with h.unchanged(), pytest.raises(CommandNotFound) as caught:
            call()
        assert isinstance(caught.value, StoreError)


def test_b11_double_release_complete_after_release_and_release_after_finish(h: Harness) -> None:
    populate(h)
    assert [c.command_id for c in h.store.claim_commands(now=T0, lease_seconds=5)] == ["c1"]
    h.store.release_command("c1", now=at(1))
    with h.unchanged():
        h.store.release_command("c1", now=at(2))  # double release: nothing to do
    h.store.complete_command("c1", now=at(3), outcome="done")  # complete after release
    with h.unchanged():
        h.store.release_command("c1", now=at(4))  # a finished command stays finished
        h.store.complete_command("c1", now=at(5), outcome="again")
        assert h.store.claim_commands(now=at(100), lease_seconds=5) == []


@pytest.mark.parametrize("limit", [0, -1, 1001, 2**63, True, 1.5, "5", None])
def test_b11_a_bad_claim_limit_is_refused_and_claims_nothing(h: Harness, limit: object) -> None:
    populate(h)
    error = TypeError if type(limit) is not int else ValueError
    h.refuses(error, lambda: h.store.claim_commands(now=T0, lease_seconds=5, limit=limit))


def test_b11_the_longest_lease_and_limit_are_accepted(h: Harness) -> None:
    populate(h)
    week = 7 * 24 * 3600
    claimed = h.store.claim_commands(now=T0, lease_seconds=week, limit=1000)
    assert [(c.command_id, c.lease_until) for c in claimed] == [("c1", at(week))]
    h.refuses(ValueError, lambda: h.store.claim_commands(
        now=datetime(2255, 6, 1, tzinfo=timezone.utc), lease_seconds=week))  # fmt: skip


def test_b11_touch_with_a_bad_progress_is_refused(h: Harness) -> None:
    populate(h)
    h.refuses(TypeError, lambda: h.store.touch("a", progress={"current": 1}))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Progress(float("nan"))
