"""``MemoryReads``: the read-side extensions of ``InMemoryTaskStore`` (``stores/memory.py``),
kept apart so the store module stays small: per-bucket counts, reading a command back, keyset
paging over ``query`` and what a dashboard shows of the commands. A mixin: the store provides
the records and ``_open`` (its lock, refused once closed).

The store keeps one index the Redis store keeps too: the command ids of each task
(``_task_commands``), written by ``submit_command`` and dropped with the task by ``prune``, so
``task_commands`` lists what the Redis store lists (a pruned task's commands are gone from it,
though each command stays readable by id, as on Redis).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from chongming_redis.model import Command, CommandBacklog, TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import Row, decode_dt, encode_dt, row_to_command, row_to_snapshot
from chongming_redis.validation import check_identifier


class MemoryReads:
    _tasks: dict[str, Row]
    _commands: dict[str, Row]
    #: task id -> the ids of the commands submitted for it (insertion-ordered, as a dict).
    _task_commands: dict[str, dict[str, None]]

    if TYPE_CHECKING:  # provided by InMemoryTaskStore

        def _open(self) -> AbstractContextManager[None]: ...

    # -- tasks -----------------------------------------------------------------------------

    def query_page(
        self, query: TaskQuery | None = None, *, after: tuple[datetime, str] | None = None
    ) -> list[TaskSnapshot]:
        """``PagedQueryStore``: ``query`` from strictly after ``after`` in the query's order."""
        q, position = check.check_query(query), check.check_after(after)
        return self._selected(q, position)

    def _selected(self, q: TaskQuery, after: tuple[datetime, str] | None) -> list[TaskSnapshot]:
        """The tasks ``q`` matches, in its order, after ``after`` (``None``: from the start)."""
        with self._open():
            rows = [row for row in self._tasks.values() if _matches(row, q)]
        rows.sort(key=_position, reverse=q.newest_first)
        if after is not None:
            cursor = (encode_dt(after[0]), after[1])
            if q.newest_first:
                rows = [r for r in rows if _position(r) < cursor]
            else:
                rows = [r for r in rows if _position(r) > cursor]
        if q.limit is not None:
            rows = rows[: q.limit]
        return [row_to_snapshot(row) for row in rows]

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        with self._open():
            result: dict[int, dict[TaskStatus, int]] = {}
            for row in self._tasks.values():
                per = result.setdefault(int(row["bucket"]), dict.fromkeys(TaskStatus, 0))  # type: ignore[arg-type]
                per[TaskStatus(row["status"])] += 1
            return result

    # -- commands --------------------------------------------------------------------------

    def get_command(self, command_id: str) -> Command | None:
        """``CommandReadingStore``: the command as stored, or ``None``."""
        check_identifier(command_id, "command_id")
        with self._open():
            row = self._commands.get(command_id)
            return None if row is None else row_to_command(dict(row))

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        """``CommandInspectingStore``: the task's newest ``limit`` commands, oldest first."""
        newest = check.check_task_commands(task_id, limit)
        with self._open():
            rows = [self._commands[c] for c in self._task_commands.get(task_id, ())]
            rows.sort(key=lambda r: (r["created_at"], r["command_id"]))
            return [row_to_command(dict(row)) for row in rows[-newest:]]

    def command_backlog(self) -> CommandBacklog:
        """``CommandInspectingStore``: the unfinished commands, unclaimed and leased."""
        with self._open():
            unfinished = [r for r in self._commands.values() if r["finished_at"] is None]
        waiting = [int(r["created_at"]) for r in unfinished if r["lease_until"] is None]  # type: ignore[arg-type]
        oldest = decode_dt(min(waiting)) if waiting else None
        return CommandBacklog(len(waiting), len(unfinished) - len(waiting), oldest)


def _position(row: Row) -> tuple[int, str]:
    """A task's place in ``query``'s order: ``(created_at in µs, task_id)``; ``str`` order is
    code point order, which is the UTF-8 byte order Redis sorts ties in."""
    return int(row["created_at"]), str(row["task_id"])  # type: ignore[arg-type]


def _matches(row: Row, q: TaskQuery) -> bool:
    snapshot_status = TaskStatus(row["status"])
    if q.statuses is not None and snapshot_status not in q.statuses:
        return False
    if q.name is not None and row["name"] != q.name:
        return False
    if q.name_prefix is not None and not str(row["name"]).startswith(q.name_prefix):
        return False
    if q.tag is not None and q.tag not in row_to_snapshot(row).tags:
        return False
    if q.buckets is not None and row["bucket"] not in q.buckets:
        return False
    return q.pipeline_run_id is None or row["pipeline_run_id"] == q.pipeline_run_id
