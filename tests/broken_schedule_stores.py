"""Broken schedule stores: each breaks one rule of ``SchedulesStore``
(``stores/schedule_store.py``), in the scheme of ``tests/broken_extension_stores.py`` (which
merges ``BROKEN``, ``CAUGHT_BY`` and ``SOUND`` into its tables): a small subclass of
``InMemoryTaskStore`` overriding ``write_schedule`` or a read; ``CAUGHT_BY`` names the
``ExtensionsContract`` test (``testing/extensions/schedules.py``) that pins it."""

from __future__ import annotations

import time

from chongming_redis.errors import ScheduleConflict
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.schedule_store import check_write


class CreatesTheTaskBeforeTheVersionCheck(InMemoryTaskStore):
    """The tick's task is created first, then the version compared: a refused firing leaves
    its task behind (a second task for one tick)."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        if task is not None and self.get(task.task_id) is None:
            self.create(task)
        return super().write_schedule(schedule_id, state, expect_version=expect_version)


class ChecksThenWritesInTwoSteps(InMemoryTaskStore):
    """The version is read, then written under another lock hold: two callers from one
    version both succeed."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        check_write(schedule_id, state, expect_version, task)
        current = self.schedule_record(schedule_id)
        actual = 0 if current is None else current[0]
        if actual != expect_version:
            raise ScheduleConflict(schedule_id, expect_version, None if current is None else actual)
        time.sleep(0.05)  # the window a real store's round trips open
        created = task is not None and self.get(task.task_id) is None
        if created and task is not None:
            self.create(task)
        with self._lock:
            self._schedules[schedule_id] = (actual + 1, state)
        return actual + 1, created


class CreateOverwrites(InMemoryTaskStore):
    """expect_version=0 writes over an existing schedule."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        current = self.schedule_record(schedule_id)
        if expect_version == 0 and current is not None:
            expect_version = current[0]
        return super().write_schedule(schedule_id, state, expect_version=expect_version, task=task)


class IgnoresTheVersion(InMemoryTaskStore):
    """Any version is accepted (last writer wins)."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        current = self.schedule_record(schedule_id)
        expect = 0 if current is None else current[0]
        return super().write_schedule(schedule_id, state, expect_version=expect, task=task)


class RefusesAnExistingTickTask(InMemoryTaskStore):
    """A task id that exists makes the whole write fail (the tick would be fired forever)."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        if task is not None and self.get(task.task_id) is not None:
            raise ScheduleConflict(schedule_id, expect_version, expect_version)
        return super().write_schedule(schedule_id, state, expect_version=expect_version, task=task)


class OverwritesAnExistingTickTask(InMemoryTaskStore):
    """A task id that exists is written over with the new PENDING task."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        result = super().write_schedule(
            schedule_id, state, expect_version=expect_version, task=task
        )
        if task is not None and not result[1]:
            with self._lock:
                from chongming_redis.stores.codec import snapshot_to_row

                self._tasks[task.task_id] = snapshot_to_row(task)
            return result[0], True
        return result


class DropsTheTask(InMemoryTaskStore):
    """The state is written, the task never created."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        version, _ = super().write_schedule(schedule_id, state, expect_version=expect_version)
        return version, task is not None


class StripsTheState(InMemoryTaskStore):
    """The state text is stored trimmed of non-ASCII characters."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        if isinstance(state, str):
            state = state.encode("ascii", "ignore").decode()
        return super().write_schedule(schedule_id, state, expect_version=expect_version, task=task)


class DeleteRemovesTheTasks(InMemoryTaskStore):
    """delete_schedule removes the tasks its ticks created."""

    def delete_schedule(self, schedule_id: str) -> bool:
        found = super().delete_schedule(schedule_id)
        with self._lock:
            for task_id in [t for t in self._tasks if t.startswith(f"{schedule_id}@")]:
                del self._tasks[task_id]
        return found


class WritesAHalfRefusedCall(InMemoryTaskStore):
    """A refused unique id still writes the state (the write is not all or nothing)."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        try:
            return super().write_schedule(schedule_id, state, expect_version=expect_version,
                                          task=task)  # fmt: skip
        except Exception:
            return super().write_schedule(schedule_id, state, expect_version=expect_version)


class ListsAStaleCopy(InMemoryTaskStore):
    """schedule_records answers from a copy taken at the first call."""

    _copy: dict[str, tuple[int, str]] | None = None

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        if self._copy is None:
            self._copy = super().schedule_records()
        return dict(self._copy)


class AcceptsANegativeVersion(InMemoryTaskStore):
    """expect_version < 0 is taken as 0 instead of refused."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        if type(expect_version) is int and expect_version < 0:
            expect_version = 0
        return super().write_schedule(schedule_id, state, expect_version=expect_version, task=task)


class ListsAfterClose(InMemoryTaskStore):
    """schedule_records still answers after close()."""

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        return dict(self._schedules)


class DeleteResetsTheVersion(InMemoryTaskStore):
    """delete_schedule forgets the version: a writer from before the delete lands on the
    schedule made again (a stale firing writes the old definition back)."""

    def delete_schedule(self, schedule_id: str) -> bool:
        found = super().delete_schedule(schedule_id)
        with self._lock:
            self._schedules.pop(schedule_id, None)
        return found


class TickTaskSkipsTheFeed(InMemoryTaskStore):
    """The tick's task is stored without its change-feed position (a feed reader never sees
    it)."""

    def write_schedule(self, schedule_id, state, *, expect_version, task=None):  # type: ignore[no-untyped-def]
        result = super().write_schedule(
            schedule_id, state, expect_version=expect_version, task=task
        )
        if task is not None and result[1]:
            with self._lock:
                self._feed = type(self._feed)()
        return result


_ = TaskSnapshot  # (type of the task argument above)

ONCE = "test_a_schedule_is_created_once_and_read_back_exactly"
CAS = "test_every_write_compares_and_sets_the_version"
CAUGHT_BY: dict[str, str] = {
    "CreatesTheTaskBeforeTheVersionCheck": "test_a_firing_refused_by_the_version_creates_no_task",
    "ChecksThenWritesInTwoSteps": "test_two_callers_firing_one_tick_from_one_version_make_one_task",
    "CreateOverwrites": ONCE,
    "IgnoresTheVersion": CAS,
    "RefusesAnExistingTickTask": "test_a_tick_task_that_exists_is_not_created_again",
    "OverwritesAnExistingTickTask": "test_a_tick_task_that_exists_is_not_created_again",
    "DropsTheTask": "test_a_firing_creates_its_task_in_the_same_write",
    "StripsTheState": ONCE,
    "DeleteRemovesTheTasks": "test_delete_removes_the_record_and_keeps_the_tasks",
    "WritesAHalfRefusedCall": "test_a_taken_unique_id_refuses_the_whole_write",
    "ListsAStaleCopy": "test_schedules_are_independent_records",
    "AcceptsANegativeVersion": "test_bad_input_is_refused_and_writes_nothing",
    "ListsAfterClose": "test_a_closed_store_refuses_schedule_calls",
    "DeleteResetsTheVersion": "test_versions_never_go_back_across_a_delete",
    "TickTaskSkipsTheFeed": "test_a_firing_creates_its_task_in_the_same_write",
}
SOUND: dict[str, type[InMemoryTaskStore]] = {}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
