"""Task writes in SQL, for every SQL store: create, the compare-and-set save, batched commits
and starts, touch, append, prune and the removal of tasks (shared with ``expire_finished``).
Each function runs inside one write transaction (a ``Tx``) the store opened, and never commits
it: the caller commits after ``feed.flush()``.

* ``save`` is one ``UPDATE ... WHERE task_id = ? AND status_version = ?``: the check and the
  write are one statement, and the row count says which happened. It writes ``SAVE_COLUMNS``:
  never ``lease_owner``/``lease_until`` (store guide §2.3).
* A refused write changes nothing and issues no feed position (``FeedPositions.next`` only
  proposes one).
* ``append`` is ``INSERT ... ON CONFLICT DO NOTHING``: the first entry of a version wins.
* A written row's limit holds follow it in the same transaction (``limits.sync``/``took``:
  the caller of ``insert``/``save``, ``commit`` and ``start`` once per call).
* Every statement that writes a task row writes its ``expires_at`` (``rows.expires_at``) and,
  through the ``tasks_unique`` index, its hold on its unique id: a write that would give a
  unique id a second unfinished holder writes nothing and returns ``UniqueTaken``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Protocol

from chongming_redis.errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._sql import limit_gate, limits
from chongming_redis.stores._sql import unique as uniques
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import (
    HISTORY_SELECT,
    SAVE_COLUMNS,
    TASK_SELECT,
    claimed_unique,
    deadline_of,
    decode_task,
    expires_at,
    integer,
    quoted,
    task_row,
    text,
    values_of,
)
from chongming_redis.stores._sql.schema import (
    FINAL_STATUSES,
    MAX_IN_LIST,
    UNPINNED,
    Dialect,
    Tx,
    held_unique,
    ready_ms,
)
from chongming_redis.stores.codec import (
    SNAPSHOT_COLUMNS,
    TRANSITION_COLUMNS,
    Row,
    decode_tags,
    encode_dt,
    transition_to_row,
)

# No conflict target: an existing task_id and a unique id another unfinished task holds
# (tasks_unique) both skip the row, and the caller tells which it was.
_INSERT_TASK = (
    f"INSERT INTO tasks ({quoted(SNAPSHOT_COLUMNS)}, expires_at, feed_position)"
    f" VALUES ({', '.join('?' * (len(SNAPSHOT_COLUMNS) + 2))}) ON CONFLICT DO NOTHING"
)
_SAVE_ASSIGNMENTS = ", ".join(f"{c} = ?" for c in quoted(SAVE_COLUMNS).split(", "))
# A write of the row unparks it (``parked``: only a start sets it; _sql/limit_gate.py).
_SAVE_TASK = (
    f"UPDATE tasks SET {_SAVE_ASSIGNMENTS}, expires_at = ?, feed_position = ?, parked = NULL"
    " WHERE task_id = ? AND status_version = ?"
)


@lru_cache(maxsize=4)
def _save_claiming(d: Dialect) -> str:
    """The save of a row that will hold a unique id: the compare-and-set, and no other
    unfinished task holding that id, in one statement (PostgreSQL has no ``UPDATE OR IGNORE``:
    the unique index would abort the whole transaction, every other item of a commit with it).
    The subquery's bare columns are those of ``other``, the innermost table."""
    return (
        f"{_SAVE_TASK} AND NOT EXISTS (SELECT 1 FROM tasks AS other WHERE other.unique_id = ?"
        f" AND {held_unique(d)} AND other.task_id <> ?)"
    )


_APPEND = (
    f"INSERT INTO history ({HISTORY_SELECT}) VALUES ({', '.join('?' * len(TRANSITION_COLUMNS))})"
    " ON CONFLICT (task_id, version) DO NOTHING"
)


_PENDING = TaskStatus.PENDING.value


class WriteDuties(Protocol):
    """What a write of a task row owes beyond the row, judged around it in its transaction
    (the dependencies: ``_sql/dependencies.py``'s ``Duties``, which the store passes in)."""

    def before(self, row: Row, expect: int | None) -> StoreError | None:
        """The refusal of writing ``row`` (a create when ``expect`` is ``None``), if any."""
        ...

    def after(self, row: Row) -> list[Row]:
        """After ``row`` was written: the other task rows it moved (already written)."""
        ...


