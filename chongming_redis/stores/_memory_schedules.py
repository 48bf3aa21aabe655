"""The in-memory reference of the schedule duties (``SchedulesStore``): records of
``(version, state text)``, and ``write_schedule``'s compare-and-set with the tick's task
created under the same lock, so the reference cannot apply one without the other. A deleted
schedule keeps its version (state ``None``), so versions never go back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chongming_redis.errors import ScheduleConflict, UniqueTaken
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores.codec import Row, snapshot_to_row
from chongming_redis.stores.schedule_store import check_write
from chongming_redis.validation import check_identifier

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from chongming_redis.stores._feed import MemoryFeed


class MemorySchedules:
    """Mixed into ``InMemoryTaskStore``; every method runs under the store's lock."""

    _tasks: dict[str, Row]
    _schedules: dict[str, tuple[int, str | None]]

    if TYPE_CHECKING:
        _feed: MemoryFeed

        def _open(self) -> AbstractContextManager[None]: ...

        def _unique_error(self, row: Row, previous: Row | None) -> UniqueTaken | None: ...

    def _init_schedules(self) -> None:
        self._schedules = {}

    def write_schedule(
        self,
        schedule_id: str,
        state: str,
        *,
        expect_version: int,
        task: TaskSnapshot | None = None,
    ) -> tuple[int, bool]:
        checked = check_write(schedule_id, state, expect_version, task)
        row = None if checked is None else snapshot_to_row(checked)
        with self._open():
            actual, stored = self._schedules.get(schedule_id, (0, None))
            live = stored is not None
            if (expect_version == 0) == live or (live and actual != expect_version):
                raise ScheduleConflict(schedule_id, expect_version, actual if live else None)
            created = row is not None and row["task_id"] not in self._tasks
            if created and row is not None:
                if (taken := self._unique_error(row, None)) is not None:
                    raise taken
                self._tasks[str(row["task_id"])] = row
                self._feed.move(str(row["task_id"]))
            self._schedules[schedule_id] = (actual + 1, state)
            return actual + 1, created

    def schedule_record(self, schedule_id: str) -> tuple[int, str] | None:
        check_identifier(schedule_id, "schedule_id")
        with self._open():
            version, state = self._schedules.get(schedule_id, (0, None))
            return None if state is None else (version, state)

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        with self._open():
            return {k: (v, s) for k, (v, s) in self._schedules.items() if s is not None}

    def delete_schedule(self, schedule_id: str) -> bool:
        check_identifier(schedule_id, "schedule_id")
        with self._open():
            version, state = self._schedules.get(schedule_id, (0, None))
            if state is None:
                return False
            self._schedules[schedule_id] = (version + 1, None)
            return True
