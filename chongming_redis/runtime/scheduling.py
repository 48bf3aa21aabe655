"""The schedule operations producers and workers share, over a ``SchedulesStore``: storing a
definition (``upsert``), pausing and resuming, firing by hand (``trigger``), and firing what is
due (``fire_due``, the workers' pass; ``runtime/schedule_loop.py`` runs it).

Every change reads the record, computes the next state (``schedule_state``) and writes it over
the version it read; a ``ScheduleConflict`` means another writer moved first, and the change
is computed again from what it wrote (``upsert``, ``pause``... retry; a firing leaves the
tick to the writer that won). A tick's task is built like a submitted one
(``submission.new_task``: its type's policies, bucket and limits when this process knows the
type, else those its workers recorded) with the tick's id, and created by the same write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chongming_redis.errors import (
    ScheduleConflict,
    ScheduleNotFound,
    StoreError,
    StoreUnavailable,
)
from chongming_redis.limits import BoundLimit
from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.submission import NewTask, new_task
from chongming_redis.schedule_state import (
    Firing,
    ScheduleState,
    from_json,
    is_due,
    new_state,
    paused,
    replaced,
    to_json,
    triggered,
    unfired,
)
from chongming_redis.schedule_state import fire_due as decide
from chongming_redis.schedules import Schedule
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.schedule_store import SchedulesStore
from chongming_redis.validation import check_identifier

log = logging.getLogger("chongming_redis.schedules")

#: How many times a change is computed again after losing a race before it gives up.
ATTEMPTS = 20


@dataclass(frozen=True)
class StoredSchedule:
    """A schedule as the store holds it: its record's version and its state."""

    version: int
    state: ScheduleState

    @property
    def schedule(self) -> Schedule:
        return self.state.schedule


@dataclass(frozen=True)
class TaskMaker:
    """What building a tick's task needs: the app (its task types, if it has them), the
    bucket policy, who writes the history entry, and the limits recorded for a type the app
    does not know (``recorded(name)``)."""

    app: App | None
    buckets: BucketPolicy
    by: str
    recorded: Callable[[str], tuple[BoundLimit, ...]] = lambda name: ()

    def make(
        self, schedule: Schedule, task_id: str, now: datetime
    ) -> tuple[TaskSnapshot, Transition]:
        task_type = self.task_type(schedule.task)
        spec = NewTask(schedule.task, schedule.params, task_id=task_id,
                       tags=(f"schedule:{schedule.id}",))  # fmt: skip
        recorded = () if task_type else self.recorded(schedule.task)
        return new_task(spec, task_type, now=now, buckets=self.buckets,
                        submitted_by=f"schedule {schedule.id} ({self.by})",
                        recorded_limits=recorded)  # fmt: skip

    def task_type(self, name: str) -> TaskType | None:
        if self.app is None:
            return None
        return self.app.types.get(name)


def read(store: SchedulesStore, schedule_id: str) -> StoredSchedule | None:
    record = store.schedule_record(check_identifier(schedule_id, "schedule_id"))
    return None if record is None else StoredSchedule(record[0], from_json(record[1]))


def read_all(store: SchedulesStore) -> list[StoredSchedule]:
    """Every schedule, by id; a record that does not decode is left out (logged once per
    version: a worker reads them twice a second)."""
    found = []
    for schedule_id, (version, text) in sorted(store.schedule_records().items()):
        try:
            found.append(StoredSchedule(version, from_json(text)))
        except ValueError as exc:
            _log_once(f"schedule {schedule_id!r} (version {version}) cannot be read: {exc}")
    return found


_LOGGED: dict[str, None] = {}


def _log_once(message: str) -> None:
    """``log.error`` once per message (the latest 1,000 remembered)."""
    if message in _LOGGED:
        return
    _LOGGED[message] = None
    while len(_LOGGED) > 1000:
        del _LOGGED[next(iter(_LOGGED))]
    log.error("%s", message)