def _set_tags(tx: Tx, task_id: str, tags_json: str, *, replace: bool) -> None:
    if replace:
        tx.run("DELETE FROM task_tags WHERE task_id = ?", [task_id])
    for tag in sorted(decode_tags(tags_json)):
        tx.run("INSERT INTO task_tags (tag, task_id) VALUES (?, ?)", [tag, task_id])


def insert(tx: Tx, feed: FeedPositions, row: Row, held_by: str | None = None) -> StoreError | None:
    """``create``: the whole row, lease included. An existing id is ``TaskAlreadyExists``, a
    unique id another unfinished task holds ``UniqueTaken`` (``held_by``: the holder a commit
    found before the call, so the row is refused without trying); nothing written for either."""
    task_id = str(row["task_id"])
    if held_by is None or held_by == task_id:
        params = [*values_of(row, SNAPSHOT_COLUMNS), expires_at(row), feed.next()]
        if tx.run(_INSERT_TASK, params):
            feed.used()
            feed.made_work |= text(row["status"]) == _PENDING
            _set_tags(tx, task_id, str(row["tags"]), replace=False)
            return None
    if stored_version(tx, task_id) is not None:  # the id first, as every store judges it
        return TaskAlreadyExists(task_id)
    unique = claimed_unique(row)
    if unique is None:  # no unique id either: a feed position taken, which the head forbids
        raise StoreError(f"tasks/{task_id}: the new row was refused by no constraint it names")
    return uniques.taken(tx, unique, held_by)


def save(
    tx: Tx, feed: FeedPositions, row: Row, expect: int, held_by: str | None = None
) -> StoreError | None:
    """The compare-and-set: every column but the lease, if the stored version is ``expect``
    and the unique id the row will hold (if any) no other unfinished task holds (``held_by``:
    the holder a commit found before the call); else nothing is written."""
    task_id, unique = str(row["task_id"]), claimed_unique(row)
    if held_by is None or held_by == task_id:
        params = [*values_of(row, SAVE_COLUMNS), expires_at(row), feed.next(), task_id, expect]
        sql = _SAVE_TASK
        if unique is not None:
            sql, params = _save_claiming(tx.dialect), [*params, unique, task_id]
        # Into PENDING from another status (a retry, a hand-back, a release) is new work.
        becomes_work = text(row["status"]) == _PENDING and _stored_status(tx, task_id) != _PENDING
        if tx.run(sql, params):
            feed.used()
            feed.made_work |= becomes_work
            _set_tags(tx, task_id, str(row["tags"]), replace=True)
            return None
    actual = stored_version(tx, task_id)
    if actual != expect or unique is None:  # the version first, as every store judges it
        return ConcurrencyConflict(task_id, expect, actual)
    return uniques.taken(tx, unique, held_by)


def _stored_status(tx: Tx, task_id: str) -> str | None:
    found = tx.rows("SELECT status FROM tasks WHERE task_id = ?", [task_id])
    return None if not found else text(found[0][0])


def stored_version(tx: Tx, task_id: str) -> int | None:
    found = tx.rows("SELECT status_version FROM tasks WHERE task_id = ?", [task_id])
    return None if not found else integer(found[0][0], "tasks/" + task_id, "status_version")


def append(tx: Tx, entries: Sequence[Row]) -> None:
    for entry in entries:
        tx.run(_APPEND, values_of(entry, TRANSITION_COLUMNS))


