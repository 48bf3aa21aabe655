"""A stored schedule's state, and what firing it at a moment does to it (no I/O).

The store keeps each schedule as one record: ``ScheduleState`` as JSON text (``to_json`` /
``from_json``) with a version it compares and sets (``SchedulesStore`` in
``stores/schedule_store.py``). Every change is a new state written over the version it was
computed from, so two workers that both decide to fire the same tick cannot both succeed:
the second's write is refused and it reads again.

**What a firing at ``now`` does** (``fire_due``, ``now`` on the store's clock):

* nothing while ``paused`` (ticks passing then are neither fired nor missed; ``resume`` starts
  again from the next tick after the resume);
* with ``next_tick <= now``: the ticks in ``[next_tick, now]`` are decided at once, by
  ``schedules.catch_up``: the latest is fired if within the catch-up window, the others are
  recorded missed; ``next_tick`` moves past ``now``;
* the tick to fire meets the overlap rule when the previous tick's task is unfinished:
  ``SKIP`` records it skipped; ``ALLOW`` fires it; ``BUFFER_ONE`` keeps it (one at most: a
  tick arriving while one is kept is skipped) and fires it once the previous task has ended.

Each tick is decided exactly once (fired, skipped or missed) and never before its time; every
outcome is counted and the latest ``RECENT`` are kept (``recent``), newest last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from chongming_redis.schedules import (
    CATCH_UP_WINDOW,
    Overlap,
    Schedule,
    ScheduleError,
    catch_up,
    tick_task_id,
)

#: How many outcomes a schedule keeps (the counters count them all).
RECENT = 20
FIRED, SKIPPED, MISSED, TRIGGERED = "fired", "skipped", "missed", "triggered"
OUTCOMES = (FIRED, SKIPPED, MISSED, TRIGGERED)


@dataclass(frozen=True)
class TickOutcome:
    """What happened to ``tick`` (to ``count`` ticks, ``tick`` .. ``last``, for missed ones)
    at ``at``: ``fired``/``triggered`` name the task they created (``task_id``)."""

    outcome: str
    tick: datetime
    at: datetime
    task_id: str | None = None
    count: int = 1
    last: datetime | None = None


@dataclass(frozen=True)
class ScheduleState:
    """A stored schedule: its definition, whether it is paused, the next tick not yet
    decided, the task of the last tick fired (the overlap rule reads it), a tick kept by
    ``BUFFER_ONE``, and its outcomes. ``first_tick``: the first tick of its current timing
    (since then every tick up to ``next_tick`` was decided, but for those of pauses)."""

    schedule: Schedule
    next_tick: datetime
    updated_at: datetime
    first_tick: datetime
    paused: bool = False
    last_task: str | None = None
    buffered: datetime | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    recent: tuple[TickOutcome, ...] = ()


@dataclass(frozen=True)
class Firing:
    """A state to write and, when a tick fires, the id of the task to create with it."""

    state: ScheduleState
    task_id: str | None
    tick: datetime | None


def new_state(schedule: Schedule, now: datetime) -> ScheduleState:
    """A schedule just stored: its first tick is the first after ``now``."""
    first = schedule.next_tick(now)
    return ScheduleState(schedule, first, _utc(now), first)


def replaced(state: ScheduleState, schedule: Schedule, now: datetime) -> ScheduleState:
    """``state`` with a new definition: when its timing (cron, every, tz) changed the next
    tick is the new definition's first after ``now``; the rest is kept."""
    old = state.schedule
    same_timing = (old.cron, old.every, old.tz) == (schedule.cron, schedule.every, schedule.tz)
    if state.buffered is not None and schedule.overlap is not Overlap.BUFFER_ONE:
        # A kept tick would never fire under another rule: it is decided now, skipped.
        state = _recorded(state, [TickOutcome(SKIPPED, state.buffered, _utc(now))], _utc(now))
        state = replace(state, buffered=None)
    if same_timing:
        return replace(state, schedule=schedule, updated_at=_utc(now))
    first = schedule.next_tick(now)
    return replace(state, schedule=schedule, next_tick=first, first_tick=first,
                   updated_at=_utc(now))  # fmt: skip


def paused(state: ScheduleState, flag: bool, now: datetime) -> ScheduleState:
    """``state`` paused or resumed; a resume starts again from the next tick after ``now``."""
    next_tick = state.next_tick if flag or not state.paused else state.schedule.next_tick(now)
    return replace(state, paused=flag, next_tick=next_tick, updated_at=_utc(now))


def is_due(state: ScheduleState, now: datetime) -> bool:
    """Whether ``fire_due`` would do anything but wait (a tick reached, or a kept one)."""
    return not state.paused and (state.next_tick <= now or state.buffered is not None)


def fire_due(
    state: ScheduleState,
    now: datetime,
    *,
    previous_unfinished: bool,
    window: timedelta = CATCH_UP_WINDOW,
) -> Firing | None:
    """What a firing at ``now`` writes (module doc), or ``None`` when nothing is due.
    ``previous_unfinished``: whether ``state.last_task`` exists and has not ended."""
    now = _utc(now)
    if not is_due(state, now):
        return None
    schedule = state.schedule
    outcomes: list[TickOutcome] = []
    fire: datetime | None = None
    buffered = state.buffered
    if buffered is not None and not previous_unfinished:
        fire, buffered = buffered, None
    next_tick = state.next_tick
    if next_tick <= now:
        plan = catch_up(schedule, next_tick - timedelta(microseconds=1), now, window)
        next_tick = plan.next
        if plan.missed:
            assert plan.first_missed is not None
            outcomes.append(TickOutcome(MISSED, plan.first_missed, now, count=plan.missed,
                                        last=plan.last_missed))  # fmt: skip
        if plan.fire is not None:
            busy = previous_unfinished or fire is not None  # a kept tick fires now
            if not busy or schedule.overlap is Overlap.ALLOW:  # (ALLOW keeps none)
                fire = plan.fire
            elif schedule.overlap is Overlap.BUFFER_ONE and buffered is None:
                buffered = plan.fire
            else:
                outcomes.append(TickOutcome(SKIPPED, plan.fire, now))
    if (
        not outcomes
        and fire is None
        and buffered == state.buffered
        and next_tick == state.next_tick
    ):
        return None  # a kept tick still waiting for the previous task: nothing to write
    task_id = None if fire is None else tick_task_id(schedule.id, fire)
    if fire is not None:
        outcomes.append(TickOutcome(FIRED, fire, now, task_id=task_id))
    new = _recorded(state, outcomes, now)
    new = replace(new, next_tick=next_tick, buffered=buffered,
                  last_task=task_id or state.last_task)  # fmt: skip
    return Firing(new, task_id, fire)