def upsert(
    store: SchedulesStore, schedule: Schedule, now: Callable[[], datetime], maker: TaskMaker
) -> StoredSchedule:
    """Store ``schedule``: new, or replacing the stored definition (its outcomes, pause and
    kept tick stay; a changed timing starts from the next tick after now). The same definition
    again writes nothing. Its parameters are checked as a submit's would be (with the app's
    type), so a definition no tick could fire is refused now."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"upsert takes a Schedule, not {type(schedule).__name__}")
    maker.make(schedule, f"{schedule.id}@check", now())  # refuse bad params before writing
    for _ in range(ATTEMPTS):
        current = read(store, schedule.id)
        if current is None:
            state, expect = new_state(schedule, now()), 0
        elif current.schedule == schedule:
            return current
        else:
            state, expect = replaced(current.state, schedule, now()), current.version
        try:
            version, _ = store.write_schedule(schedule.id, to_json(state), expect_version=expect)
        except ScheduleConflict:
            continue
        return StoredSchedule(version, state)
    raise StoreError(f"schedule {schedule.id!r}: gave up after {ATTEMPTS} conflicting writes")


def set_paused(
    store: SchedulesStore, schedule_id: str, flag: bool, now: Callable[[], datetime]
) -> StoredSchedule:
    """Pause (``flag``) or resume a schedule; ``ScheduleNotFound`` when there is none."""
    for _ in range(ATTEMPTS):
        current = _existing(store, schedule_id)
        if current.state.paused == flag:
            return current
        state = paused(current.state, flag, now())
        try:
            version, _ = store.write_schedule(schedule_id, to_json(state),
                                              expect_version=current.version)  # fmt: skip
        except ScheduleConflict:
            continue
        return StoredSchedule(version, state)
    raise StoreError(f"schedule {schedule_id!r}: gave up after {ATTEMPTS} conflicting writes")


def trigger(
    store: SchedulesStore, schedule_id: str, now: Callable[[], datetime], maker: TaskMaker
) -> str:
    """Fire one tick now, whatever the schedule's times, its pause and its overlap rule; the
    id of the task created."""
    for _ in range(ATTEMPTS):
        current = _existing(store, schedule_id)
        firing = triggered(current.state, now())
        try:
            _write(store, current, firing, maker)  # written: its task is there (made now,
        except ScheduleConflict:  # or, in the same microsecond, by another trigger)
            continue
        assert firing.task_id is not None
        return firing.task_id
    raise StoreError(f"schedule {schedule_id!r}: gave up after {ATTEMPTS} conflicting writes")


def fire_due(
    store: SchedulesStore,
    now: Callable[[], datetime],
    maker: TaskMaker,
    *,
    owned: Callable[[str], bool],
    report: Callable[[str, str, int], None] = lambda schedule_id, outcome, count: None,
) -> int:
    """One pass: every due schedule ``owned`` says is this worker's is fired (a tick that
    another worker fired first is left to it). Returns the tasks created; ``report`` hears of
    every outcome written."""
    created = 0
    for current in read_all(store):
        if not owned(current.schedule.id) or not is_due(current.state, now()):
            continue
        try:
            created += _fire_one(store, current, now(), maker, report)
        except StoreUnavailable:
            raise  # the loop's outage handling: the store is down for every schedule
        except Exception as exc:  # this one only, said once: the others go on
            _log_once(f"schedule {current.schedule.id!r}: cannot fire: {exc!r}")
    return created


def _fire_one(
    store: Any,
    current: StoredSchedule,
    now: datetime,
    maker: TaskMaker,
    report: Callable[[str, str, int], None],
) -> int:
    """Fire ``current`` if due; the tasks created (0 or 1)."""
    firing = plan_firing(store, current, now)
    if firing is None:
        return 0
    try:
        try:
            made = _write(store, current, firing, maker)
        except (ValueError, TypeError) as exc:  # its task cannot be made: skipped, said once
            _log_once(f"schedule {current.schedule.id!r}: tick {firing.tick} not fired: {exc}")
            firing = unfired(current.state, firing)
            made = _write(store, current, firing, maker)
    except ScheduleConflict:
        return 0  # another worker decided these ticks first
    _report(current.state, firing.state, report)
    return made


def plan_firing(store: TaskStore | Any, current: StoredSchedule, now: datetime) -> Firing | None:
    """What firing ``current`` at ``now`` writes: the overlap rule reads whether the task of
    its last tick is unfinished."""
    last = current.state.last_task
    previous = None if last is None else store.get(last)
    unfinished = previous is not None and not previous.status.is_terminal
    return decide(current.state, now, previous_unfinished=unfinished)


def _write(store: Any, current: StoredSchedule, firing: Firing, maker: TaskMaker) -> bool:
    """Write ``firing`` over ``current``; whether a task was created (its history entry is
    appended after, as a submit's is)."""
    task = transition = None
    if firing.task_id is not None and firing.tick is not None:
        task, transition = maker.make(current.schedule, firing.task_id, firing.state.updated_at)
    _, created = store.write_schedule(current.schedule.id, to_json(firing.state),
                                      expect_version=current.version, task=task)  # fmt: skip
    if created and transition is not None:
        try:
            store.append(transition)
        except StoreError as exc:  # the task is right; its history misses the first entry
            log.warning(
                "task %s: the creation entry was not written: %s", task and task.task_id, exc
            )
    return bool(created)


def _existing(store: SchedulesStore, schedule_id: str) -> StoredSchedule:
    current = read(store, schedule_id)
    if current is None:
        raise ScheduleNotFound(schedule_id)
    return current


def _report(
    old: ScheduleState, new: ScheduleState, report: Callable[[str, str, int], None]
) -> None:
    for outcome, count in new.counts.items():
        grown = count - old.counts.get(outcome, 0)
        if grown > 0:
            report(new.schedule.id, outcome, grown)
