"""The logical schema every SQL store shares (``SqliteTaskStore``, ``PostgresTaskStore``): the
tables, their columns and indexes, the versioned migrations, and the ``Dialect`` and ``Tx``
seams through which the shared SQL of the ``_sql`` modules reaches a driver.

Shared SQL is written with ``?`` placeholders and no string literals (every value is a
parameter; the one exception, a partial index's predicate, which cannot take parameters, spells
its statuses with ``Dialect.literal``), so a dialect whose driver wants ``%s`` converts it with
``format_placeholders`` and may store text however it likes (PostgreSQL ``text`` cannot hold
NUL, which an id may contain: its ``Tx`` may bind every ``str`` as UTF-8 ``bytea``; the codec
decodes ``bytes`` text back).
Text compares in code-point order: SQLite's ``BINARY`` collation and ``bytea`` compare UTF-8
bytes, and UTF-8 byte order is code-point order (a ``text`` column would need ``COLLATE "C"``).

Tables (``schema_statements``):

* ``tasks`` — one row per task, the codec's ``SNAPSHOT_COLUMNS`` plus ``feed_position`` (its
  place in the change feed); ``priority`` and the start order index came with version 2; the
  task policies (``retry_policy``, ``timeout_s``, ``deadline``, ``retention_s``, ``unique_id``)
  with version 3, with ``expires_at`` (``updated_at + retention`` of a final task, else NULL:
  derived by every statement that writes the row) and two partial indexes: ``tasks_expiry``
  (what ``expire_finished`` removes, earliest first) and the unique ``tasks_unique`` (at most
  one unfinished task per ``unique_id``: the database itself refuses a second holder);
  ``limit_refs`` (the task's limit refs, a JSON list) with version 4.
* ``limit_defs``, ``limit_types``, ``limit_holders``, ``limit_waiters``, ``limit_lines``,
  ``limit_buckets`` —
  the limits (``LimitsStore``), version 4 (``_v4``, ``_sql/limits.py``).
  Progress numbers are stored as text (``"1"`` vs ``"1.0"``), so a float stays a float in any
  dialect.
* ``schedules`` — ``(id, version, state)``: the schedule records (``SchedulesStore``), version 5
  (``_v5``, ``_sql/schedules.py``).
* ``task_edges``, ``edge_releases`` — the dependencies (``DependenciesStore``) and the
  ``parents``/``on_parent_failure`` columns, version 7 (``_v7``, ``_sql/dependencies.py``).
* ``task_tags`` — ``(tag, task_id)``: exact tag matching through an index (a substring search of
  the ``tags`` JSON would let ``a"io`` match ``io``).
* ``history`` — ``(task_id, version)`` primary key: ``append`` is ``ON CONFLICT DO NOTHING``.
* ``commands`` — the codec's ``COMMAND_COLUMNS`` plus ``listed`` (0 once its task was pruned:
  ``task_commands`` no longer lists it, ``get_command`` still reads it).
* ``tombstones`` — pruned tasks in the change feed, at their own positions, kept forever.
* ``meta`` — named integers: ``feed_head`` (the last feed position issued), ``num_buckets``
  (recorded by the first pool worker).
* ``pool_workers``, ``pool_buckets`` — the bucket pool (``BucketPoolStore``).
* ``task_types`` — the task type names workers recorded (``TaskTypesStore``); ``task_schemas``
  — their published parameter schemas (``TaskSchemasStore``), version 8 (``_sql/task_schemas``).
* ``schema_version`` — one row per migration applied; a database whose recorded version is newer
  than this code's ``SCHEMA_VERSION`` is refused (``UnsupportedSchema``), never written to.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from chongming_redis.errors import UnsupportedSchema
from chongming_redis.model import TaskStatus

#: The schema version this code writes and reads.
SCHEMA_VERSION = 8

#: The final statuses (``TaskStatus.is_terminal``): a task in one holds no unique id and may
#: expire.
FINAL_STATUSES: tuple[str, ...] = tuple(s.value for s in TaskStatus if s.is_terminal)

#: Above this many values an ``IN (?, ?, ...)`` list is replaced by the dialect's set parameter
#: (old SQLite builds allow 999 parameters per statement).
MAX_IN_LIST = 200


class Tx(Protocol):
    """One transaction of a SQL store, as the shared ``_sql`` code uses it. SQL comes with
    ``?`` placeholders; the implementation converts them for its driver."""

    dialect: Dialect

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run a statement that returns rows; all of them."""
        ...

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a statement; the number of rows it matched (``rowcount``)."""
        ...


def store_clock_us(tx: Tx) -> int:
    """The store's clock now (µs since the epoch): the database server's where it has one
    (``Dialect.clock_us``), else this machine's (SQLite runs here)."""
    if tx.dialect.clock_us:
        ((value,),) = tx.rows(tx.dialect.clock_us)
        return int(value)
    return int(time.time() * 1_000_000)


