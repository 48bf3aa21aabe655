"""The start path's stress checkers (``chongming_redis/stress/start_checks.py``) on hand-made
histories: each must trip on the history it exists for and stay quiet on a clean one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
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


def _queued(task: str, submitted: float, owner: str, start: float,
            priority: int = 0) -> tuple[list[Transition], TaskSnapshot]:  # fmt: skip
    """A task submitted at ``submitted`` (its created_at) and started by ``owner`` at
    ``start``, in bucket 3, still RUNNING."""
    history = [_at(task, 1, None, P, submitted, "submitted by d"),
               _at(task, 2, P, R, start, f"started by {owner} (attempt 1)")]  # fmt: skip
    final = replace(_snap(task, 2, R), created_at=T0 + timedelta(seconds=submitted),
                    priority=priority, bucket=3)  # fmt: skip
    return history, final


def _order(*tasks: tuple[str, tuple[list[Transition], TaskSnapshot]]) -> list[str]:
    histories = {name: h for name, (h, _) in tasks}
    finals: dict[str, TaskSnapshot | None] = {name: f for name, (_, f) in tasks}
    return [v.detail for v in start_checks.check_start_order(histories, finals)]


def test_a_task_passed_over_in_its_workers_bucket_is_caught() -> None:
    # Higher priority first: "hi" (priority 5) was due at 1, "lo" (0) started at 3, "hi" at 6.
    (found,) = _order(("hi", _queued("hi", 1, "w1", 6, priority=5)),
                      ("lo", _queued("lo", 2, "w1", 3)))  # fmt: skip
    t0 = T0.timestamp()
    assert found == (f"priority 5, due since {t0 + 1:.3f}, started by w1 at {t0 + 6:.3f}; lo "
                     f"(priority 0) of bucket 3 was started before it at {t0 + 3:.3f}")  # fmt: skip
    # In order: "hi" first, then "lo".
    assert _order(("hi", _queued("hi", 1, "w1", 3, priority=5)),
                  ("lo", _queued("lo", 2, "w1", 6))) == []  # fmt: skip
    # FIFO among equals: the older one waited while a newer one started.
    older, newer = _queued("old", 1, "w1", 6), _queued("new", 2.5, "w1", 3)
    assert len(_order(("old", older), ("new", newer))) == 1
    # ... but ready times within the tolerance (1 s) are not told apart.
    assert _order(("old", _queued("old", 1.8, "w1", 6)), ("new", newer)) == []
    # A fault between the one's due time and the other's start: not judged (a call that
    # waited for a restarting server lands after its entry's time).
    histories = {"old": older[0], "new": newer[0]}
    finals: dict[str, TaskSnapshot | None] = {"old": older[1], "new": newer[1]}
    t0 = T0.timestamp()
    faulted = start_checks.check_start_order(
        histories, finals, quiet=lambda a, b: b < t0 + 2 or a > t0 + 2.5
    )
    assert faulted == []


def test_the_start_order_is_judged_within_one_workers_bucket_only() -> None:
    hi = _queued("hi", 1, "w1", 6, priority=5)
    lo_elsewhere = _queued("lo", 2, "w2", 3)  # another worker: approximate across workers
    assert _order(("hi", hi), ("lo", lo_elsewhere)) == []
    history, final = _queued("lo", 2, "w1", 3)  # the same worker, another bucket
    assert _order(("hi", hi), ("lo", (history, replace(final, bucket=4)))) == []
    # Not yet due when the other started: no violation.
    assert _order(("hi", _queued("hi", 2.8, "w1", 6, priority=5)),
                  ("lo", _queued("lo", 1, "w1", 3))) == []  # fmt: skip
    # Started in the same call (within the tolerance): no order between them.
    assert _order(("hi", _queued("hi", 1, "w1", 3.3, priority=5)),
                  ("lo", _queued("lo", 2, "w1", 3))) == []  # fmt: skip
    # A task with limits may be held back by its limit: not judged as the one that waited.
    limited = _queued("hi", 1, "w1", 6, priority=5)
    assert _order(("hi", (limited[0], replace(limited[1], limits=("job.concurrency",)))),
                  ("lo", _queued("lo", 2, "w1", 3))) == []  # fmt: skip


def test_a_retry_is_ranked_by_its_not_before() -> None:
    # "r", created at 0, was retried at 1 "in 2.0s": ranked (and due) at 3, not at 0. "n",
    # started at 5 while "r" waited until 8: passed over if "n" was created at 4.5, not 2.5.
    retried = [_at("r", 1, None, P, 0, "submitted by d"),
               _at("r", 2, P, R, 0.5, "started by w1 (attempt 1)"),
               _at("r", 3, R, L, 1, "lease of w1 expired"),
               _at("r", 4, L, P, 1, "retry 2/3 after lost, in 2.0s"),
               _at("r", 5, P, R, 8, "started by w1 (attempt 2)")]  # fmt: skip
    final = replace(_snap("r", 5, R), not_before=T0 + timedelta(seconds=3), bucket=3)
    newer, older = _queued("n", 4.5, "w1", 5), _queued("n", 2.5, "w1", 5)
    assert len(_order(("r", (retried, final)), ("n", newer))) == 1  # ready 3 < 4.5: passed
    assert _order(("r", (retried, final)), ("n", older)) == []  # 2.5 is ahead of 3 (tolerance)