def commit(
    tx: Tx,
    feed: FeedPositions,
    items: Sequence[tuple[Row, int | None, list[Row]]],
    duties: WriteDuties | None = None,
) -> list[StoreError | None]:
    """``commit_tasks``: each item created (``expect`` ``None``) or saved, with its history
    when written; a refused item writes nothing. Each item's version is judged against the
    state before the call (items name distinct tasks); unique ids in item order, as on every
    store: the holders of the ids the items would hold are read once, then follow each
    written item (one that finishes a holder frees its id for the items after it; one that
    takes an id holds it for them). ``duties`` judge each item as the items before it left
    the rows (an item whose task an earlier item's release moved conflicts), and what they
    move is followed as the items are."""
    feed.lock()  # the head before the holders are read (FeedPositions.lock)
    wanted = [u for row, _, _ in items if (u := claimed_unique(row)) is not None]
    before = uniques.holders(tx, wanted) if wanted else {}
    results: list[StoreError | None] = []
    written: list[tuple[Row, bool]] = []  # (row, created): their limits' holds, at the end
    for row, expect, entries in items:
        unique = claimed_unique(row)
        held_by = None if unique is None else before.get(unique)
        error = None if duties is None else duties.before(row, expect)
        if error is None:
            error = (
                insert(tx, feed, row, held_by)
                if expect is None
                else save(tx, feed, row, expect, held_by)
            )
        if error is None:
            append(tx, entries)
            _follow(before, row)
            written.append((row, expect is None))
            for moved in [] if duties is None else duties.after(row):
                _follow(before, moved)
        results.append(error)
    limits.sync(tx, written)
    return results


def _follow(holders: dict[str, str], row: Row) -> None:
    """``holders`` after ``row`` was written: the id it claims is its own, and an id it held
    is free once it is final."""
    task_id, claimed = str(row["task_id"]), claimed_unique(row)
    if claimed is not None:
        holders[claimed] = task_id
    own = row.get("unique_id")
    if claimed is None and own is not None and holders.get(str(own)) == task_id:
        del holders[str(own)]


def start(
    tx: Tx,
    feed: FeedPositions,
    *,
    owner: str,
    now: datetime,
    lease_until: datetime,
    buckets: Sequence[int],
    limit: int,
    names: Sequence[str],
) -> list[TaskSnapshot]:
    """``start_tasks``: the first due ``PENDING`` tasks of ``buckets`` in start order (the
    ``tasks_start`` index: higher priority, then due earliest) to ``RUNNING``,
    each with its lease, heartbeat, feed position and history entry. With limits recorded,
    the walk leaves out the tasks waiting in blocked lines and reads pages until ``limit``
    started or none is left: every row it reads is started or waits in a line now blocked, so
    no row is read twice (``_sql/limits.py``)."""
    feed.lock()  # the head before any task row (FeedPositions.lock)
    d, moment, until = tx.dialect, encode_dt(now), encode_dt(lease_until)
    in_buckets, params = d.member_of("bucket", list(buckets))
    # parked IS NULL: the partial start index (tasks_start_free) leaves the parked tasks out.
    conditions = ["status = ?", "parked IS NULL", in_buckets,
                  "(not_before IS NULL OR not_before <= ?)"]  # fmt: skip
    params = [TaskStatus.PENDING.value, *params, moment]
    if names:
        in_names, name_params = d.member_of("name", list(names))
        conditions.append(in_names)
        params.extend(name_params)
    gate = limit_gate.open_gate(tx, moment)
    if gate is not None:
        conditions.append(limit_gate.NOT_BLOCKED)
    sql = (
        f"SELECT {TASK_SELECT} FROM tasks WHERE {' AND '.join(conditions)}"
        f" ORDER BY priority DESC, {ready_ms(d)}, task_id LIMIT ?{d.skip_locked}"
    )
    started: list[TaskSnapshot] = []
    taken: list[Row] = []  # their rows, for the slots they take
    while len(started) < limit:
        page = limit - len(started)
        if gate is not None and gate.refused_any:  # a flooded ref's backlog: read on faster
            page = max(page, limit_gate.PAGE)
        rows = tx.rows(sql, [*params, page])
        reread = False
        for values in rows:
            row = task_row(values)
            if len(started) == limit:
                break
            if gate is None or gate.admit(row):
                started.append(_start_one(tx, feed, row, owner, now, until))
                taken.append(row)
            elif gate.reread:  # an older task was unparked in its place: read again
                gate.reread, reread = False, True
                break
        if gate is None or (len(rows) < page and not reread):
            break
    limits.took(tx, taken)
    if gate is not None:
        gate.close()
    return started


