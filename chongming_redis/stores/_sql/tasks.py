"""Task writes in SQL, for every SQL store: create, the compare-and-set save, batched commits
and starts, touch, append and prune. Each function runs inside one write transaction (a
``Tx``) the store opened, and never commits it: the caller commits after ``feed.flush()``.

* ``save`` is one ``UPDATE ... WHERE task_id = ? AND status_version = ?``: the check and the
  write are one statement, and the row count says which happened. It writes ``SAVE_COLUMNS``:
  never ``lease_owner``/``lease_until`` (store guide §2.3).
* A refused write changes nothing and issues no feed position (``FeedPositions.next`` only
  proposes one).
* ``append`` is ``INSERT ... ON CONFLICT DO NOTHING``: the first entry of a version wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from chongming_redis.errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import (
    HISTORY_SELECT,
    SAVE_COLUMNS,
    TASK_SELECT,
    decode_task,
    integer,
    quoted,
    task_row,
    text,
    values_of,
)
from chongming_redis.stores._sql.schema import Tx, ready_ms
from chongming_redis.stores.codec import (
    SNAPSHOT_COLUMNS,
    TRANSITION_COLUMNS,
    Row,
    decode_tags,
    encode_dt,
    transition_to_row,
)

TERMINAL = tuple(s.value for s in TaskStatus if s.is_terminal)

_INSERT_TASK = (
    f"INSERT INTO tasks ({quoted(SNAPSHOT_COLUMNS)}, feed_position)"
    f" VALUES ({', '.join('?' * (len(SNAPSHOT_COLUMNS) + 1))}) ON CONFLICT (task_id) DO NOTHING"
)
_SAVE_ASSIGNMENTS = ", ".join(f"{c} = ?" for c in quoted(SAVE_COLUMNS).split(", "))
_SAVE_TASK = (
    f"UPDATE tasks SET {_SAVE_ASSIGNMENTS}, feed_position = ?"
    " WHERE task_id = ? AND status_version = ?"
)
_APPEND = (
    f"INSERT INTO history ({HISTORY_SELECT}) VALUES ({', '.join('?' * len(TRANSITION_COLUMNS))})"
    " ON CONFLICT (task_id, version) DO NOTHING"
)


def _set_tags(tx: Tx, task_id: str, tags_json: str, *, replace: bool) -> None:
    if replace:
        tx.run("DELETE FROM task_tags WHERE task_id = ?", [task_id])
    for tag in sorted(decode_tags(tags_json)):
        tx.run("INSERT INTO task_tags (tag, task_id) VALUES (?, ?)", [tag, task_id])


def insert(tx: Tx, feed: FeedPositions, row: Row) -> TaskAlreadyExists | None:
    """``create``: the whole row, lease included; an existing id is refused, nothing written."""
    task_id = str(row["task_id"])
    if not tx.run(_INSERT_TASK, [*values_of(row, SNAPSHOT_COLUMNS), feed.next()]):
        return TaskAlreadyExists(task_id)
    feed.used()
    _set_tags(tx, task_id, str(row["tags"]), replace=False)
    return None


def save(tx: Tx, feed: FeedPositions, row: Row, expect: int) -> ConcurrencyConflict | None:
    """The compare-and-set: every column but the lease, if the stored version is ``expect``."""
    task_id = str(row["task_id"])
    params = [*values_of(row, SAVE_COLUMNS), feed.next(), task_id, expect]
    if not tx.run(_SAVE_TASK, params):
        return ConcurrencyConflict(task_id, expect, stored_version(tx, task_id))
    feed.used()
    _set_tags(tx, task_id, str(row["tags"]), replace=True)
    return None


def stored_version(tx: Tx, task_id: str) -> int | None:
    found = tx.rows("SELECT status_version FROM tasks WHERE task_id = ?", [task_id])
    return None if not found else integer(found[0][0], "tasks/" + task_id, "status_version")


def append(tx: Tx, entries: Sequence[Row]) -> None:
    for entry in entries:
        tx.run(_APPEND, values_of(entry, TRANSITION_COLUMNS))


def commit(
    tx: Tx, feed: FeedPositions, items: Sequence[tuple[Row, int | None, list[Row]]]
) -> list[StoreError | None]:
    """``commit_tasks``: each item created (``expect`` ``None``) or saved, with its history
    when written; a refused item writes nothing. Items name distinct tasks, so each one is
    judged against the state before the call."""
    results: list[StoreError | None] = []
    for row, expect, entries in items:
        error = insert(tx, feed, row) if expect is None else save(tx, feed, row, expect)
        if error is None:
            append(tx, entries)
        results.append(error)
    return results


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
    each with its lease, heartbeat, feed position and history entry."""
    feed.lock()  # the head before any task row (FeedPositions.lock)
    d, moment, until = tx.dialect, encode_dt(now), encode_dt(lease_until)
    in_buckets, params = d.member_of("bucket", list(buckets))
    conditions = ["status = ?", in_buckets, "(not_before IS NULL OR not_before <= ?)"]
    params = [TaskStatus.PENDING.value, *params, moment]
    if names:
        in_names, name_params = d.member_of("name", list(names))
        conditions.append(in_names)
        params.extend(name_params)
    rows = tx.rows(
        f"SELECT {TASK_SELECT} FROM tasks WHERE {' AND '.join(conditions)}"
        f" ORDER BY priority DESC, {ready_ms(d)}, task_id LIMIT ?{d.skip_locked}",
        [*params, limit],
    )
    started = []
    for values in rows:
        row = task_row(values)
        task_id = text(row["task_id"])
        version = integer(row["status_version"], "tasks/" + task_id, "status_version") + 1
        position = feed.next()
        tx.run(
            "UPDATE tasks SET status = ?, status_version = ?, updated_at = ?, heartbeat_at = ?,"
            " lease_owner = ?, lease_until = ?, feed_position = ? WHERE task_id = ?",
            [TaskStatus.RUNNING.value, version, moment, moment, owner, until, position, task_id],
        )
        feed.used()
        row.update(status=TaskStatus.RUNNING.value, status_version=version, updated_at=moment,
                   heartbeat_at=moment, lease_owner=owner, lease_until=until)  # fmt: skip
        snapshot = decode_task(list(row.values()))
        reason = f"started by {owner} (attempt {snapshot.attempt})"
        entry = Transition(task_id, version, TaskStatus.PENDING, TaskStatus.RUNNING, now, reason)
        append(tx, [transition_to_row(entry)])
        started.append(snapshot)
    return started


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
    in_terminal, params = d.member_of("status", list(TERMINAL))
    ((count,),) = tx.rows(f"SELECT COUNT(*) FROM tasks WHERE {in_terminal}", params)
    excess = int(count) - keep
    if excess <= 0:
        return 0, False
    doomed = tx.rows(
        f"SELECT task_id, name, bucket FROM tasks WHERE {in_terminal}"
        f" ORDER BY created_at, task_id LIMIT ?{d.for_update}",
        [*params, min(excess, batch)],
    )
    for task_id, name, bucket in doomed:
        key = "tasks/" + text(task_id)
        feed.tombstone(text(task_id), text(name), integer(bucket, key, "bucket"), removed_at)
        for table in ("tasks", "history", "task_tags"):
            tx.run(f"DELETE FROM {table} WHERE task_id = ?", [task_id])
        tx.run("UPDATE commands SET listed = 0 WHERE task_id = ? AND listed = 1", [task_id])
    return len(doomed), excess > len(doomed)
