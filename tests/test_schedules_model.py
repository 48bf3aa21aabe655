"""Schedule definitions and their ticks (``chongming_redis.schedules``): the checks, intervals
anchored at the epoch, cron on a time zone's wall clock across both DST changes, tick task ids
and the catch-up after downtime."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from chongming_redis.schedules import (
    CATCH_UP_WINDOW,
    Overlap,
    Schedule,
    ScheduleError,
    catch_up,
    tick_task_id,
)

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# -- definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "five fields"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "not a cron at all"}, "cron"),
        ({"cron": None}, "exactly one"),
        ({"every": 60}, "exactly one"),
        ({"tz": "Mars/Olympus"}, "unknown time zone"),
        ({"tz": ""}, "tz"),
        ({"id": "a@b"}, "'@'"),
        ({"id": ""}, "id"),
        ({"id": "x" * 201}, "200"),
        ({"task": ""}, "task"),
        ({"overlap": "sometimes"}, "overlap"),
    ],
)
def test_a_bad_cron_definition_is_refused_naming_the_field(changes: dict, says: str) -> None:
    fields = {"id": "nightly", "task": "report", "cron": "30 2 * * *", **changes}
    with pytest.raises(ScheduleError, match=says):
        Schedule(**fields)


@pytest.mark.parametrize("every", [0, -1, 0.5, 1.5, float("nan"), float("inf"), True, "60",
                                   timedelta(milliseconds=1500), 366 * 86400 + 1])  # fmt: skip
def test_every_must_be_whole_seconds_from_one_to_a_year(every: object) -> None:
    with pytest.raises(ScheduleError, match="every"):
        Schedule("sync", "pull", every=every)  # type: ignore[arg-type]


def test_a_valid_definition_is_kept_normalised() -> None:
    schedule = Schedule("sync", "pull", every=timedelta(minutes=5), overlap="allow")  # type: ignore[arg-type]
    assert schedule.every == 300 and type(schedule.every) is int
    assert schedule.overlap is Overlap.ALLOW and schedule.tz == "UTC"
    assert Schedule("sync", "pull", every=2.0).every == 2
    cron = Schedule("nightly", "report", cron="30 2 * * *", tz="Europe/Berlin")
    assert cron.overlap is Overlap.SKIP and cron.every is None


# -- ticks -------------------------------------------------------------------------------------


def test_every_ticks_at_multiples_of_the_interval_since_the_epoch_strictly_after() -> None:
    schedule = Schedule("sync", "pull", every=300)
    assert schedule.next_tick(utc(2026, 5, 1, 12, 3, 7)) == utc(2026, 5, 1, 12, 5)
    assert schedule.next_tick(utc(2026, 5, 1, 12, 5)) == utc(2026, 5, 1, 12, 10), "strictly after"
    berlin = datetime(2026, 5, 1, 14, 3, tzinfo=BERLIN)  # 12:03 UTC: the zone changes nothing
    assert schedule.next_tick(berlin) == utc(2026, 5, 1, 12, 5)
    ticks = list(schedule.ticks(utc(2026, 5, 1, 12, 0), utc(2026, 5, 1, 12, 20)))
    assert ticks == [utc(2026, 5, 1, 12, m) for m in (5, 10, 15, 20)], "(after, until]"
    assert list(schedule.ticks(utc(2026, 5, 1, 12, 0), utc(2026, 5, 1, 12, 4))) == []


def test_a_daily_0230_in_berlin_on_the_spring_forward_day_fires_once_at_0300() -> None:
    schedule = Schedule("nightly", "report", cron="30 2 * * *", tz="Europe/Berlin")
    ticks = list(schedule.ticks(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12)))
    assert ticks == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: 03:00 CEST, the first time after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_a_daily_0230_in_berlin_on_the_fall_back_day_fires_once_at_its_first_occurrence() -> None:
    schedule = Schedule("nightly", "report", cron="30 2 * * *", tz="Europe/Berlin")
    ticks = list(schedule.ticks(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12)))
    assert ticks == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]  # CEST, then CET


def test_a_wildcard_hour_fires_in_both_occurrences_of_the_repeated_hour() -> None:
    schedule = Schedule("often", "report", cron="*/30 * * * *", tz="Europe/Berlin")
    ticks = list(schedule.ticks(utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2, 0)))
    assert ticks == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0),
                     utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2, 0)]  # fmt: skip
    assert len(set(tick_task_id("often", t) for t in ticks)) == 5, "each tick its own task id"


def test_tick_task_ids_name_the_tick_in_utc_to_the_second() -> None:
    tick = datetime(2026, 3, 29, 3, 0, tzinfo=BERLIN)
    assert tick_task_id("nightly", tick) == "nightly@2026-03-29T01:00:00Z"
    with pytest.raises(TypeError):
        tick_task_id("nightly", datetime(2026, 3, 29, 3, 0))
    with pytest.raises(TypeError):
        Schedule("sync", "pull", every=60).next_tick(datetime(2026, 1, 1))


# -- catch-up ----------------------------------------------------------------------------------


def test_nothing_due_fires_nothing_and_misses_nothing() -> None:
    schedule = Schedule("sync", "pull", every=60)
    plan = catch_up(schedule, utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 12, 0, 59))
    assert (plan.fire, plan.missed, plan.first_missed, plan.last_missed) == (None, 0, None, None)
    assert plan.next == utc(2026, 1, 1, 12, 1)


def test_one_due_tick_is_fired_and_none_missed() -> None:
    schedule = Schedule("sync", "pull", every=60)
    plan = catch_up(schedule, utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 12, 1, 3))
    assert (plan.fire, plan.missed) == (utc(2026, 1, 1, 12, 1), 0)
    assert plan.next == utc(2026, 1, 1, 12, 2)


def test_after_downtime_the_latest_tick_is_fired_once_and_the_others_recorded_missed() -> None:
    schedule = Schedule("sync", "pull", every=60)
    plan = catch_up(schedule, utc(2026, 1, 1, 9, 0), utc(2026, 1, 1, 12, 0, 30))
    assert plan.fire == utc(2026, 1, 1, 12, 0)
    assert plan.missed == 179  # 09:01 .. 11:59
    assert (plan.first_missed, plan.last_missed) == (utc(2026, 1, 1, 9, 1), utc(2026, 1, 1, 11, 59))
    assert plan.next == utc(2026, 1, 1, 12, 1)


def test_a_latest_tick_older_than_the_window_is_missed_too() -> None:
    schedule = Schedule("nightly", "report", cron="30 2 * * *")
    plan = catch_up(schedule, utc(2026, 1, 1, 2, 30), utc(2026, 1, 3, 5, 0))
    assert plan.fire is None, "02:30 is 2.5 h before now: outside the default window"
    assert (plan.missed, plan.first_missed, plan.last_missed) == (
        2, utc(2026, 1, 2, 2, 30), utc(2026, 1, 3, 2, 30))  # fmt: skip
    wide = catch_up(schedule, utc(2026, 1, 1, 2, 30), utc(2026, 1, 3, 5, 0), timedelta(hours=3))
    assert (wide.fire, wide.missed) == (utc(2026, 1, 3, 2, 30), 1)
    assert timedelta(hours=1) == CATCH_UP_WINDOW, "the documented default"


def test_a_year_of_downtime_of_a_one_second_schedule_is_counted_not_walked() -> None:
    schedule = Schedule("tick", "pull", every=1)
    plan = catch_up(schedule, utc(2025, 1, 1), utc(2026, 1, 1))  # a walk: 31 million ticks
    assert plan.fire == utc(2026, 1, 1) and plan.missed == 365 * 86400 - 1
    assert (plan.first_missed, plan.last_missed) == (
        utc(2025, 1, 1, 0, 0, 1),
        utc(2025, 12, 31, 23, 59, 59),
    )
