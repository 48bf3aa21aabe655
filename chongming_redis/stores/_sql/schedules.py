"""``SqlSchedules``: the schedule records (``SchedulesStore`` in ``stores/schedule_store.py``) of
every SQL store, mixed into ``SqlTaskStore``, and the SQL they run. The in-memory reference
(``stores/_memory_schedules.py``) is the behaviour; the table is ``schema._v5``'s
(``schedules``: ``id``, ``version``, ``state``).

* **write**: one write transaction (SQLite's ``BEGIN IMMEDIATE``; PostgreSQL ``READ
  COMMITTED``). The compare-and-set is its first statement, one ``UPDATE ... WHERE id = ? AND
  version = ?`` (version 0: ``INSERT ... ON CONFLICT DO NOTHING``), so the check and the write
  are one step and the row count says which happened: a concurrent writer from the same
  version waits on the row (PostgreSQL) or the file's write lock (SQLite) and then matches
  nothing. The tick's task is then created by ``tasks.insert``, ``create``'s own statement
  group (row, tags, feed position, unique id, limits); a ``UniqueTaken`` raises, so the
  transaction rolls back with the schedule's new version: nothing is written. A task whose id
  exists is left as it is (``created`` False) and the state is still written.
* **lock order**: the schedule row, then (with a task) the feed head (``FeedPositions``), then
  the task row; no writer takes a schedule row after the head, so none waits for another in
  a cycle.
* **delete** keeps the row with its version moved on and ``state`` NULL, so versions never go
  back: a writer that read the schedule before the delete is refused, also once the id is
  made again (a create, version 0, takes a row that is absent or deleted).
* **state**: kept as given; text that is not UTF-8 (a lone surrogate, which ``check_write``
  lets through) is kept as its ``surrogatepass`` bytes and read back as it was.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from chongming_redis.errors import CorruptRecord, ScheduleConflict, TaskAlreadyExists
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores._sql import limits, tasks
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import integer, text
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores.codec import snapshot_to_row
from chongming_redis.stores.schedule_store import check_write
from chongming_redis.validation import check_identifier


class SqlSchedules:
    if TYPE_CHECKING:  # provided by SqlTaskStore

        def _writing(self) -> AbstractContextManager[tuple[Tx, FeedPositions]]: ...

        def _reading(self) -> AbstractContextManager[Tx]: ...

    def write_schedule(
        self,
        schedule_id: str,
        state: str,
        *,
        expect_version: int,
        task: TaskSnapshot | None = None,
    ) -> tuple[int, bool]:
        """``SchedulesStore``: compare and set the version, and create ``task`` (unless its id
        exists) in the same transaction; ``(new version, whether the task was created)``."""
        checked = check_write(schedule_id, state, expect_version, task)
        row = None if checked is None else snapshot_to_row(checked)
        with self._writing() as (tx, feed):
            version = write(tx, schedule_id, state, expect_version)
            if row is None:
                return version, False
            error = tasks.insert(tx, feed, row)
            if isinstance(error, TaskAlreadyExists):
                return version, False
            if error is not None:
                raise error  # UniqueTaken: the schedule's write rolls back with it
            limits.sync(tx, [(row, True)])
            return version, True

    def schedule_record(self, schedule_id: str) -> tuple[int, str] | None:
        """``SchedulesStore``: ``(version, state)`` of ``schedule_id``, or ``None``."""
        check_identifier(schedule_id, "schedule_id")
        with self._reading() as tx:
            found = tx.rows("SELECT version, state FROM schedules WHERE id = ?"
                            " AND state IS NOT NULL", [schedule_id])  # fmt: skip
        return _record(schedule_id, *found[0]) if found else None

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        """``SchedulesStore``: every schedule, id -> ``(version, state)``."""
        with self._reading() as tx:
            found = tx.rows("SELECT id, version, state FROM schedules WHERE state IS NOT NULL")
        return {(name := text(i)): _record(name, v, s) for i, v, s in found}

    def delete_schedule(self, schedule_id: str) -> bool:
        """``SchedulesStore``: remove the state, keep the version moved on (its tasks stay);
        whether it existed."""
        check_identifier(schedule_id, "schedule_id")
        with self._writing() as (tx, _):
            return tx.run("UPDATE schedules SET version = version + 1, state = NULL"
                          " WHERE id = ? AND state IS NOT NULL", [schedule_id]) > 0  # fmt: skip


def write(tx: Tx, schedule_id: str, state: str, expect: int) -> int:
    """The compare-and-set: ``schedule_id`` one version on holding ``state`` if it was at
    ``expect`` (0: absent or deleted), else ``ScheduleConflict`` (nothing written); the new
    version."""
    stored = _stored(state)
    if expect == 0:  # a deleted row (state NULL) is taken over, its version moved on
        sql = ("INSERT INTO schedules (id, version, state) VALUES (?, 1, ?) ON CONFLICT (id)"
               " DO UPDATE SET version = schedules.version + 1, state = excluded.state"
               " WHERE schedules.state IS NULL")  # fmt: skip
        params: list[object] = [schedule_id, stored]
    else:  # version + 1 in SQL: no parameter beyond the 64-bit range is ever bound
        sql = ("UPDATE schedules SET version = version + 1, state = ?"
               " WHERE id = ? AND version = ? AND state IS NOT NULL")  # fmt: skip
        params = [stored, schedule_id, expect]
    changed = tx.run(sql, params)
    found = tx.rows("SELECT version, state IS NOT NULL FROM schedules WHERE id = ?", [schedule_id])
    version = integer(found[0][0], "schedules/" + schedule_id, "version") if found else None
    if changed:
        assert version is not None
        return version
    raise ScheduleConflict(schedule_id, expect, version if found and found[0][1] else None)


def _stored(state: str) -> str | bytes:
    try:
        state.encode("utf-8")
    except UnicodeEncodeError:
        return state.encode("utf-8", "surrogatepass")
    return state


def _record(schedule_id: str, version: Any, state: Any) -> tuple[int, str]:
    key = "schedules/" + schedule_id
    if isinstance(state, bytes | bytearray | memoryview):
        try:
            state = bytes(state).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise CorruptRecord(key, "state", str(exc)) from None
    return integer(version, key, "version"), str(state)