def _in_placeholders(column: str, values: Sequence[object]) -> tuple[str, list[object]]:
    return f"{column} IN ({', '.join('?' * len(values))})", list(values)


_WORD = re.compile(r"[a-z_]+")


def _sqlite_literal(value: str) -> str:
    if not _WORD.fullmatch(value):  # only ever a status name: nothing to escape
        raise ValueError(f"not a plain word for a SQL literal: {value!r}")
    return f"'{value}'"


@dataclass(frozen=True)
class Dialect:
    """What differs between SQL databases in the shared SQL: column types, row locks, and how
    a large set of integers is passed as one parameter."""

    name: str
    text: str  # ids, names, messages (compared in code-point order)
    blob: str  # msgpack payloads
    bigint: str  # microseconds, versions, positions (64-bit)
    #: Seconds (``timeout_s``, ``retention_s``): a double.
    real: str = "REAL"
    #: A text constant as the ``text`` columns hold it, for a partial index's predicate (which
    #: cannot take parameters); only plain lower-case words (status names) are accepted.
    literal: Callable[[str], str] = field(default=_sqlite_literal)
    #: Appended to a SELECT that reads rows the transaction will then write (" FOR UPDATE").
    for_update: str = ""
    #: Appended to a claim's SELECT: rows another transaction holds are skipped, not waited for.
    skip_locked: str = ""
    #: The function of the larger of two integers (SQLite's two-argument ``max``).
    greatest: str = "max"
    #: ``(column, values) -> (condition, params)`` for sets above ``MAX_IN_LIST``.
    large_set: Callable[[str, Sequence[int]], tuple[str, list[object]]] = field(
        default=_in_placeholders
    )
    #: A query of the database server's clock in µs (the limits' rate clock); empty: the
    #: database runs on this machine (SQLite), whose clock ``datetime.now`` reads.
    clock_us: str = ""

    def member_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """``column`` is one of ``values``: a condition and its parameters (``1 = 0`` for none:
        an empty set matches nothing)."""
        if not values:
            return "1 = 0", []
        if len(values) > MAX_IN_LIST and all(type(v) is int for v in values):
            return self.large_set(column, values)  # type: ignore[arg-type]
        return _in_placeholders(column, values)


def _sqlite_large_set(column: str, values: Sequence[int]) -> tuple[str, list[object]]:
    # One JSON array parameter, expanded by json_each (built into SQLite since 3.38, and into
    # the builds Python ships before that).
    return f"{column} IN (SELECT value FROM json_each(?))", ["[" + ",".join(map(str, values)) + "]"]


SQLITE = Dialect("sqlite", text="TEXT", blob="BLOB", bigint="INTEGER", large_set=_sqlite_large_set)


@lru_cache(maxsize=512)
def format_placeholders(sql: str) -> str:
    """``?`` placeholders as ``%s`` (psycopg, and other "format" drivers). Shared SQL holds no
    literal ``?`` or ``%``, so the replacement is exact."""
    if "%" in sql:
        raise ValueError("shared SQL must not contain '%'")
    return sql.replace("?", "%s")


# -- the tables ------------------------------------------------------------------------------


