"""``schedule_state``: what firing a stored schedule at a moment does — each tick decided once
(fired, skipped or missed), never before its time, the overlap rules, pause and resume, the
catch-up after downtime, a trigger, and the stored text round trip."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from chongming_redis.schedule_state import (
    RECENT,
    ScheduleState,
    fire_due,
    from_json,
    is_due,
    new_state,
    paused,
    replaced,
    to_json,
    triggered,
)
from chongming_redis.schedules import Overlap, Schedule

T0 = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def tick(seconds: int) -> datetime:
    return datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc) + timedelta(seconds=seconds)


def every(n: int = 10, overlap: Overlap = Overlap.SKIP) -> ScheduleState:
    return new_state(Schedule("sync", "echo", {"x": 1}, every=n, overlap=overlap), T0)


def outcomes(state: ScheduleState) -> list[tuple[str, datetime, int]]:
    return [(o.outcome, o.tick, o.count) for o in state.recent]


def test_a_new_schedule_waits_for_its_first_tick_and_fires_it_once() -> None:
    state = every()
    assert state.next_tick == tick(10)
    assert fire_due(state, at(9.7), previous_unfinished=False) is None  # not yet: never early
    firing = fire_due(state, tick(10), previous_unfinished=False)
    assert firing is not None
    assert firing.task_id == "sync@2026-03-01T12:00:10Z" and firing.tick == tick(10)
    assert firing.state.next_tick == tick(20) and firing.state.last_task == firing.task_id
    assert firing.state.counts == {"fired": 1, "skipped": 0, "missed": 0, "triggered": 0}
    # The same moment again: nothing left to decide.
    assert fire_due(firing.state, tick(10), previous_unfinished=True) is None
    assert not is_due(firing.state, tick(19))


def test_skip_records_a_tick_whose_previous_task_is_unfinished() -> None:
    first = fire_due(every(), tick(10), previous_unfinished=False)
    assert first is not None
    second = fire_due(first.state, tick(20), previous_unfinished=True)
    assert second is not None and second.task_id is None
    assert outcomes(second.state)[-1] == ("skipped", tick(20), 1)
    assert second.state.last_task == first.task_id  # the unfinished one is still the last
    third = fire_due(second.state, tick(30), previous_unfinished=False)
    assert third is not None and third.task_id == "sync@2026-03-01T12:00:30Z"
    assert third.state.counts == {"fired": 2, "skipped": 1, "missed": 0, "triggered": 0}


def test_allow_fires_over_an_unfinished_previous_task() -> None:
    first = fire_due(every(overlap=Overlap.ALLOW), tick(10), previous_unfinished=False)
    assert first is not None
    second = fire_due(first.state, tick(20), previous_unfinished=True)
    assert second is not None and second.task_id == "sync@2026-03-01T12:00:20Z"


def test_buffer_one_keeps_one_tick_and_fires_it_when_the_previous_ends() -> None:
    first = fire_due(every(overlap=Overlap.BUFFER_ONE), tick(10), previous_unfinished=False)
    assert first is not None
    kept = fire_due(first.state, tick(20), previous_unfinished=True)
    assert kept is not None and kept.task_id is None and kept.state.buffered == tick(20)
    full = fire_due(kept.state, tick(30), previous_unfinished=True)  # one at most: skipped
    assert full is not None and full.state.buffered == tick(20)
    assert outcomes(full.state)[-1] == ("skipped", tick(30), 1)
    assert is_due(full.state, at(31))  # the kept tick waits for the previous task
    assert fire_due(full.state, at(31), previous_unfinished=True) is None
    late = fire_due(full.state, at(33), previous_unfinished=False)
    assert late is not None and late.task_id == "sync@2026-03-01T12:00:20Z"
    assert late.state.buffered is None and late.state.next_tick == tick(40)
    assert late.state.counts == {"fired": 2, "skipped": 1, "missed": 0, "triggered": 0}
    # The kept tick fires and a new one is due at once: the new one is kept in its place.
    again = fire_due(replace(full.state, next_tick=tick(40)), tick(40), previous_unfinished=False)
    assert again is not None and again.tick == tick(20) and again.state.buffered == tick(40)


def test_after_downtime_the_latest_tick_fires_and_the_others_are_missed() -> None:
    state = every()
    firing = fire_due(state, at(65), previous_unfinished=False)  # ticks 10..60 passed
    assert firing is not None and firing.tick == tick(60)
    assert outcomes(firing.state) == [("missed", tick(10), 5), ("fired", tick(60), 1)]
    assert firing.state.recent[0].last == tick(50)
    assert firing.state.next_tick == tick(70)
    assert firing.state.counts == {"fired": 1, "skipped": 0, "missed": 5, "triggered": 0}


def test_after_more_than_the_window_every_tick_is_missed() -> None:
    firing = fire_due(every(3 * 3600), at(5 * 3600 + 5), previous_unfinished=False)
    assert firing is not None and firing.task_id is None  # 15:00 is two hours old at 17:00
    (missed,) = firing.state.recent
    assert (missed.outcome, missed.tick, missed.count, missed.last) == (
        "missed", tick(3 * 3600), 1, tick(3 * 3600))  # fmt: skip
    assert firing.state.next_tick == tick(6 * 3600)
    many = fire_due(every(60), at(2 * 3600 + 30), previous_unfinished=False)
    assert many is not None and many.tick == tick(7200)  # the latest is 30 s old: fired
    assert outcomes(many.state) == [("missed", tick(60), 119), ("fired", tick(7200), 1)]


def test_a_paused_schedule_fires_nothing_and_resumes_from_the_next_tick() -> None:
    state = paused(every(), True, at(1))
    assert (
        not is_due(state, at(500)) and fire_due(state, at(500), previous_unfinished=False) is None
    )
    resumed = paused(state, False, at(500))
    assert resumed.next_tick == tick(510)  # the paused ticks are neither fired nor missed
    firing = fire_due(resumed, tick(510), previous_unfinished=False)
    assert firing is not None and outcomes(firing.state) == [("fired", tick(510), 1)]
    assert paused(resumed, False, at(600)).next_tick == tick(510)  # resume twice: no change


def test_a_trigger_fires_now_with_an_id_of_its_own_and_keeps_the_ticks() -> None:
    state = paused(every(), True, at(1))
    firing = triggered(state, at(3.5))
    assert firing.task_id == "sync@2026-03-01T12:00:03Z.750000.trigger"
    assert firing.state.next_tick == state.next_tick and firing.state.paused
    assert firing.state.counts["triggered"] == 1 and firing.state.last_task == firing.task_id


def test_a_changed_timing_starts_again_and_the_rest_is_kept() -> None:
    fired = fire_due(every(), tick(10), previous_unfinished=False)
    assert fired is not None
    same_timing = replaced(fired.state, Schedule("sync", "echo", {"x": 2}, every=10), at(12))
    assert same_timing.next_tick == tick(20) and same_timing.counts == fired.state.counts
    new_timing = replaced(fired.state, Schedule("sync", "echo", every=60), at(12))
    assert new_timing.next_tick == tick(60) and new_timing.last_task == fired.state.last_task
    assert (same_timing.first_tick, new_timing.first_tick) == (tick(10), tick(60))


def test_recent_keeps_the_newest_and_the_counts_count_all() -> None:
    state = every(1)
    for n in range(1, RECENT + 6):
        firing = fire_due(state, tick(n), previous_unfinished=False)
        assert firing is not None
        state = firing.state
    assert len(state.recent) == RECENT and state.recent[-1].tick == tick(RECENT + 5)
    assert state.counts["fired"] == RECENT + 5


def test_the_stored_text_round_trips_and_a_bad_one_is_a_value_error() -> None:
    cron = new_state(Schedule("nightly", "report", {"a": [1, "ü"]}, cron="30 2 * * *",
                              tz="Europe/Berlin", overlap=Overlap.BUFFER_ONE), T0)  # fmt: skip
    firing = fire_due(every(), at(65), previous_unfinished=False)
    assert firing is not None
    for state in (cron, firing.state, paused(cron, True, at(3)), triggered(cron, at(4)).state):
        assert from_json(to_json(state)) == state
    for bad in ("", "{}", '{"schedule": {"id": "x"}}', to_json(cron).replace("30 2", "99 2")):
        with pytest.raises(ValueError, match="not a schedule state"):
            from_json(bad)


def test_a_kept_tick_is_skipped_when_the_rule_stops_keeping_it() -> None:
    first = fire_due(every(overlap=Overlap.BUFFER_ONE), tick(10), previous_unfinished=False)
    assert first is not None
    kept = fire_due(first.state, tick(20), previous_unfinished=True)
    assert kept is not None and kept.state.buffered == tick(20)
    allow = replaced(kept.state, Schedule("sync", "echo", {"x": 1}, every=10,
                                          overlap=Overlap.ALLOW), at(21))  # fmt: skip
    assert allow.buffered is None and outcomes(allow)[-1] == ("skipped", tick(20), 1)
    assert allow.counts == {"fired": 1, "skipped": 1, "missed": 0, "triggered": 0}
    still = replaced(kept.state, Schedule("sync", "echo", {"x": 2}, every=10,
                                          overlap=Overlap.BUFFER_ONE), at(21))  # fmt: skip
    assert still.buffered == tick(20)  # the same rule keeps it
