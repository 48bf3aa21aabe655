"""The limits' stress checkers (``chongming_redis/stress/limit_checks.py``) on hand-made
records: each must trip on the records it exists for and stay quiet on ones a correct store
leaves, in particular a start that landed long after its starter's ``now`` and an attempt
whose killed holder kept its slot until the reconciler wrote ``LOST``. Then two short stress
runs: a clean one that fills the limits and breaks none, and the negative control
``ignore-limits`` (workers that never record the definitions, so no start is limited), which
``limit_overruns`` and ``rate_overruns`` must catch."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from chongming_redis.limits import Concurrency, RateLimit, to_json
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress import limit_checks
from chongming_redis.stress.limit_checks import Definitions

# The hand-made snapshots the other checkers' tests use (stress/test_stress.py).
from stress.test_stress import T0, L, P, R, S, _run_stress, _snap

PAUSED = TaskStatus.PAUSED
REF = "job.concurrency=acme"
DEFS = Definitions.parse({"job.concurrency": to_json(Concurrency(2, per="key")),
                          "pay": to_json(RateLimit(1, per=1.0, burst=2))})  # fmt: skip
EPOCH = T0.timestamp()


def _at(task: str, version: int, frm: TaskStatus | None, to: TaskStatus, seconds: float,
        reason: str = "") -> Transition:  # fmt: skip
    return Transition(task, version, frm, to, T0 + timedelta(seconds=seconds), reason or None)


def _ran(task: str, start: float, end: float | None, to: TaskStatus = S) -> list[Transition]:
    history = [_at(task, 1, None, P, 0, "submitted by d"),
               _at(task, 2, P, R, start, "started by w1 (attempt 1)")]  # fmt: skip
    return history if end is None else [*history, _at(task, 3, R, to, end)]


def _limited(task: str, *refs: str, status: TaskStatus = S) -> TaskSnapshot:
    return replace(_snap(task, 3, status), limits=refs or (REF,))


def _began(**times: float) -> dict[tuple[str, int, str], float]:
    """``task=seconds``: attempt 1 of each began at ``T0 + seconds``."""
    return {(task, 1, "w1"): EPOCH + at for task, at in times.items()}


def _overruns(histories: dict[str, list[Transition]], began: dict[tuple[str, int, str], float],
              finals: dict[str, TaskSnapshot] | None = None) -> list[str]:  # fmt: skip
    finals = finals or {t: _limited(t) for t in histories}
    result = limit_checks.check_concurrency(histories, finals, began, DEFS)
    return [v.kind for v in result.violations]


def test_three_attempts_of_one_ref_holding_at_once_are_caught_and_two_are_not() -> None:
    two = {"a": _ran("a", 1, 5), "b": _ran("b", 1, 5)}
    began = _began(a=1.01, b=1.02, c=2.01)
    assert _overruns(two, began) == []
    three = {**two, "c": _ran("c", 2, 4)}
    result = limit_checks.check_concurrency(three, {t: _limited(t) for t in three}, began, DEFS)
    (found,) = result.violations
    assert found.kind == "limit_overruns" and found.task_id == "c"
    assert f"3 tasks of {REF} held a slot at once with max 2" in found.detail
    assert result.peaks == {"job.concurrency": 3}
    # the same three under different keys: one each
    keyed = {t: _limited(t, f"job.concurrency={t}") for t in three}
    assert _overruns(three, began, keyed) == []
    # a ref of a limit the app does not declare (or a rate ref) is not judged here
    other = {t: _limited(t, "other.concurrency=acme") for t in three}
    assert _overruns(three, began, other) == []


def test_a_slot_freed_and_taken_is_not_counted_twice_within_the_clocks_tolerance() -> None:
    # "b" ended at 3.2 by its writer's clock, "c" began at 3.0 by the server's: the end may
    # have landed as late as 3.2 + (the clocks' 0.5 s), so only its end minus 0.5 s counts
    handover = {"a": _ran("a", 1, 9), "b": _ran("b", 1, 3.2), "c": _ran("c", 2.9, 6)}
    assert _overruns(handover, _began(a=1.01, b=1.02, c=3.0)) == []
    late = _ran("c", 2.0, 6)
    assert _overruns({**handover, "c": late}, _began(a=1.01, b=1.02, c=2.6)) == ["limit_overruns"]


def test_a_start_that_landed_after_its_starters_now_is_judged_from_its_function_begin() -> None:
    """The starter of "c" read now=2 and was stopped before its call landed; "b" ended at 4
    and freed the slot, then "c" landed and began at 4.8. By the start entries three held
    the slot from 2 to 4; by what the records prove, never more than two."""
    stalled = {"a": _ran("a", 1, 9), "b": _ran("b", 1, 4), "c": _ran("c", 2, 7)}
    assert _overruns(stalled, _began(a=1.01, b=1.02, c=4.8)) == []
    # ... and an attempt whose function never began (killed first) proves nothing
    result = limit_checks.check_concurrency(stalled, {t: _limited(t) for t in stalled},
                                            _began(a=1.01, b=1.02), DEFS)  # fmt: skip
    assert result.violations == [] and result.unjudged == 1


def test_a_killed_holder_keeps_its_slot_until_the_lost_entry_and_a_paused_one_too() -> None:
    # "a"'s worker was killed at 2; the reconciler wrote LOST at 6: its slot was taken till then
    lost = {"a": _ran("a", 1, 6, to=L), "b": _ran("b", 1, 9), "c": _ran("c", 4, 8)}
    assert _overruns(lost, _began(a=1.01, b=1.02, c=4.01)) == ["limit_overruns"]
    after = {**lost, "c": _ran("c", 6.6, 8)}
    assert _overruns(after, _began(a=1.01, b=1.02, c=6.6)) == []
    # a paused attempt holds its slot; one still holding at the end of its history too
    paused = [*_ran("p", 1, None), _at("p", 3, R, PAUSED, 1.5), _at("p", 4, PAUSED, R, 5),
              _at("p", 5, R, S, 7)]  # fmt: skip
    beside = {"p": paused, "b": _ran("b", 1, 9), "c": _ran("c", 3, None)}
    assert _overruns(beside, _began(p=1.01, b=1.02, c=3.01)) == ["limit_overruns"]


def test_an_end_lost_in_a_history_gap_is_left_out() -> None:
    # v3 (the end) missing: the next entry (v4, a retry at 8) is not when the slot was freed
    gap = [*_ran("a", 1, None), _at("a", 4, L, P, 8, "retry 2/3 after lost, in 1.0s")]
    histories = {"a": gap, "b": _ran("b", 1, 9), "c": _ran("c", 3, 7)}
    result = limit_checks.check_concurrency(histories, {t: _limited(t) for t in histories},
                                            _began(a=1.01, b=1.02, c=3.01), DEFS)  # fmt: skip
    assert result.violations == [] and result.unjudged == 1


Records = tuple[
    dict[str, list[Transition]], dict[str, TaskSnapshot | None], dict[tuple[str, int, str], float]
]


def _rated(n: int, spacing: float, lag: float = 0.05) -> Records:
    """``n`` starts of the "pay" ref, ``spacing`` seconds apart from t=10, each function
    beginning ``lag`` after its start."""
    histories: dict[str, list[Transition]] = {}
    began: dict[tuple[str, int, str], float] = {}
    for i in range(n):
        task = f"r{i}"
        histories[task] = _ran(task, 10 + i * spacing, 10 + i * spacing + 0.1)
        began[(task, 1, "w1")] = EPOCH + 10 + i * spacing + lag
    finals: dict[str, TaskSnapshot | None] = {t: _limited(t, "pay") for t in histories}
    return histories, finals, began


def test_more_starts_in_a_window_than_the_bucket_allows_are_caught() -> None:
    # "pay": one a second, a burst of 2
    assert limit_checks.check_rates(*_rated(8, 1.0), DEFS).violations == []
    # 6 starts within a quarter of a second: more than 2 + 1 * (0.3 + 0.5 tolerance) + 1
    result = limit_checks.check_rates(*_rated(6, 0.05), DEFS)
    (found,) = result.violations
    assert found.kind == "rate_overruns" and found.task_id == "pay"
    assert "6 starts within 0.800s" in found.detail
    assert result.rate_peaks["pay"] > 1
    # 3 at once is within the bucket's burst and the boundary's +1; 4 are not
    assert limit_checks.check_rates(*_rated(3, 0.0), DEFS).violations == []
    assert [v.kind for v in limit_checks.check_rates(*_rated(4, 0.0), DEFS).violations] == [
        "rate_overruns"
    ]


def test_a_start_that_landed_after_its_starters_now_does_not_trip_the_rate_check() -> None:
    """A bucket of 3, one a second. One call (now=10) starts 3 and spends the burst; a call
    at 13 finds 3 tokens and spends one; a stalled call that read now=10 lands at 13.5 and
    spends the two left (the bucket's clock never goes back to 10, so they were earned by
    13). Five start entries at 10: the entry times alone would say 5 starts in no time."""
    defs = Definitions.parse({"pay": to_json(RateLimit(1, per=1.0, burst=3))})
    histories: dict[str, list[Transition]] = {}
    began: dict[tuple[str, int, str], float] = {}
    for task, now, landed in [("a", 10, 10), ("b", 10, 10), ("c", 10, 10), ("q", 13, 13),
                              ("d", 10, 13.5), ("e", 10, 13.5)]:  # fmt: skip
        histories[task] = _ran(task, now, landed + 1)
        began[(task, 1, "w1")] = EPOCH + landed + 0.05
    finals = {t: _limited(t, "pay") for t in histories}
    assert limit_checks.check_rates(histories, finals, began, defs).violations == []
    # had "d" and "e" begun at once (landed at 10), 5 starts within 0.55 s: caught
    began.update({("d", 1, "w1"): EPOCH + 10.05, ("e", 1, "w1"): EPOCH + 10.05})
    found = limit_checks.check_rates(histories, finals, began, defs).violations
    assert [v.kind for v in found] == ["rate_overruns"]
    # a start whose function never began proves nothing
    del began[("d", 1, "w1")], began[("e", 1, "w1")]
    result = limit_checks.check_rates(histories, finals, began, defs)
    assert result.violations == [] and result.unjudged == 2


def test_stale_and_missing_holder_entries_are_caught() -> None:
    tasks = {"a": _limited("a", status=S), "b": _limited("b", status=R),
             "c": _limited("c", status=PAUSED), "d": _limited("d", "job.concurrency=zeta",
                                                               status=R)}  # fmt: skip
    assert limit_checks.check_holders({REF: {"b", "c"}, "job.concurrency=zeta": {"d"}}, tasks,
                                      DEFS) == []  # fmt: skip
    found = limit_checks.check_holders({REF: {"a", "b", "c", "gone"}, "job.concurrency=zeta":
                                        {"b", "d"}}, {**tasks, "gone": None}, DEFS)  # fmt: skip
    assert sorted((v.task_id, v.detail.split(" but ")[-1]) for v in found) == [
        ("a", "is succeeded"), ("b", f"names ['{REF}'], not job.concurrency=zeta"),
        ("gone", "is gone"),
    ]  # fmt: skip
    # a RUNNING task its ref's holders miss: a slot no start would count
    (missing,) = limit_checks.check_holders({REF: {"c"}}, {"b": tasks["b"], "c": tasks["c"]},
                                            DEFS)  # fmt: skip
    assert (
        missing.kind == "stale_holders" and missing.task_id == "b" and "missing" in missing.detail
    )


def test_began_records_keep_the_earliest_time_of_a_run() -> None:
    records = [b"a|1|w1|100|500000", "a|1|w1|101|0", "a|2|w1|102|250", "a|2|w2|103|0"]
    began = limit_checks.parse_began(records)
    assert began == {("a", 1, "w1"): 100.5, ("a", 2, "w1"): pytest.approx(102.00025),
                     ("a", 2, "w2"): 103.0}  # fmt: skip


# -- stress runs ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.redis
def test_a_clean_run_fills_the_limits_and_breaks_none(tmp_path: Path) -> None:
    # the unsafe control's run below, with safe workers
    rc, report = _run_stress(tmp_path, "--workers=3", "--concurrency=8", "--tasks=90",
                             "--seconds=12", "--seed=7")  # fmt: skip
    assert report["violations"] == 0, report["violation_examples"]
    assert report["limited_tasks"] >= 24  # three clumps: 15 limited, 12 rated
    # the clump of four of one key ran two by two: two at once, never three
    assert report["limit_peaks"] == {"limited.concurrency": 2}
    assert report["rate_peaks"]["rated.rate"] <= 1
    assert report["limit_overruns"] == report["stale_holders"] == report["rate_overruns"] == 0
    assert report["limit_holders_at_end"] == 0
    assert rc == 0


@pytest.mark.slow
@pytest.mark.redis
def test_unsafe_workers_ignoring_the_limits_are_caught(tmp_path: Path) -> None:
    # slots to spare (3 workers of 8), so nothing but the limits would hold a clump back
    rc, report = _run_stress(tmp_path, "--workers=3", "--concurrency=8", "--tasks=90",
                             "--seconds=12", "--seed=7", unsafe="ignore-limits")  # fmt: skip
    assert report["unsafe"] == "ignore-limits"
    assert report["limit_overruns"] > 0, report["limit_peaks"]
    assert report["limit_peaks"]["limited.concurrency"] > 2
    assert report["rate_overruns"] > 0, report["rate_peaks"]
    assert report["violations"] > 0
    assert rc != 0