def _v1(d: Dialect) -> list[str]:
    t, b, n = d.text, d.blob, d.bigint
    return [
        f"""CREATE TABLE IF NOT EXISTS tasks (
            task_id {t} PRIMARY KEY, name {t} NOT NULL, status {t} NOT NULL,
            status_version {n} NOT NULL, created_at {n} NOT NULL, updated_at {n} NOT NULL,
            tags {t} NOT NULL, bucket {n} NOT NULL, "key" {t}, pipeline_run_id {t},
            params {b}, result {b},
            progress_current {t}, progress_total {t}, progress_message {t},
            failure_type {t}, failure_message {t}, failure_traceback {t},
            heartbeat_at {n}, lease_owner {t}, lease_until {n}, attempt {n} NOT NULL,
            not_before {n}, feed_position {n} NOT NULL)""",
        # The unfiltered order, and prune's (oldest terminal first).
        "CREATE INDEX IF NOT EXISTS tasks_by_created ON tasks (created_at, task_id)",
        # Status filters, counts() (GROUP BY status) and prune's terminal tasks.
        "CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, created_at, task_id)",
        # The bucket query above all: "the tasks of the buckets I own", start_tasks' PENDING
        # tasks of those buckets, and bucket_counts (GROUP BY bucket, status).
        "CREATE INDEX IF NOT EXISTS tasks_by_bucket ON tasks (bucket, status, created_at, task_id)",
        "CREATE INDEX IF NOT EXISTS tasks_by_name ON tasks (name, created_at, task_id)",
        "CREATE INDEX IF NOT EXISTS tasks_by_pipeline ON tasks (pipeline_run_id, created_at,"
        " task_id) WHERE pipeline_run_id IS NOT NULL",
        "CREATE UNIQUE INDEX IF NOT EXISTS tasks_by_feed ON tasks (feed_position)",
        f"""CREATE TABLE IF NOT EXISTS task_tags (
            tag {t} NOT NULL, task_id {t} NOT NULL, PRIMARY KEY (tag, task_id))""",
        "CREATE INDEX IF NOT EXISTS task_tags_by_task ON task_tags (task_id)",
        f"""CREATE TABLE IF NOT EXISTS history (
            task_id {t} NOT NULL, version {n} NOT NULL, from_status {t}, to_status {t} NOT NULL,
            "at" {n} NOT NULL, reason {t}, PRIMARY KEY (task_id, version))""",
        f"""CREATE TABLE IF NOT EXISTS commands (
            command_id {t} PRIMARY KEY, task_id {t} NOT NULL, kind {t} NOT NULL,
            created_at {n} NOT NULL, issued_by {t}, payload {b}, lease_until {n},
            finished_at {n}, outcome {t}, listed {n} NOT NULL)""",
        # The claim window: only unfinished commands, in claim order.
        "CREATE INDEX IF NOT EXISTS commands_open ON commands (created_at, command_id)"
        " WHERE finished_at IS NULL",
        "CREATE INDEX IF NOT EXISTS commands_by_task ON commands (task_id, created_at,"
        " command_id) WHERE listed = 1",
        f"""CREATE TABLE IF NOT EXISTS tombstones (
            position {n} PRIMARY KEY, task_id {t} NOT NULL, name {t} NOT NULL,
            bucket {n} NOT NULL, removed_at {n} NOT NULL)""",
        f"CREATE TABLE IF NOT EXISTS meta (name {t} PRIMARY KEY, value {n} NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS pool_workers (
            worker {t} PRIMARY KEY, expires_at {n} NOT NULL, beat_at {n} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS pool_buckets (
            bucket {n} PRIMARY KEY, owner {t} NOT NULL, lease_until {n} NOT NULL)""",
        f"CREATE TABLE IF NOT EXISTS task_types (name {t} PRIMARY KEY)",
    ]


def ready_ms(d: Dialect) -> str:
    """When a task became due, in whole milliseconds: ``max(created_at, not_before)``, the
    second key of the start order (``model.start_rank``). The start index and the start query
    spell it the same way, so the query walks the index."""
    return f"({d.greatest}(created_at, COALESCE(not_before, 0)) / 1000)"


def _v2(d: Dialect) -> list[str]:
    """Priorities: a ``priority`` column (0 for the rows already there) and the start order
    index: per status, higher priority first, then due earliest, then id. A start call walks
    it in order and stops after ``limit`` due rows of its buckets; tasks not yet due sort after
    the due ones of their priority."""
    return [
        f"ALTER TABLE tasks ADD COLUMN priority {d.bigint} NOT NULL DEFAULT 0",
        f"CREATE INDEX IF NOT EXISTS tasks_start ON tasks (status, priority DESC, {ready_ms(d)},"
        " task_id)",
    ]


def unfinished(d: Dialect) -> str:
    """The condition "``status`` is not final", spelt with literals: the predicate of the
    unique index, repeated verbatim by the queries that should walk that index (SQLite uses a
    partial index only for a query whose WHERE contains the index's terms; PostgreSQL proves
    the implication only from constants)."""
    return f"status NOT IN ({', '.join(d.literal(v) for v in FINAL_STATUSES)})"


def held_unique(d: Dialect) -> str:
    """The terms of the ``tasks_unique`` predicate, for the queries that look a holder up."""
    return f"unique_id IS NOT NULL AND {unfinished(d)}"


def _v3(d: Dialect) -> list[str]:
    """Task policies: the five policy columns (NULL for the rows already there: no policy),
    ``expires_at`` (NULL for them too: none has a retention), the expiry index, and the unique
    index that lets at most one unfinished task hold a ``unique_id``; a task moving to a final
    status leaves the index (and so lets its id go) by the very write that moves it."""
    t, n, r = d.text, d.bigint, d.real
    columns = [("retry_policy", t), ("timeout_s", r), ("deadline", n), ("retention_s", r),
               ("unique_id", t), ("expires_at", n)]  # fmt: skip
    return [
        *(f"ALTER TABLE tasks ADD COLUMN {name} {kind}" for name, kind in columns),
        "CREATE INDEX IF NOT EXISTS tasks_expiry ON tasks (expires_at, task_id)"
        " WHERE expires_at IS NOT NULL",
        f"CREATE UNIQUE INDEX IF NOT EXISTS tasks_unique ON tasks (unique_id)"
        f" WHERE {held_unique(d)}",
    ]


def _v4(d: Dialect) -> list[str]:
    """Limits: the ``limit_refs`` column (a JSON list of the task's limit refs; NULL for the
    rows already there: no limits) and the limits' tables (``_sql/limits.py`` says how they are
    kept): the recorded definitions and task types' limit ids; ``limit_holders``, one row per
    ref of each task ``RUNNING``/``PAUSED`` (a count is a range of its key, bounded by the
    holders, never by a backlog or the finished tasks); ``limit_waiters``, the tasks a start
    passed over, per ref; ``limit_lines``, per ref with waiters whether it is ``blocked`` (full
    when last judged: its waiters are left out of the start walk); ``limit_buckets``, the rate
    refs' token buckets."""
    t, n, r = d.text, d.bigint, d.real
    return [
        f"ALTER TABLE tasks ADD COLUMN limit_refs {t}",
        f"CREATE TABLE IF NOT EXISTS limit_defs (limit_id {t} PRIMARY KEY,"
        f" definition {t} NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS limit_types (name {t} PRIMARY KEY, limit_ids {t} NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS limit_holders (
            ref {t} NOT NULL, task_id {t} NOT NULL, PRIMARY KEY (ref, task_id))""",
        "CREATE INDEX IF NOT EXISTS limit_holders_by_task ON limit_holders (task_id)",
        f"""CREATE TABLE IF NOT EXISTS limit_waiters (
            ref {t} NOT NULL, task_id {t} NOT NULL, PRIMARY KEY (ref, task_id))""",
        "CREATE INDEX IF NOT EXISTS limit_waiters_by_task ON limit_waiters (task_id)",
        f"CREATE TABLE IF NOT EXISTS limit_lines (ref {t} PRIMARY KEY, blocked {n} NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS limit_buckets (
            ref {t} PRIMARY KEY, tokens {r} NOT NULL, at_us {n} NOT NULL)""",
    ]