def _start_one(
    tx: Tx, feed: FeedPositions, row: Row, owner: str, now: datetime, until: int
) -> TaskSnapshot:
    moment = encode_dt(now)
    task_id = text(row["task_id"])
    version = integer(row["status_version"], "tasks/" + task_id, "status_version") + 1
    deadline = deadline_of(row, moment)  # this attempt's, when the task has a timeout
    position = feed.next()
    # RUNNING is unfinished: no expiry, and the unique id (if any) stays held.
    tx.run(
        "UPDATE tasks SET status = ?, status_version = ?, updated_at = ?, heartbeat_at = ?,"
        " lease_owner = ?, lease_until = ?, deadline = ?, expires_at = NULL,"
        " feed_position = ? WHERE task_id = ?",
        [TaskStatus.RUNNING.value, version, moment, moment, owner, until, deadline,
         position, task_id],
    )  # fmt: skip
    feed.used()
    row.update(status=TaskStatus.RUNNING.value, status_version=version, updated_at=moment,
               heartbeat_at=moment, lease_owner=owner, lease_until=until,
               deadline=deadline)  # fmt: skip
    snapshot = decode_task(list(row.values()))
    reason = f"started by {owner} (attempt {snapshot.attempt})"
    entry = Transition(task_id, version, TaskStatus.PENDING, TaskStatus.RUNNING, now, reason)
    append(tx, [transition_to_row(entry)])
    return snapshot


def touch(tx: Tx, task_id: str, fence: int | None, columns: Row) -> bool:
    """Write ``columns`` (a ``touch``'s) if the task exists (and, with ``fence``, holds that
    version); never the version. Returns whether a row was written."""
    assignments = ", ".join(f'"{c}" = ?' for c in columns)
    params: list[object] = [*values_of(columns, list(columns)), task_id]
    sql = f"UPDATE tasks SET {assignments} WHERE task_id = ?"
    if fence is not None:
        sql += " AND status_version = ?"
        params.append(fence)
    return tx.run(sql, params) > 0


def prune_batch(
    tx: Tx, feed: FeedPositions, keep: int, batch: int, removed_at: datetime
) -> tuple[int, bool]:
    """Drop up to ``batch`` of the oldest terminal tasks beyond the newest ``keep``, each with
    its history and tags, leaving a tombstone and unlisting its commands. Returns ``(dropped,
    more)``: ``more`` when terminal tasks beyond ``keep`` remain."""
    feed.lock()  # the head before any task row (FeedPositions.lock)
    d = tx.dialect
    in_terminal, params = d.member_of("status", list(FINAL_STATUSES))
    in_terminal += f" AND {UNPINNED}"  # a parent of an unfinished child is kept
    ((count,),) = tx.rows(f"SELECT COUNT(*) FROM tasks WHERE {in_terminal}", params)
    excess = int(count) - keep
    if excess <= 0:
        return 0, False
    doomed = tx.rows(
        f"SELECT task_id, name, bucket FROM tasks WHERE {in_terminal}"
        f" ORDER BY created_at, task_id LIMIT ?{d.for_update}",
        [*params, min(excess, batch)],
    )
    remove(tx, feed, doomed, removed_at)
    return len(doomed), excess > len(doomed)


def remove(
    tx: Tx, feed: FeedPositions, doomed: Sequence[Sequence[object]], removed_at: datetime
) -> list[str]:
    """Remove the tasks of ``doomed`` (``(task_id, name, bucket)`` rows, locked by the caller
    after ``feed.lock()``), in order: a tombstone each, at its own position, then their rows,
    history and tags gone (their unique ids with them) and their commands unlisted, in
    statements of at most ``MAX_IN_LIST`` ids. Returns the removed ids."""
    ids = []
    for task_id, name, bucket in doomed:
        ids.append(text(task_id))
        key = "tasks/" + ids[-1]
        feed.tombstone(ids[-1], text(name), integer(bucket, key, "bucket"), removed_at)
    raw = [task_id for task_id, _, _ in doomed]  # as the driver returned them: bound back as is
    for start in range(0, len(raw), MAX_IN_LIST):
        in_chunk, params = tx.dialect.member_of("task_id", raw[start : start + MAX_IN_LIST])
        for table in ("tasks", "history", "task_tags"):
            tx.run(f"DELETE FROM {table} WHERE {in_chunk}", params)
        limits.forget(tx, in_chunk, params)
        tx.run(f"UPDATE commands SET listed = 0 WHERE {in_chunk} AND listed = 1", params)
    return ids
