"""The start path's stress checkers (``chongming_redis/stress/start_checks.py``) on hand-made
histories: each must trip on the history it exists for and stay quiet on a clean one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from chongming_redis.model import TaskStatus, Transition
from chongming_redis.stress import start_checks

# The hand-made histories and snapshots the other checkers' tests use (stress/test_stress.py).
from stress.test_stress import T0, L, P, R, S, _clean, _snap


def _at(task: str, version: int, frm: TaskStatus | None, to: TaskStatus, seconds: float,
        reason: str = "") -> Transition:  # fmt: skip
    return Transition(task, version, frm, to, T0 + timedelta(seconds=seconds), reason or None)


def test_a_start_before_not_before_is_caught_and_one_after_it_is_not() -> None:
    # "a": the retry said "in 1.0s" at t=4, so due at t=5; the start at t=5 is in time.
    histories = {"a": _clean()}
    assert start_checks.check_not_before(histories, {"a": _snap("a", 6, S)}) == []
    early = [*_clean()[:4], _at("a", 5, P, R, 4.4, "started by w2 (attempt 2)")]
    (found,) = start_checks.check_not_before({"a": early}, {"a": _snap("a", 5, R)})
    assert found.kind == "early_starts" and found.task_id == "a" and "0.600s early" in found.detail
    # within the clocks' tolerance (0.5 s: two workers' estimates of the server's TIME)
    slack = [*_clean()[:4], _at("a", 5, P, R, 4.6, "started by w2 (attempt 2)")]
    assert start_checks.check_not_before({"a": slack}, {"a": _snap("a", 5, R)}) == []
    # A submitted delay: the final snapshot's not_before, for a task started once.
    delayed = [_at("d", 1, None, P, 0, "submitted by d"),
               _at("d", 2, P, R, 2, "started by w1 (attempt 1)")]  # fmt: skip
    due_later = replace(_snap("d", 2, R), not_before=T0 + timedelta(seconds=2.6))
    due_within = replace(_snap("d", 2, R), not_before=T0 + timedelta(seconds=2.4))
    assert [v.kind for v in start_checks.check_not_before({"d": delayed}, {"d": due_later})] == [
        "early_starts"
    ]
    assert start_checks.check_not_before({"d": delayed}, {"d": due_within}) == []


def _ran(task: str, owner: str, start: float, end: float, to: TaskStatus = S) -> list[Transition]:
    return [_at(task, 1, None, P, 0, "submitted by d"),
            _at(task, 2, P, R, start, f"started by {owner} (attempt 1)"),
            _at(task, 3, R, to, end)]  # fmt: skip


def test_more_running_on_a_worker_than_its_slots_is_caught() -> None:
    back_to_back = {"a": _ran("a", "w1", 1, 2), "b": _ran("b", "w1", 2, 3),
                    "c": _ran("c", "w1", 1.5, 2.5)}  # fmt: skip
    assert start_checks.check_slots(back_to_back, slots=2) == []  # a slot reused as it frees
    overlapping = {**back_to_back, "d": _ran("d", "w1", 1.2, 1.8)}
    (found,) = start_checks.check_slots(overlapping, slots=2)
    assert found.kind == "slots_exceeded" and "w1 had 3 tasks RUNNING with 2 slots" in found.detail
    other_owner = {**back_to_back, "d": _ran("d", "w2", 1.2, 1.8)}
    assert start_checks.check_slots(other_owner, slots=2) == []
    # A task ended LOST by a reconciler was not let go by its holder: not counted.
    lost = {**back_to_back, "d": _ran("d", "w1", 1.2, 1.8, to=L)}
    assert start_checks.check_slots(lost, slots=2) == []
    # A paused task keeps its slot until it leaves RUNNING/PAUSED.
    paused = [_at("p", 1, None, P, 0), _at("p", 2, P, R, 1, "started by w1 (attempt 1)"),
              _at("p", 3, R, TaskStatus.PAUSED, 1.1), _at("p", 4, TaskStatus.PAUSED, R, 2.6),
              _at("p", 5, R, S, 2.9)]  # fmt: skip
    assert [v.kind for v in start_checks.check_slots({**back_to_back, "p": paused}, 2)] == [
        "slots_exceeded"
    ]


def test_a_due_task_waiting_while_a_worker_had_a_free_slot_is_caught() -> None:
    # "x" due at 0 (submitted), started at 5 by w2; w1 started "y" at 3 and held only it.
    x = _ran("x", "w2", 5, 6)
    y = [_at("y", 1, None, P, 2.9, "submitted by d"),
         _at("y", 2, P, R, 3, "started by w1 (attempt 1)"), _at("y", 3, R, S, 3.5)]  # fmt: skip
    finals = {"x": _snap("x", 3, S), "y": _snap("y", 3, S)}
    (found,) = start_checks.check_work_conservation({"x": x, "y": y}, finals, 2, interval=1.0)
    assert found.kind == "idle_slot_waits" and found.task_id == "x" and "w1" in found.detail
    # w1 full after its start (two slots held): nobody could have taken "x"
    z = [_at("z", 1, None, P, 0), _at("z", 2, P, R, 1.0, "started by w1 (attempt 1)"),
         _at("z", 3, R, S, 9)]  # fmt: skip
    full = {"x": x, "y": y, "z": z}
    assert start_checks.check_work_conservation(full, finals, 2, interval=1.0) == []
    # a wait within one start interval, or one that saw a fault, is not counted
    early = {"x": _ran("x", "w2", 1.2, 2), "y": y}
    assert start_checks.check_work_conservation(early, finals, 2, interval=1.0) == []
    noisy = start_checks.check_work_conservation({"x": x, "y": y}, finals, 2, interval=1.0,
                                                 quiet=lambda since, until: False)  # fmt: skip
    assert noisy == []


def test_a_submitted_delay_is_not_held_against_a_start_before_a_later_retry() -> None:
    """Started once, then LOST and sent back without a parsable delay (a hand-back): the final
    not_before is the later attempt's, not the start's."""
    history = [_at("h", 1, None, P, 0, "submitted by d"),
               _at("h", 2, P, R, 1, "started by w1 (attempt 1)"),
               _at("h", 3, R, P, 2, "handed back at shutdown")]  # fmt: skip
    final = replace(_snap("h", 3, P), not_before=T0 + timedelta(seconds=9))
    assert start_checks.check_not_before({"h": history}, {"h": final}) == []


def test_a_submitted_delay_is_not_held_against_a_start_before_a_paused_retry() -> None:
    """Started once, paused, its holder lost past its lease: retried *paused* (no PENDING
    entry), with the retry's not_before, then stopped. CI met it as 'v2 started 3.669s early'."""
    pa, lost, stopped = TaskStatus.PAUSED, TaskStatus.LOST, TaskStatus.STOPPED
    history = [_at("p", 1, None, P, 0, "submitted by d"),
               _at("p", 2, P, R, 1, "started by w1 (attempt 1)"),
               _at("p", 3, R, pa, 2, "paused"),
               _at("p", 4, pa, lost, 6, "lease of w1 expired"),
               _at("p", 5, lost, pa, 6, "retry 2/3 after lease of w1 expired, in 2.000s"),
               _at("p", 6, pa, stopped, 7, "stopped")]  # fmt: skip
    final = replace(_snap("p", 6, stopped), not_before=T0 + timedelta(seconds=8))
    assert start_checks.check_not_before({"p": history}, {"p": final}) == []
    # ... while a submitted delay the one start came early for is still caught.
    early = [history[0], history[1], _at("p", 3, R, S, 2, "succeeded")]
    final = replace(_snap("p", 3, S), not_before=T0 + timedelta(seconds=3))
    assert [v.kind for v in start_checks.check_not_before({"p": early}, {"p": final})] == [
        "early_starts"
    ]


def test_quiet_windows_cover_the_harness_faults_and_those_done_beside_it() -> None:
    from chongming_redis.stress.plumbing import quiet_between

    wall0 = 1000.0
    # a harness fault from t=2 to t=3 (lease 1: loud until 3 + 2 + 6 = 11), and a reshard a
    # test did beside the run from 1020 to 1025 (loud from 1019 to 1033)
    quiet = quiet_between([{"at": 2.0, "t": 3.0}], wall0, 1.0, [(1020.0, 1025.0)])
    assert not quiet(1000.0, 1001.5) and not quiet(1010.0, 1010.5)
    assert quiet(1011.5, 1018.5)  # between the two
    assert not quiet(1018.5, 1019.5) and not quiet(1030.0, 1031.0)
    assert quiet(1033.5, 1040.0)
    # one still going (its end unknown yet) is loud from its start on
    still = quiet_between([], wall0, 1.0, [(1020.0, float("inf"))])
    assert still(1000.0, 1018.0) and not still(1100.0, 1200.0)
    assert quiet_between([], wall0, 1.0)(0.0, 1e12)  # no fault: always quiet