def _v5(d: Dialect) -> list[str]:
    """Schedules: one row per schedule record, its version (1 when created, each write and
    each delete one more, never back) and its state text as the caller gave it (NULL: deleted;
    the row stays for its version, ``_sql/schedules.py``)."""
    return [
        f"CREATE TABLE IF NOT EXISTS schedules (id {d.text} PRIMARY KEY,"
        f" version {d.bigint} NOT NULL, state {d.text})",
    ]


def _v6(d: Dialect) -> list[str]:
    """Parked tasks (``_sql/limits.py``): ``parked``, the concurrency ref a start found full
    for a ``PENDING`` task (NULL: not parked), set by the start that refused it and cleared by
    any write of the row or, oldest first, by a start that finds the ref has room again. The
    start order index leaves the parked tasks out (partial), so a flooded ref's backlog costs a
    start nothing; ``tasks_parked`` finds a ref's oldest parked tasks."""
    return [
        f"ALTER TABLE tasks ADD COLUMN parked {d.text}",
        "DROP INDEX IF EXISTS tasks_start",
        f"CREATE INDEX IF NOT EXISTS tasks_start_free ON tasks (status, priority DESC,"
        f" {ready_ms(d)}, task_id) WHERE parked IS NULL",
        f"CREATE INDEX IF NOT EXISTS tasks_parked ON tasks (parked, priority DESC, {ready_ms(d)},"
        " task_id) WHERE parked IS NOT NULL",
    ]


