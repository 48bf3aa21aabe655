"""``stress/schedule_checks.py`` on hand-made records: a clean run passes, and each way a
schedule can go wrong trips its violation (a tick fired twice, a tick counted fired without
its task, a tick never decided, a task created before its tick)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.schedule_state import ScheduleState, fire_due, new_state, triggered
from chongming_redis.schedules import Schedule, tick_task_id
from chongming_redis.stress.schedule_checks import check_schedule

T0 = datetime(2026, 5, 1, 8, 0, 0, 400000, tzinfo=timezone.utc)


def run(
    seconds: int, skip: frozenset[int] = frozenset()
) -> tuple[ScheduleState, list[TaskSnapshot]]:
    """A schedule fired once a second for ``seconds`` (the ticks in ``skip`` skipped), its
    tasks created at the firing moment, as the workers do."""
    state = new_state(Schedule("beat", "beat", every=1), T0)
    tasks = []
    for n in range(1, seconds + 1):
        now = T0 + timedelta(seconds=n, milliseconds=-300)  # 100 ms after the tick
        firing = fire_due(state, now, previous_unfinished=n in skip)
        assert firing is not None
        state = firing.state
        if firing.task_id:
            tasks.append(TaskSnapshot(firing.task_id, "beat", TaskStatus.SUCCEEDED, 3, now, now))
    return state, tasks


def kinds(state: ScheduleState | None, tasks: list[TaskSnapshot]) -> list[str]:
    return sorted(v.kind for v in check_schedule(state, tasks)[0])


def test_a_clean_run_passes_and_is_counted() -> None:
    state, tasks = run(12, skip=frozenset({4, 5}))
    found, counts = check_schedule(state, tasks)
    assert found == []
    assert counts == {"ticks_fired": 10, "ticks_skipped": 2, "ticks_missed": 0}
    # Tasks of ticks after the state read, and a trigger's, are not judged.
    later = TaskSnapshot(tick_task_id("beat", state.next_tick), "beat", TaskStatus.PENDING, 1,
                         state.next_tick, state.next_tick)  # fmt: skip
    trigger = triggered(state, T0 + timedelta(seconds=20))
    manual = TaskSnapshot(str(trigger.task_id), "beat", TaskStatus.PENDING, 1, T0, T0)
    assert kinds(state, [*tasks, later, manual]) == []


def test_a_tick_fired_twice_or_without_its_task_is_a_double_fire() -> None:
    state, tasks = run(6)
    twice = replace(state, counts={**state.counts, "fired": 7})  # two writers counted one tick
    assert kinds(twice, tasks) == ["tick_double_fires", "tick_gaps"]
    assert kinds(state, tasks[:-1]) == ["tick_double_fires"]  # counted, but no task


def test_a_tick_never_decided_is_a_gap() -> None:
    state, tasks = run(6)
    jumped = replace(state, next_tick=state.next_tick + timedelta(seconds=3))
    assert kinds(jumped, tasks) == ["tick_gaps"]


def test_a_task_created_before_its_tick_is_early() -> None:
    state, tasks = run(4)
    early = replace(tasks[1], created_at=tasks[1].created_at - timedelta(milliseconds=150))
    assert kinds(state, [tasks[0], early, *tasks[2:]]) == ["early_ticks"]


def test_a_schedule_that_is_not_stored_is_reported() -> None:
    assert kinds(None, []) == ["tick_gaps"]
