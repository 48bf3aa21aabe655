"""Schedules: what a periodic task is and when its ticks fall (``Schedule``, ``Overlap``).

The vocabulary the stores and the firing build on, with no I/O: a schedule's definition, checked
when it is made (an invalid cron expression, an unknown time zone, both or neither of ``cron``
and ``every``, ``every`` not a whole number of seconds >= 1 are each a ``ScheduleError`` naming
the field); its ticks (``next_tick``, ``ticks``); the id of a tick's task (``tick_task_id``:
``<schedule id>@<tick in UTC, YYYY-MM-DDTHH:MM:SSZ>``, so a second attempt to fire a tick meets
the task the first one created); and what a firing does after downtime (``catch_up``).

**When ticks fall.** ``every`` (seconds, or a ``timedelta``): at the multiples of ``every``
since the Unix epoch, in UTC (``every=300``: at :00, :05, ...), whatever the time zone, so every
worker computes the same ticks without having seen the schedule made. ``cron``: a five-field
expression (minute, hour, day of month, month, day of week; ``cronsim``), read on the wall clock
of ``tz`` (an IANA name). Daylight saving time, as cron daemons do it (``cronsim``'s rules):

* a time the clock skips (spring forward: 02:30 in Europe/Berlin on the last Sunday of March)
  fires once, at the first valid time after the gap (03:00 local);
* a time the clock repeats (fall back: 02:30 on the last Sunday of October) fires once, at its
  first occurrence (02:30 CEST), when neither the minute nor the hour field starts with ``*``;
  an expression whose minute or hour field does (``*/30 * * * *``, ``*/30 2 * * *``) fires in
  both occurrences of the repeated hour, as cron's own rule for such fields says.

**Catch-up.** Ticks missed while no worker ran (``catch_up``): the latest missed tick is fired
once if it is within ``CATCH_UP_WINDOW`` (an hour) of now, and every other missed tick is
recorded as missed (never fired late; a tick ``Overlap.BUFFER_ONE`` keeps fires when the
previous task ends, however late that is).

Low in the package: imports only ``validation``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from chongming_redis.validation import check_identifier

#: After downtime, the latest missed tick is still fired if it is at most this old.
CATCH_UP_WINDOW = timedelta(hours=1)
#: The longest ``every`` accepted (a year), and the longest schedule id (its tick ids add 21).
MAX_EVERY = 366 * 86400
MAX_ID_BYTES = 200
#: A cron expression with no tick in this many years (``30 2 30 2 *``: 30 February) is refused.
_CRON_HORIZON_YEARS = 5
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ScheduleError(ValueError):
    """A schedule definition that cannot be used; the message names the field."""


class Overlap(str, Enum):
    """What a tick does while the task of the schedule's previous tick is unfinished."""

    SKIP = "skip"  # recorded as skipped, no task
    ALLOW = "allow"  # fired all the same
    BUFFER_ONE = "buffer_one"  # kept (one at most) and fired when the previous task ends

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Schedule:
    """A periodic task: ``task`` (a task type's name) with ``params`` at each tick of ``cron``
    (read in ``tz``) or of ``every`` (seconds since the epoch, UTC). Exactly one of ``cron``
    and ``every``. ``every`` is kept as an ``int`` of seconds."""

    id: str
    task: str
    params: Any = None
    cron: str | None = None
    every: int | float | timedelta | None = None
    tz: str = "UTC"
    overlap: Overlap = Overlap.SKIP

    def __post_init__(self) -> None:
        _check_id(self.id)
        task = getattr(self.task, "name", self.task)  # a task handle names its type
        _set(self, "task", _field(lambda: check_identifier(task, "task"), "task"))
        if (self.cron is None) == (self.every is None):
            raise ScheduleError("Schedule: give exactly one of cron and every")
        _set(self, "tz", _zone_name(self.tz))
        if self.every is not None:
            _set(self, "every", _every(self.every))
        else:
            _check_cron(self.cron, self.tz)
        try:
            _set(self, "overlap", Overlap(self.overlap))
        except ValueError:
            choices = ", ".join(o.value for o in Overlap)
            raise ScheduleError(f"Schedule.overlap must be one of {choices}") from None

    @property
    def interval(self) -> int:
        """``every`` in seconds (an ``every`` schedule's; checked into an ``int``)."""
        if not isinstance(self.every, int):
            raise TypeError(f"schedule {self.id!r} is a cron schedule: it has no interval")
        return self.every

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (an aware datetime), in UTC."""
        after = _utc(after)
        if self.every is not None:
            every = self.interval
            seconds = math.floor((after - _EPOCH).total_seconds())
            return _EPOCH + timedelta(seconds=(seconds // every + 1) * every)
        local = after.astimezone(self.zone)
        # cronsim yields times at or after its start; a tick at exactly `after` is not next.
        for tick in CronSim(str(self.cron), local.replace(microsecond=0)):
            found = tick.astimezone(timezone.utc)
            if found > after:
                return found
        raise ScheduleError(f"Schedule.cron {self.cron!r} has no tick after {after}")

    def ticks(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """The ticks in ``(after, until]``, in order, in UTC."""
        until = _utc(until)
        tick = self.next_tick(after)
        while tick <= until:
            yield tick
            tick = self.next_tick(tick)


def tick_task_id(schedule_id: str, tick: datetime) -> str:
    """The id of the task a tick fires: ``<schedule id>@YYYY-MM-DDTHH:MM:SSZ`` (UTC)."""
    return f"{schedule_id}@{_utc(tick):%Y-%m-%dT%H:%M:%SZ}"


@dataclass(frozen=True)
class CatchUp:
    """What a firing at ``now`` does with the ticks due since ``last``: fire ``fire`` (the
    latest due tick, if within the window), record ``missed`` (the count of the older ones, and
    the first and last of them), and wait for ``next``."""

    fire: datetime | None
    missed: int
    first_missed: datetime | None
    last_missed: datetime | None
    next: datetime


def catch_up(
    schedule: Schedule, last: datetime, now: datetime, window: timedelta = CATCH_UP_WINDOW
) -> CatchUp:
    """The ticks in ``(last, now]``: the latest is fired if ``now - tick <= window``, the
    others (and the latest too, when older than the window) are missed. Bounded work for an
    ``every`` schedule however long the downtime (the missed count is computed, not walked);
    a cron schedule walks its missed ticks."""
    now = _utc(now)
    latest = _latest_tick(schedule, last, now)
    following = schedule.next_tick(now)
    if latest is None:
        return CatchUp(None, 0, None, None, following)
    first = schedule.next_tick(last)
    fire = latest if now - latest <= window else None
    if schedule.every is not None:
        count = int((latest - first).total_seconds()) // schedule.interval + 1
    else:
        count = sum(1 for _ in schedule.ticks(last, latest))
    missed = count - (1 if fire is not None else 0)
    last_missed = None
    if missed:
        last_missed = latest if fire is None else _previous_tick(schedule, first, latest)
    return CatchUp(fire, missed, first if missed else None, last_missed, following)


def _latest_tick(schedule: Schedule, last: datetime, now: datetime) -> datetime | None:
    """The last tick in ``(last, now]``, or ``None``."""
    first = schedule.next_tick(last)
    if first > now:
        return None
    if schedule.every is not None:
        every = schedule.interval
        seconds = math.floor((now - _EPOCH).total_seconds())
        return _EPOCH + timedelta(seconds=seconds // every * every)
    latest = first
    for tick in schedule.ticks(first, now):
        latest = tick
    return latest


def _previous_tick(schedule: Schedule, first: datetime, tick: datetime) -> datetime:
    """The tick before ``tick`` (``first`` <= it < ``tick``)."""
    if schedule.every is not None:
        return tick - timedelta(seconds=schedule.interval)
    previous = first
    for found in schedule.ticks(first, tick - timedelta(microseconds=1)):
        previous = found
    return previous


# -- checks ------------------------------------------------------------------------------------


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _field(check: Any, what: str) -> Any:
    try:
        return check()
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"Schedule.{what}: {exc}") from None


def _check_id(value: object) -> None:
    _field(lambda: check_identifier(value, "id"), "id")
    assert isinstance(value, str)
    if "@" in value:
        raise ScheduleError("Schedule.id may not contain '@' (it separates the id from the tick)")
    if len(value.encode()) > MAX_ID_BYTES:
        raise ScheduleError(f"Schedule.id is longer than {MAX_ID_BYTES} UTF-8 bytes")


def _zone_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ScheduleError("Schedule.tz must be an IANA time zone name such as 'Europe/Berlin'")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"Schedule.tz: unknown time zone {value!r}") from None
    return value


def _every(value: object) -> int:
    if isinstance(value, timedelta):
        seconds: object = value.total_seconds()
    else:
        seconds = value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ScheduleError("Schedule.every must be seconds (int or float) or a timedelta")
    if not math.isfinite(seconds) or seconds < 1 or seconds != int(seconds):
        raise ScheduleError(f"Schedule.every must be a whole number of seconds >= 1, not {value}")
    if seconds > MAX_EVERY:
        raise ScheduleError(f"Schedule.every must be at most {MAX_EVERY} seconds (a year)")
    return int(seconds)


def _check_cron(expression: object, tz: str) -> None:
    if not isinstance(expression, str) or len(expression.split()) != 5:
        raise ScheduleError(
            "Schedule.cron must have five fields (minute hour day month weekday),"
            f" not {expression!r}"
        )
    start = datetime.now(ZoneInfo(tz)).replace(microsecond=0)
    try:
        first = next(CronSim(expression, start))
    except CronSimError as exc:
        raise ScheduleError(f"Schedule.cron {expression!r}: {exc}") from None
    except StopIteration:
        first = None
    if first is None or first.year - start.year > _CRON_HORIZON_YEARS:
        raise ScheduleError(f"Schedule.cron {expression!r} never fires")


def _utc(moment: datetime) -> datetime:
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise TypeError("a tick time must be a timezone-aware datetime")
    return moment.astimezone(timezone.utc)