def _v7(d: Dialect) -> list[str]:
    """Dependencies (``DependenciesStore``, ``_sql/dependencies.py``): ``parents`` (a JSON list;
    NULL: none) and ``on_parent_failure`` (``"run"``; NULL: ``"stop"``); ``task_edges``, one
    row per (child, parent) while the child is unfinished (``met`` 0 until the parent's end was
    applied to the child, then 1): a child's unmet parents, a parent's waiting children, and
    the unfinished dependents that keep a finished parent from being pruned or expiring;
    ``edge_releases``, the parents whose end is still to be applied to more children than one
    write does (``outcome``: the final status the parent ended in)."""
    t, n = d.text, d.bigint
    return [
        f"ALTER TABLE tasks ADD COLUMN parents {t}",
        f"ALTER TABLE tasks ADD COLUMN on_parent_failure {t}",
        f"""CREATE TABLE IF NOT EXISTS task_edges (
            child_id {t} NOT NULL, parent_id {t} NOT NULL, met {n} NOT NULL,
            PRIMARY KEY (child_id, parent_id))""",
        # A parent's waiting children in a stable order, and whether it is pinned.
        "CREATE INDEX IF NOT EXISTS task_edges_by_parent ON task_edges (parent_id, met, child_id)",
        # Whether a child has a parent left to end (a wide fan-in: one probe, not a scan).
        "CREATE INDEX IF NOT EXISTS task_edges_unmet ON task_edges (child_id, met)",
        f"""CREATE TABLE IF NOT EXISTS edge_releases (
            parent_id {t} PRIMARY KEY, outcome {t} NOT NULL, at_us {n} NOT NULL)""",
    ]


def _v8(d: Dialect) -> list[str]:
    """Published parameter schemas: name -> JSON Schema text, published at (µs)."""
    return [f"CREATE TABLE IF NOT EXISTS task_schemas (name {d.text} PRIMARY KEY,"
            f" params_schema {d.text} NOT NULL, published_at {d.bigint} NOT NULL)"]  # fmt: skip


#: The condition "this ``tasks`` row is no parent of an unfinished child" (edge rows exist only
#: while the child is unfinished): what ``prune`` and the expiry may remove.
UNPINNED = "NOT EXISTS (SELECT 1 FROM task_edges AS e WHERE e.parent_id = tasks.task_id)"


#: version -> the statements that bring a database from ``version - 1`` to ``version``.
MIGRATIONS: dict[int, Callable[[Dialect], list[str]]] = {
    1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5, 6: _v6, 7: _v7, 8: _v8,
}  # fmt: skip
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


def version_table(d: Dialect) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS schema_version"
        f" (version {d.bigint} PRIMARY KEY, applied_at {d.bigint} NOT NULL)"
    )


def migrate(tx: Tx, now_us: int, where: str) -> int:
    """Bring the schema up to ``SCHEMA_VERSION`` inside ``tx`` (which must exclude other
    migrators: SQLite's write lock, a PostgreSQL advisory lock); returns the version found.
    A newer recorded version raises ``UnsupportedSchema`` before anything is written."""
    tx.run(version_table(tx.dialect))
    found = recorded_version(tx)
    if found > SCHEMA_VERSION:
        raise UnsupportedSchema(where, found, SCHEMA_VERSION)
    for version in range(found + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version](tx.dialect):
            tx.run(statement)
        tx.run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", [version, now_us])
    tx.run(
        "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        ["feed_head", 0],
    )
    return found


def recorded_version(tx: Tx) -> int:
    (value,) = tx.rows("SELECT MAX(version) FROM schema_version")[0]
    return 0 if value is None else int(value)


_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def is_plain_identifier(name: str) -> bool:
    """A lower-case SQL identifier that needs no quoting (a PostgreSQL schema name, say)."""
    return bool(_IDENT.fullmatch(name))
