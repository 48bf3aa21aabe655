"""``SqlTaskStore``: every ``TaskStore`` method, the runtime extensions and the change feed over
the shared SQL of the ``_sql`` modules, for any SQL database (the task policies' methods are
``SqlPolicies``, ``_sql/policies.py``; the limits' ``SqlLimits``, ``_sql/limits.py``; the
schedules' ``SqlSchedules``, ``_sql/schedules.py``; the published parameter schemas'
``SqlTaskSchemas``, ``_sql/task_schemas.py``). A concrete store
(``SqliteTaskStore``, ``PostgresTaskStore``) provides only the connection side:

* ``_transaction(write=...)`` — a context manager yielding a ``Tx``: committed when the block
  ends normally, rolled back when it raises; ``write=True`` excludes every other writer of the
  rows it touches (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: row locks), ``write=False`` is one
  consistent read. It raises ``StoreClosed`` once the store is closed, and reports driver
  failures as ``StoreError`` (``StoreUnavailable`` when the database cannot be reached or is
  busy);
* ``close()`` and ``server_time()``; ``where`` (a label for messages: a path, a schema);
* optionally ``_nudge_work(tx)``: wakes idle workers in a write that made a task ``PENDING``.

Arguments are checked here, before any transaction, with the checks every store shares
(``stores/_checks.py``), so a SQL store refuses exactly what the others refuse.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone

from chongming_redis.errors import CorruptRecord, StoreError
from chongming_redis.model import (
    ChangePage,
    Command,
    CommandBacklog,
    FeedStats,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._feed import check_page_limit, parse_cursor
from chongming_redis.stores._sql import commands, limits, pool, tasks
from chongming_redis.stores._sql import feed as feeds
from chongming_redis.stores._sql.dependencies import Duties, SqlDependencies
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.limits import SqlLimits
from chongming_redis.stores._sql.policies import SqlPolicies
from chongming_redis.stores._sql.query import select_tasks
from chongming_redis.stores._sql.rows import (
    HISTORY_SELECT,
    TASK_SELECT,
    decode_task,
    decode_transition,
    integer,
    text,
)
from chongming_redis.stores._sql.schedules import SqlSchedules
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores._sql.task_schemas import SqlTaskSchemas
from chongming_redis.stores.codec import (
    command_to_row,
    encode_dt,
    snapshot_to_row,
    touch_columns,
    transition_to_row,
)
from chongming_redis.validation import check_identifier, check_int


class SqlTaskStore(SqlPolicies, SqlLimits, SqlSchedules, SqlDependencies, SqlTaskSchemas):
    #: Tasks one ``prune`` transaction drops at most (a long prune never holds the write lock
    #: for long; each batch re-reads which tasks are beyond ``keep_terminal``).
    prune_batch = 500
    #: Names the database in messages (a path, a DSN's schema).
    where: str

    def _transaction(self, *, write: bool) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    @contextmanager
    def _writing(self) -> Iterator[tuple[Tx, FeedPositions]]:
        """A write transaction and the feed positions it issues (written before the commit)."""
        with self._transaction(write=True) as tx:
            feed = FeedPositions(tx)
            yield tx, feed
            feed.flush()
            if feed.made_work:
                self._nudge_work(tx)

    def _nudge_work(self, tx: Tx) -> None:
        """Wake idle workers from inside the write transaction that made a task ``PENDING``
        (delivered at its commit; PostgreSQL's ``NOTIFY``). SQLite's workers poll: nothing."""

    def _reading(self) -> AbstractContextManager[Tx]:
        return self._transaction(write=False)

    # -- task snapshots --------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        row = snapshot_to_row(check.check_snapshot(snapshot))
        with self._writing() as (tx, feed):
            duties = Duties(tx, feed)
            error = duties.before(row, None) or tasks.insert(tx, feed, row)
            if error is not None:
                raise error
            limits.sync(tx, [(row, True)])
            duties.after(row)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = snapshot_to_row(check.check_save(snapshot, expect_version))
        with self._writing() as (tx, feed):
            duties = Duties(tx, feed)
            error = duties.before(row, expect_version) or tasks.save(tx, feed, row, expect_version)
            if error is not None:
                raise error
            limits.sync(tx, [(row, False)])
            duties.after(row)

    def get(self, task_id: str) -> TaskSnapshot | None:
        check_identifier(task_id, "task_id")
        with self._reading() as tx:
            rows = tx.rows(f"SELECT {TASK_SELECT} FROM tasks WHERE task_id = ?", [task_id])
        return decode_task(rows[0], "tasks/" + task_id) if rows else None

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return self._select(check.check_query(query), None)

    def query_page(
        self, query: TaskQuery | None = None, *, after: tuple[datetime, str] | None = None
    ) -> list[TaskSnapshot]:
        """``PagedQueryStore``: ``query`` from strictly after ``after = (created_at,
        task_id)`` in the query's order (a keyset condition on the ordering index)."""
        q, position = check.check_query(query), check.check_after(after)
        return self._select(q, position)

    def _select(self, q: TaskQuery, after: tuple[datetime, str] | None) -> list[TaskSnapshot]:
        with self._reading() as tx:
            sql, params = select_tasks(tx.dialect, q, after)
            rows = tx.rows(sql, params)
        return [decode_task(values) for values in rows]

    def counts(self) -> dict[TaskStatus, int]:
        result = dict.fromkeys(TaskStatus, 0)
        with self._reading() as tx:
            for status, number in tx.rows("SELECT status, COUNT(*) FROM tasks GROUP BY status"):
                result[_status(tx, status)] += int(number)
        return result

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``BucketCountingStore``: ``GROUP BY bucket, status`` on the bucket index."""
        result: dict[int, dict[TaskStatus, int]] = {}
        with self._reading() as tx:
            sql = "SELECT bucket, status, COUNT(*) FROM tasks GROUP BY bucket, status"
            for bucket, status, number in tx.rows(sql):
                per = result.setdefault(
                    integer(bucket, "tasks", "bucket"), dict.fromkeys(TaskStatus, 0)
                )
                per[_status(tx, status)] += int(number)
        return result

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        row = transition_to_row(check.check_transition(transition))
        with self._writing() as (tx, _):
            tasks.append(tx, [row])

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_identifier(task_id, "task_id")
        check_int(since_version, "since_version")
        with self._reading() as tx:
            rows = tx.rows(
                f"SELECT {HISTORY_SELECT} FROM history WHERE task_id = ? AND version > ?"
                " ORDER BY version",
                [task_id, since_version],
            )
        return [decode_transition(values) for values in rows]

    # -- the high-frequency side path ------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        self._touch(task_id, None, progress, heartbeat_at, lease_owner, lease_until)

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """``FencedTouchStore``: ``touch`` only while ``status_version == expect_version``."""
        check_int(expect_version, "expect_version")
        return self._touch(
            task_id, expect_version, progress, heartbeat_at, lease_owner, lease_until
        )

    def _touch(
        self,
        task_id: str,
        fence: int | None,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> bool:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        columns = touch_columns(progress, heartbeat_at, lease_owner, lease_until)
        if not columns and fence is None:
            self._check_open()  # nothing to write, but a closed store still says so
            return True
        with self._writing() as (tx, _):
            if not columns:  # a fenced touch of nothing: does the version hold?
                return tasks.stored_version(tx, task_id) == fence
            return tasks.touch(tx, task_id, fence, columns)

    # -- batched writes (BatchingStore) ----------------------------------------------------

    def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """Create or save each task with its history in one transaction; a refused item
        writes nothing (see ``BatchingStore.commit_tasks``)."""
        prepared = [
            (snapshot_to_row(task), expect, [transition_to_row(t) for t in entries])
            for task, expect, entries in check.check_commit_items(items)
        ]
        with self._writing() as (tx, feed):
            return tasks.commit(tx, feed, prepared, Duties(tx, feed))

    def start_tasks(
        self,
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> list[TaskSnapshot]:
        """Start up to ``limit`` eligible ``PENDING`` tasks, oldest first, each with its lease,
        heartbeat and history entry (see ``BatchingStore.start_tasks``)."""
        wanted, types = check.check_start(owner, now, lease_until, buckets, limit, names)
        with self._writing() as (tx, feed):
            return tasks.start(tx, feed, owner=owner, now=now, lease_until=lease_until,
                               buckets=wanted, limit=limit, names=types)  # fmt: skip

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        with self._writing() as (tx, _):
            commands.submit(tx, row)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        with self._writing() as (tx, _):
            return commands.claim_commands(tx, encode_dt(now), until, limit)

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        check.check_complete(command_id, now, outcome)
        with self._writing() as (tx, _):
            commands.complete(tx, command_id, encode_dt(now), outcome)

    def release_command(self, command_id: str, *, now: datetime) -> None:
        check.check_release(command_id, now)
        with self._writing() as (tx, _):
            commands.release(tx, command_id)

    def get_command(self, command_id: str) -> Command | None:
        """``CommandReadingStore``: the command as stored, or ``None``."""
        check_identifier(command_id, "command_id")
        with self._reading() as tx:
            return commands.get(tx, command_id)

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        """``CommandInspectingStore``: the task's newest ``limit`` commands, oldest first."""
        newest = check.check_task_commands(task_id, limit)
        with self._reading() as tx:
            return commands.of_task(tx, task_id, newest)

    def command_backlog(self) -> CommandBacklog:
        """``CommandInspectingStore``: the unfinished commands, unclaimed and leased."""
        with self._reading() as tx:
            return commands.backlog(tx)

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        dropped, more = 0, True
        while more:
            with self._writing() as (tx, feed):
                count, more = tasks.prune_batch(tx, feed, keep, self.prune_batch, _now())
            dropped += count
        return dropped

    # -- the bucket pool and the namespace's records ---------------------------------------

    def pool_tick(
        self,
        *,
        worker: str,
        now: datetime,
        lease_seconds: float,
        num_buckets: int,
        wanted: Sequence[int],
        leaving: bool = False,
    ) -> tuple[list[int], list[str]]:
        """``BucketPoolStore``: one worker's heartbeat and bucket leases in one transaction;
        ``StoreError`` (nothing written) when the database recorded another ``num_buckets``."""
        moment, lease, buckets = pool.check_tick(worker, now, lease_seconds, num_buckets,
                                                 wanted, leaving)  # fmt: skip
        with self._writing() as (tx, _):
            return pool.tick(tx, worker=worker, now=moment, lease=lease, num_buckets=num_buckets,
                             wanted=buckets, leaving=leaving, namespace=self.where)  # fmt: skip

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        with self._reading() as tx:
            return pool.state(tx)

    def worker_beats(self) -> dict[str, datetime]:
        """``WorkerBeatsStore``: ``{worker: the now of its last pool_tick}``."""
        with self._reading() as tx:
            return pool.beats(tx)

    def recorded_num_buckets(self) -> int | None:
        """``RecordedBucketsStore``: the ``num_buckets`` the first pool worker recorded."""
        with self._reading() as tx:
            return pool.recorded_num_buckets(tx)

    def record_task_types(self, names: Collection[str]) -> None:
        """``TaskTypesStore``: add the names to the recorded set."""
        checked = check.check_task_type_names(names)
        if not checked:
            self._check_open()
            return
        with self._writing() as (tx, _):
            pool.record_types(tx, checked)

    def task_types(self) -> frozenset[str]:
        with self._reading() as tx:
            return pool.types(tx)

    # -- the change feed -------------------------------------------------------------------

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        """One page of the change feed (see ``ChangeFeed.changes``)."""
        position, size = parse_cursor(after), check_page_limit(limit)
        with self._reading() as tx:
            return feeds.page(tx, position, size)

    def feed_stats(self) -> FeedStats:
        with self._reading() as tx:
            return feeds.stats(tx)


def _status(tx: Tx, value: object) -> TaskStatus:
    """A status a ``GROUP BY`` returned; an unknown one is ``CorruptRecord`` naming a task that
    holds it (looked up only then: the counts themselves never read a row)."""
    try:
        return TaskStatus(text(value))
    except ValueError:
        found = tx.rows("SELECT task_id FROM tasks WHERE status = ? LIMIT 1", [value])
        key = "tasks/" + text(found[0][0]) if found else "tasks"
        raise CorruptRecord(key, "status", f"unknown status {text(value)!r}") from None


def _now() -> datetime:
    return datetime.now(timezone.utc)