def unfired(before: ScheduleState, firing: Firing) -> Firing:
    """``firing`` with its tick skipped instead of fired: its task could not be made (the
    stored parameters no longer fit the task type). The tick is decided all the same, so a
    worker does not try it again at every pass."""
    if firing.tick is None:
        return firing
    state = firing.state
    outcomes = [o for o in state.recent if not (o.outcome == FIRED and o.task_id == firing.task_id)]
    counts = {**state.counts, FIRED: state.counts[FIRED] - 1}
    counts[SKIPPED] = counts.get(SKIPPED, 0) + 1
    skipped = TickOutcome(SKIPPED, firing.tick, state.updated_at)
    new = replace(state, counts=counts, recent=(*outcomes, skipped)[-RECENT:],
                  last_task=before.last_task)  # fmt: skip
    return Firing(new, None, None)


def triggered(state: ScheduleState, now: datetime) -> Firing:
    """A tick fired by hand at ``now`` (``trigger``): its task id is the tick id with
    ``.trigger`` after it (never a scheduled tick's id); the schedule's ticks are unchanged."""
    now = _utc(now)
    task_id = tick_task_id(state.schedule.id, now) + f".{now.microsecond:06d}.trigger"
    new = _recorded(state, [TickOutcome(TRIGGERED, now, now, task_id=task_id)], now)
    return Firing(replace(new, last_task=task_id), task_id, now)


def _recorded(state: ScheduleState, outcomes: list[TickOutcome], now: datetime) -> ScheduleState:
    counts = dict(state.counts)
    for item in outcomes:
        counts[item.outcome] = counts.get(item.outcome, 0) + item.count
    recent = (state.recent + tuple(outcomes))[-RECENT:]
    return replace(state, counts=counts, recent=recent, updated_at=now)


# -- the stored text ---------------------------------------------------------------------------


def to_json(state: ScheduleState) -> str:
    """The state as the store keeps it (sorted keys)."""
    s = state.schedule
    definition = {"id": s.id, "task": s.task, "params": s.params, "cron": s.cron,
                  "every": s.every, "tz": s.tz, "overlap": s.overlap.value}  # fmt: skip
    return json.dumps({
        "schedule": definition, "next_tick": _text(state.next_tick),
        "updated_at": _text(state.updated_at), "first_tick": _text(state.first_tick),
        "paused": state.paused,
        "last_task": state.last_task, "buffered": _text(state.buffered),
        "counts": state.counts, "recent": [_outcome_json(o) for o in state.recent],
    }, sort_keys=True, separators=(",", ":"))  # fmt: skip


def from_json(text: str) -> ScheduleState:
    """The state ``to_json`` wrote; ``ValueError`` naming what is wrong otherwise."""
    try:
        d = json.loads(text)
        schedule = Schedule(**d["schedule"])
        first = d.get("first_tick") or d["next_tick"]  # (a state written before first_tick)
        return ScheduleState(
            schedule=schedule, next_tick=_moment(d["next_tick"]),
            updated_at=_moment(d["updated_at"]), first_tick=_moment(first),
            paused=bool(d["paused"]),
            last_task=d["last_task"], buffered=_optional_moment(d["buffered"]),
            counts={k: int(v) for k, v in d["counts"].items()},
            recent=tuple(_outcome(o) for o in d["recent"]),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError, ScheduleError) as exc:
        raise ValueError(f"not a schedule state: {exc}") from None


def definition_json(schedule: Schedule) -> dict[str, Any]:
    """The definition as JSON values (the CLI and the dashboard print it)."""
    return json.loads(to_json(ScheduleState(schedule, _EPOCH, _EPOCH, _EPOCH)))["schedule"]  # type: ignore[no-any-return]


def _outcome_json(item: TickOutcome) -> dict[str, Any]:
    return {"outcome": item.outcome, "tick": _text(item.tick), "at": _text(item.at),
            "task_id": item.task_id, "count": item.count, "last": _text(item.last)}  # fmt: skip


def _outcome(d: dict[str, Any]) -> TickOutcome:
    if d["outcome"] not in OUTCOMES:
        raise ValueError(f"unknown outcome {d['outcome']!r}")
    return TickOutcome(d["outcome"], _moment(d["tick"]), _moment(d["at"]), d["task_id"],
                       int(d["count"]), _optional_moment(d["last"]))  # fmt: skip


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _text(moment: datetime | None) -> str | None:
    return None if moment is None else _utc(moment).isoformat()


def _moment(text: str) -> datetime:
    return _utc(datetime.fromisoformat(text))


def _optional_moment(text: str | None) -> datetime | None:
    return None if text is None else _moment(text)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("a schedule time must be timezone-aware")
    return moment.astimezone(timezone.utc)
