"""The checker of the schedules (issue 27) over a stress run's records: the stress app's
schedule (``stress/app.py``: ``stress-beat``, every second, fired by the workers that hold its
bucket while they are SIGKILLed, paused past their leases, skewed and Redis is killed) must
have decided each of its ticks exactly once and never before its time.

What is read: the schedule's stored state first, then its tasks (the ids ``<id>@<tick>``).
A tick's task is created by the same atomic write that moves the state past the tick, so the
tasks of ticks before the state's ``next_tick`` are exactly the ticks it counts as fired,
whatever the workers wrote after the read. Violations:

* ``tick_double_fires``: the fired count differs from the tasks of those ticks (a tick fired
  twice by two writers, or a fire counted without its task);
* ``tick_gaps``: fired + skipped + missed differs from the ticks from ``first_tick`` to
  ``next_tick`` (a tick decided twice, or never);
* ``early_ticks``: a tick's task created before its tick. ``created_at`` is the deciding
  worker's clock, which follows the server's (``ServerClock``, synced every 30 s, even under
  the run's ±300 s skew), so this judges the decision, within that clock's error (a few ms).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from chongming_redis.model import TaskSnapshot
from chongming_redis.schedule_state import ScheduleState
from chongming_redis.stress.checkers import Violation

TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def tick_of(task_id: str) -> datetime | None:
    """The tick of a scheduled tick's task id (``None``: not one, e.g. a trigger's)."""
    try:
        return datetime.strptime(task_id.split("@", 1)[1], TICK_FORMAT).replace(tzinfo=timezone.utc)
    except (IndexError, ValueError):
        return None


def check_schedule(
    state: ScheduleState | None, tasks: Iterable[TaskSnapshot]
) -> tuple[list[Violation], dict[str, Any]]:
    """The violations, and the counts the report prints."""
    if state is None:
        return [Violation("tick_gaps", "", "the stress schedule is not stored")], {}
    sid = state.schedule.id
    found: list[Violation] = []
    ticks = {}
    for task in tasks:
        tick = tick_of(task.task_id)
        if tick is None or not task.task_id.startswith(sid + "@"):
            continue
        if state.first_tick <= tick < state.next_tick:
            ticks[tick] = task
        if task.created_at < tick:
            detail = f"created at {task.created_at}, before its tick"
            found.append(Violation("early_ticks", task.task_id, detail))
    counts = state.counts
    if counts["fired"] != len(ticks):
        detail = f"{counts['fired']} fired counted, {len(ticks)} tick tasks"
        found.append(Violation("tick_double_fires", sid, detail))
    every = state.schedule.interval
    elapsed = int((state.next_tick - state.first_tick).total_seconds()) // every
    decided = counts["fired"] + counts["skipped"] + counts["missed"]
    if decided != elapsed:
        detail = f"{decided} ticks decided of {elapsed} since the first"
        found.append(Violation("tick_gaps", sid, detail))
    return found, {
        "ticks_fired": counts["fired"],
        "ticks_skipped": counts["skipped"],
        "ticks_missed": counts["missed"],
    }
