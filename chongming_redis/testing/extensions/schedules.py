"""The contract of ``SchedulesStore`` (``stores/schedule_store.py``): records of ``(version,
state text)`` kept exactly as given, the compare-and-set of every write (0: create), a tick's
task created in the same atomic step as the write or not at all (so two callers firing one
tick from one version make one task, and a pause written first refuses a firing computed
before it), a task id that exists already not created twice, bad input refused with nothing
written. Mixed into ``ExtensionsContract``; every test returns at once unless the store is a
``SchedulesStore``.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from chongming_redis.errors import ScheduleConflict, StoreClosed, UniqueTaken
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.protocol import ChangeFeed
from chongming_redis.stores.schedule_store import MAX_STATE_BYTES, SchedulesStore
from chongming_redis.testing.contract.support import PENDING, RUNNING, ContractBase, at, raises

STATE = '{"n":1,"text":"Grüße \\u2603 ☃"}'


def _tick_task(task_id: str = "nightly@2026-01-01T02:30:00Z", **fields: Any) -> TaskSnapshot:
    fields.setdefault("params", {"day": "2026-01-01"})
    return replace(TaskSnapshot(task_id, "report", PENDING, 1, at(10), at(10)), **fields)


class SchedulesContract(ContractBase):
    def _schedules(self) -> Any:
        return self.store if isinstance(self.store, SchedulesStore) else None

    def test_a_schedule_is_created_once_and_read_back_exactly(self) -> None:
        if (store := self._schedules()) is None:
            return
        assert store.schedule_records() == {}
        assert store.schedule_record("nightly") is None
        assert store.write_schedule("nightly", STATE, expect_version=0) == (1, False)
        assert store.schedule_record("nightly") == (1, STATE)
        error = raises(ScheduleConflict, store.write_schedule, "nightly", "{}", expect_version=0)
        assert (error.schedule_id, error.expected, error.actual) == ("nightly", 0, 1)
        assert store.schedule_record("nightly") == (1, STATE)  # the refused write left it
        assert store.write_schedule("other", "", expect_version=0) == (1, False)
        assert store.schedule_records() == {"nightly": (1, STATE), "other": (1, "")}

    def test_every_write_compares_and_sets_the_version(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("s", "v1", expect_version=0)
        assert store.write_schedule("s", "v2", expect_version=1) == (2, False)
        assert store.write_schedule("s", "v3", expect_version=2) == (3, False)
        for stale in (0, 1, 2, 4):
            error = raises(ScheduleConflict, store.write_schedule, "s", "x", expect_version=stale)
            assert (error.expected, error.actual) == (stale, 3)
        assert store.schedule_record("s") == (3, "v3")
        error = raises(ScheduleConflict, store.write_schedule, "absent", "x", expect_version=2)
        assert (error.expected, error.actual) == (2, None)
        assert store.schedule_record("absent") is None

    def test_schedules_are_independent_records(self) -> None:
        if (store := self._schedules()) is None:
            return
        for name in ("a", "b", "c"):
            store.write_schedule(name, name, expect_version=0)
        assert store.schedule_records() == {"a": (1, "a"), "b": (1, "b"), "c": (1, "c")}
        store.write_schedule("b", "b2", expect_version=1)
        assert store.schedule_records() == {"a": (1, "a"), "b": (2, "b2"), "c": (1, "c")}

    def test_a_firing_creates_its_task_in_the_same_write(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("nightly", "v1", expect_version=0)
        before = self.store.counts()
        assert store.write_schedule("nightly", "v2", expect_version=1, task=_tick_task()) == (
            2,
            True,
        )
        assert self.store.get("nightly@2026-01-01T02:30:00Z") == _tick_task()
        assert self.store.counts()[TaskStatus.PENDING] == before[TaskStatus.PENDING] + 1
        found = self.store.query(TaskQuery(statuses=frozenset({PENDING}), name="report"))
        assert [t.task_id for t in found] == ["nightly@2026-01-01T02:30:00Z"]
        assert store.schedule_record("nightly") == (2, "v2")
        if isinstance(self.store, ChangeFeed):  # in the feed as a created task is
            items = self.store.changes(after="0", limit=10).tasks
            assert [item.task_id for item in items] == ["nightly@2026-01-01T02:30:00Z"]

    def test_a_firing_refused_by_the_version_creates_no_task(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("nightly", "v1", expect_version=0)
        store.write_schedule("nightly", "paused", expect_version=1)  # a pause, written first
        late = _tick_task("nightly@2026-01-02T02:30:00Z")
        raises(ScheduleConflict, store.write_schedule, "nightly", "fired", expect_version=1,
               task=late)  # fmt: skip
        assert self.store.get(late.task_id) is None
        assert self.store.counts()[TaskStatus.PENDING] == 0
        assert store.schedule_record("nightly") == (2, "paused")
        raises(ScheduleConflict, store.write_schedule, "never", "x", expect_version=1, task=late)
        assert self.store.get(late.task_id) is None and store.schedule_record("never") is None

    def test_two_callers_firing_one_tick_from_one_version_make_one_task(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("every", "v1", expect_version=0)
        outcomes: list[str] = []
        barrier = threading.Barrier(4)

        def fire(n: int) -> None:
            barrier.wait()
            try:
                store.write_schedule("every", f"by {n}", expect_version=1,
                                     task=_tick_task(f"every@tick-{n}"))  # fmt: skip
                outcomes.append(f"ok {n}")
            except ScheduleConflict:
                outcomes.append("conflict")

        threads = [threading.Thread(target=fire, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        winners = [o for o in outcomes if o.startswith("ok")]
        assert len(winners) == 1 and outcomes.count("conflict") == 3, outcomes
        n = winners[0].split()[1]
        assert store.schedule_record("every") == (2, f"by {n}")
        made = [t.task_id for t in self.store.query(TaskQuery(name="report"))]
        assert made == [f"every@tick-{n}"]

    def test_a_tick_task_that_exists_is_not_created_again(self) -> None:
        if (store := self._schedules()) is None:
            return
        self.put(_tick_task(status=RUNNING, status_version=3, params={"first": True}))
        existing = self.store.get("nightly@2026-01-01T02:30:00Z")
        store.write_schedule("nightly", "v1", expect_version=0)
        assert store.write_schedule("nightly", "v2", expect_version=1, task=_tick_task()) == (
            2,
            False,
        )
        assert self.store.get("nightly@2026-01-01T02:30:00Z") == existing
        assert store.schedule_record("nightly") == (2, "v2")

    def test_a_taken_unique_id_refuses_the_whole_write(self) -> None:
        if (store := self._schedules()) is None:
            return
        if not hasattr(self.store, "unique_holder"):
            return
        self.put(_tick_task("holder", unique="report-day"))
        store.write_schedule("nightly", "v1", expect_version=0)
        raises(UniqueTaken, store.write_schedule, "nightly", "v2", expect_version=1,
               task=_tick_task(unique="report-day"))  # fmt: skip
        assert store.schedule_record("nightly") == (1, "v1")
        assert self.store.get("nightly@2026-01-01T02:30:00Z") is None

    def test_delete_removes_the_record_and_keeps_the_tasks(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("nightly", "v1", expect_version=0)
        store.write_schedule("nightly", "v2", expect_version=1, task=_tick_task())
        assert store.delete_schedule("nightly") is True
        assert store.delete_schedule("nightly") is False
        assert store.schedule_record("nightly") is None and store.schedule_records() == {}
        assert self.store.get("nightly@2026-01-01T02:30:00Z") is not None
        for stale in (1, 2, 3):  # a writer that read it before the delete: refused
            error = raises(ScheduleConflict, store.write_schedule, "nightly", "old",
                           expect_version=stale)  # fmt: skip
            assert error.actual is None
        assert store.schedule_record("nightly") is None

    def test_versions_never_go_back_across_a_delete(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("s", "v1", expect_version=0)
        store.write_schedule("s", "v2", expect_version=1)
        assert store.delete_schedule("s") is True
        version, created = store.write_schedule("s", "again", expect_version=0)
        assert version > 2 and created is False  # made again: a version it never had
        assert store.schedule_record("s") == (version, "again")
        for stale in (1, 2):  # a firing computed from before the delete cannot land on it
            raises(ScheduleConflict, store.write_schedule, "s", "old", expect_version=stale,
                   task=_tick_task("s@old"))  # fmt: skip
        assert self.store.get("s@old") is None and store.schedule_record("s") == (version, "again")
        raises(ScheduleConflict, store.write_schedule, "s", "twice", expect_version=0)
        assert store.write_schedule("s", "next", expect_version=version) == (version + 1, False)

    def test_bad_input_is_refused_and_writes_nothing(self) -> None:
        if (store := self._schedules()) is None:
            return
        store.write_schedule("s", "v1", expect_version=0)
        raises(ValueError, store.write_schedule, "", "x", expect_version=0)
        raises(TypeError, store.write_schedule, 7, "x", expect_version=0)
        raises(TypeError, store.write_schedule, "s", b"x", expect_version=1)
        raises(ValueError, store.write_schedule, "s", "x" * (MAX_STATE_BYTES + 1), expect_version=1)
        raises(ValueError, store.write_schedule, "s", "x", expect_version=-1)
        raises(TypeError, store.write_schedule, "s", "x", expect_version="1")
        raises(TypeError, store.write_schedule, "s", "x", expect_version=1, task="t")
        running = replace(_tick_task(), status=RUNNING)
        raises(ValueError, store.write_schedule, "s", "x", expect_version=1, task=running)
        raises(ValueError, store.write_schedule, "s", "x", expect_version=1,
               task=replace(_tick_task(), status_version=2))  # fmt: skip
        raises(TypeError, store.schedule_record, None)
        raises(ValueError, store.delete_schedule, "")
        assert store.schedule_records() == {"s": (1, "v1")}
        assert self.store.get(running.task_id) is None
        assert store.write_schedule("s", "x" * MAX_STATE_BYTES, expect_version=1) == (2, False)

    def test_a_closed_store_refuses_schedule_calls(self) -> None:
        if (store := self._schedules()) is None:
            return
        self.close_store()
        raises(StoreClosed, store.write_schedule, "s", "x", expect_version=0)
        raises(StoreClosed, store.schedule_records)
        raises(StoreClosed, store.schedule_record, "s")
        raises(StoreClosed, store.delete_schedule, "s")
