"""The task policies' stress checkers (``chongming_redis/stress/policy_checks.py``, issue 25)
on hand-made histories: each must trip on the history it exists for and stay quiet on a clean
one; plus the feed watch on a real store and the producer's workload share."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.stress import policy_checks as pc
from chongming_redis.stress import start_checks
from chongming_redis.stress.harness import Options, policy_run
from chongming_redis.stress.policy_report import stall_windows
from chongming_redis.stress.producer import workload
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
E = T0.timestamp()  # seconds since the epoch of T0
P, R, S, F, L = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED,
                 TaskStatus.FAILED, TaskStatus.LOST)  # fmt: skip
PAUSED, STOPPED = TaskStatus.PAUSED, TaskStatus.STOPPED
THREE = RetryPolicy(max_attempts=3, base_delay=0.2, retry_on=(ValueError,))


def _at(task: str, version: int, frm: TaskStatus | None, to: TaskStatus, seconds: float,
        reason: str = "") -> Transition:  # fmt: skip
    return Transition(task, version, frm, to, T0 + timedelta(seconds=seconds), reason or None)


def _history(task: str, *moves: tuple[TaskStatus, float, str]) -> list[Transition]:
    """A history from its creation at 0: each move ``(to, at, reason)`` from the last one."""
    entries = [_at(task, 1, None, P, 0, "submitted by d")]
    for to, at, reason in moves:
        entries.append(_at(task, len(entries) + 1, entries[-1].to_status, to, at, reason))
    return entries


def _snap(task: str, status: TaskStatus, updated: float = 0.0, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id=task, name="step", status=status, status_version=1,
                        created_at=T0, updated_at=T0 + timedelta(seconds=updated),
                        **fields)  # fmt: skip


def _start(n: int, owner: str = "w1") -> str:
    return f"started by {owner} (attempt {n})"


def _retry(n: int, m: int, why: str = "failed (ValueError)") -> str:
    return f"retry {n}/{m} after {why}, in 0.200s"


# -- attempts_exceeded ---------------------------------------------------------------------------


def _three_attempts(task: str, m: int = 3) -> list[Transition]:
    return _history(task, (R, 1, _start(1)), (F, 2, ""), (P, 2, _retry(2, m)),
                    (R, 3, _start(2)), (L, 4, "lease of w1 expired"), (P, 4, _retry(3, m, "lost")),
                    (R, 5, _start(3)), (F, 6, ""))  # fmt: skip


def test_attempts_within_the_frozen_policy_pass_and_one_more_start_is_caught() -> None:
    histories = {"a": _three_attempts("a")}
    assert pc.check_attempts(histories, {"a": THREE}, default_max_attempts=3) == []
    # A fourth start: a worker retried past the task's own policy.
    four = {"a": [*_three_attempts("a"), _at("a", 10, F, P, 6, _retry(4, 3)),
                  _at("a", 11, P, R, 7, _start(4))]}  # fmt: skip
    found = pc.check_attempts(four, {"a": THREE}, default_max_attempts=3)
    assert [v.kind for v in found] == ["attempts_exceeded"] * 3
    assert "4 starts (0 handed back) with max_attempts 3" in found[0].detail
    assert found[1].detail == "v11 'started by w1 (attempt 4)': max_attempts 3"
    assert "'retry 4/3" in found[2].detail
    # Without a policy of its own the workers' default applies: 2 allows only two starts.
    assert [v.kind for v in pc.check_attempts(histories, {"a": None}, 2)][:1] == [
        "attempts_exceeded"
    ]
    assert pc.check_attempts(histories, {"a": None}, 3) == []
    # A task nobody knows the policy of is not judged.
    assert pc.check_attempts(four, {}, 3) == []


def test_a_retry_under_another_policy_is_caught_and_hand_backs_are_not_attempts() -> None:
    # Retried as if it allowed 5 (a worker applying its own policy, not the frozen one).
    found = pc.check_attempts({"a": _three_attempts("a", m=5)}, {"a": THREE}, 3)
    assert [v.kind for v in found] == ["attempts_exceeded"] * 2
    assert all("allows 3 attempts" in v.detail for v in found)
    # Handed back at a graceful shutdown: the same attempt runs again, not counted.
    handed = _history("h", (R, 1, _start(1)), (P, 2, "handed back at shutdown"),
                      (R, 3, _start(1)), (F, 4, ""), (P, 4, _retry(2, 3)),
                      (R, 5, _start(2)), (F, 6, ""), (P, 6, _retry(3, 3)),
                      (R, 7, _start(3)), (S, 8, ""))  # fmt: skip
    assert pc.check_attempts({"h": handed}, {"h": THREE}, 3) == []
    # A hand-back that used up an attempt number (counted two ways): "attempt 4" of 3.
    numbered = _history("n", (R, 1, _start(1)), (P, 2, "handed back at shutdown"),
                        (R, 3, _start(2)), (F, 4, ""), (P, 4, _retry(3, 3)),
                        (R, 5, _start(3)), (F, 6, ""), (P, 6, _retry(4, 3)),
                        (R, 7, _start(4)), (S, 8, ""))  # fmt: skip
    found = pc.check_attempts({"n": numbered}, {"n": THREE}, 3)
    assert [v.detail for v in found] == [
        "v10 'started by w1 (attempt 4)': max_attempts 3",
        "v9 'retry 4/3 after failed (ValueError), in 0.200s': its own policy allows 3 attempts",
    ]  # four starts, one handed back, are within 3; the numbers past them are not
    # A retry by hand allows one more attempt number.
    by_hand = _history("b", (R, 1, _start(1)), (F, 2, ""), (P, 3, "retry 2 by cli"),
                       (R, 4, _start(2)), (S, 5, ""))  # fmt: skip
    assert pc.check_attempts({"b": by_hand}, {"b": RetryPolicy(max_attempts=1)}, 3) == []
    assert pc.retries_by_cause({"a": _three_attempts("a")}) == {"failed (ValueError)": 1,
                                                                 "lost": 1}  # fmt: skip


# -- timeout_overrun -----------------------------------------------------------------------------


def test_an_attempt_held_past_timeout_plus_the_slack_is_caught() -> None:
    # timeout 1 s, slack 5 s: held at most 6 s (+ the clocks' tolerance).
    ok = _history("a", (R, 1, _start(1)), (F, 6.9, "timed out: ..."), (P, 6.9, _retry(2, 2)),
                  (R, 7, _start(2)), (PAUSED, 8, ""), (R, 9, ""), (S, 10, ""))  # fmt: skip
    assert pc.check_timeouts({"a": ok}, {"a": 1.0}, slack=5.0) == []
    # A pause does not stop the clock: RUNNING 1 s, PAUSED 6 s, RUNNING again.
    paused = _history("b", (R, 1, _start(1)), (PAUSED, 2, ""), (R, 8, ""), (S, 8.1, ""))
    (found,) = pc.check_timeouts({"b": paused}, {"b": 1.0}, slack=5.0)
    assert (
        found.kind == "timeout_overrun" and "attempt 1 held 7.10s until succeeded" in found.detail
    )
    # A task without a timeout is never judged; one never ended counts until the workers stopped.
    assert pc.check_timeouts({"b": paused}, {"b": None}, slack=5.0) == []
    stuck = _history("c", (R, 1, _start(1)))
    assert pc.check_timeouts({"c": stuck}, {"c": 1.0}, 5.0) == []
    (found,) = pc.check_timeouts({"c": stuck}, {"c": 1.0}, 5.0, until=E + 9)
    assert "held 8.00s and was never ended" in found.detail
    assert pc.check_timeouts({"c": stuck}, {"c": 1.0}, 5.0, until=E + 7.05) == []  # tolerance
    # A stall of the store's writers (SQLite: a worker stopped inside a write holds the one
    # write lock) lengthens the bound by the part of the attempt it overlaps, and only that.
    stalls = [(E + 3, E + 5), (E + 20, E + 30)]
    assert pc.check_timeouts({"b": paused}, {"b": 1.0}, slack=5.0, stalls=stalls) == []
    (found,) = pc.check_timeouts({"b": paused}, {"b": 1.0}, slack=5.0, stalls=[(E + 7.9, E + 30)])
    assert "+ 0.20s stalled" in found.detail  # 8.0 to 8.1 of it: not enough
    records = [
        {"op": "fault", "kind": "lease_holder_pause", "at": 3.0, "t": 9.0},
        {"op": "fault", "kind": "worker_kill", "at": 9.0, "t": 9.1},
        {"op": "submit"},
    ]
    assert stall_windows(records, 100.0) == [(103.0, 109.0)]


def test_the_slack_is_grace_plus_one_reconcile_plus_one_lease_of_the_harness_workers() -> None:
    run = policy_run(Options(task_lease=2.0))
    assert (run.timeout_grace, run.reconcile_interval, run.task_lease) == (2.0, 1.0, 2.0)
    assert run.timeout_slack == 5.0 and run.default_max_attempts == 3
    assert policy_run(Options(task_lease=30.0)).reconcile_interval == 5.0
    # the silent attempts of the stress app sleep past it: a worker not enforcing is caught
    from chongming_redis.stress.app import SILENT_SECONDS, SLOW_TIMEOUT

    assert SLOW_TIMEOUT + run.timeout_slack + pc.CLOCKS < SILENT_SECONDS


def test_a_slot_held_by_a_timed_out_thread_is_not_a_free_slot() -> None:
    """Work conservation: an attempt its worker ended for running past its timeout keeps its
    thread (and slot) after the end entry, so it counts as held to the end."""
    x = [_at("x", 1, None, P, 0, "submitted by d"), _at("x", 2, P, R, 5, _start(1, "w2")),
         _at("x", 3, R, S, 6)]  # fmt: skip
    y = [_at("y", 1, None, P, 2.9, "submitted by d"), _at("y", 2, P, R, 3, _start(1)),
         _at("y", 3, R, S, 3.5)]  # fmt: skip
    z = [_at("z", 1, None, P, 0), _at("z", 2, P, R, 1.0, _start(1)),
         _at("z", 3, R, F, 2, "timed out: still running past its timeout and grace")]  # fmt: skip
    finals = {t: _snap(t, S) for t in "xyz"}
    found = start_checks.check_work_conservation({"x": x, "y": y, "z": z}, finals, 2, 1.0)
    assert found == []  # w1: y and z's thread held both slots
    z_checkpointed = [*z[:2], _at("z", 3, R, F, 2)]
    found = start_checks.check_work_conservation({"x": x, "y": y, "z": z_checkpointed}, finals,
                                                 2, 1.0)  # fmt: skip
    assert [v.kind for v in found] == ["idle_slot_waits"]


# -- removed_early -------------------------------------------------------------------------------


def test_a_removal_before_finish_plus_retention_is_caught_by_stamp_or_by_sight() -> None:
    final = _snap("a", S, updated=10.0, retention=3.0)  # expires at 13
    on_time = pc.removal_of("a", removed_at=E + 13.2, seen_by=E + 13.5, last=final)
    assert on_time.expires == E + 13 and on_time.final
    assert pc.check_removals([on_time]) == []
    stamped_early = pc.removal_of("a", removed_at=E + 11.0, seen_by=E + 13.5, last=final)
    (found,) = pc.check_removals([stamped_early])
    assert found.kind == "removed_early" and "removed 2.00s before its expiry" in found.detail
    # A remover whose clock ran ahead stamps a late time; the watch saw it gone earlier.
    seen_early = pc.removal_of("a", removed_at=E + 70.0, seen_by=E + 11.5, last=final)
    assert [v.kind for v in pc.check_removals([seen_early])] == ["removed_early"]
    # Only an unfinished snapshot seen: its updated_at + retention is a lower bound.
    running = _snap("b", R, updated=10.0, retention=3.0)
    early = pc.removal_of("b", removed_at=E + 12.0, seen_by=None, last=running)
    (found,) = pc.check_removals([early])
    assert not early.final and "the earliest expiry it could have" in found.detail
    assert pc.check_removals([pc.removal_of("b", E + 13.5, None, running)]) == []
    # Never seen: not judged; within the tolerance: not reported.
    assert pc.check_removals([pc.removal_of("c", E, None, None)]) == []
    assert pc.check_removals([pc.removal_of("a", E + 12.95, None, final)]) == []
    assert pc.expiry_lag([on_time, early]) == pytest.approx(0.2)


# -- unique_duplicates ---------------------------------------------------------------------------


def test_unfinished_intervals_join_an_end_and_its_retry() -> None:
    history = _history("a", (R, 1, _start(1)), (L, 2, "lease expired"), (P, 2, _retry(2, 3)),
                       (R, 3, _start(2)), (S, 4, ""))  # fmt: skip
    assert pc.unfinished_intervals(history) == [(E, E + 4)]
    assert pc.unfinished_intervals(_history("b", (R, 1, _start(1)))) == [(E, math.inf)]
    by_hand = [*history, _at("a", 7, S, P, 9, "retry 3 by d"), _at("a", 8, P, STOPPED, 10)]
    assert pc.unfinished_intervals(by_hand) == [(E, E + 4), (E + 9, E + 10)]


def _unique_task(task: str, created: float, finished: float | None) -> list[Transition]:
    entries = [_at(task, 1, None, P, created, "submitted by d"),
               _at(task, 2, P, R, created + 0.2, _start(1))]  # fmt: skip
    if finished is not None:
        entries.append(_at(task, 3, R, S, finished))
    return entries


def test_two_unfinished_tasks_of_one_unique_id_are_caught() -> None:
    uniques = {"a": "u1", "b": "u1", "c": "u2"}
    # b created after a finished: fine; c has another unique id.
    histories = {"a": _unique_task("a", 0, 5), "b": _unique_task("b", 5.2, 8),
                 "c": _unique_task("c", 1, None)}  # fmt: skip
    acked = {"a": E + 0.01, "b": E + 5.25, "c": E + 1.01}
    assert pc.check_unique_overlaps(histories, uniques, acked) == []
    # b created at 1 while a (created 0, acknowledged at 0.01) ran until 5.
    histories["b"] = _unique_task("b", 1.0, 8)
    acked["b"] = E + 1.02
    (found,) = pc.check_unique_overlaps(histories, uniques, acked)
    assert found.kind == "unique_duplicates" and found.task_id == "b"
    assert "while a held it" in found.detail
    # ... and one never finished holds it to the end.
    histories["a"] = _unique_task("a", 0, None)
    assert "ended never" in pc.check_unique_overlaps(histories, uniques, acked)[0].detail


def test_what_the_clocks_cannot_order_is_not_reported() -> None:
    uniques = {"a": "u1", "b": "u1"}
    # b's submit was still in flight when a's end was decided (its create may have landed
    # after a's end: a store restarting delays both).
    histories = {"a": _unique_task("a", 0, 5), "b": _unique_task("b", 4.0, 8)}
    assert pc.check_unique_overlaps(histories, uniques, {"a": E + 0.01, "b": E + 5.5}) == []
    # b planned before a's create was acknowledged: their order in the store is unknown.
    histories = {"a": _unique_task("a", 0, 5), "b": _unique_task("b", 0.005, 8)}
    assert pc.check_unique_overlaps(histories, uniques, {"a": E + 0.01, "b": E + 0.02}) == []


# -- unique_orphans ------------------------------------------------------------------------------


def _submit(task: str, returned: str, sent: float, acked: float) -> pc.UniqueSubmit:
    return pc.UniqueSubmit(task, "u1", returned, E + sent, E + acked)


def test_each_unique_submit_created_its_task_or_returned_a_holder_of_that_time() -> None:
    spans = {"a": pc.TaskSpan("u1", E, E + 5.5), "c": pc.TaskSpan("u1", E + 6, None),
             "x": pc.TaskSpan("u9", E, None)}  # fmt: skip
    good = [_submit("a", "a", 0, 0.01), _submit("b", "a", 1, 1.01), _submit("c", "c", 6, 6.01),
            _submit("d", "c", 7, 7.01)]  # fmt: skip
    assert pc.check_unique_submits(good, spans) == []
    bad = [_submit("e", "a", 9, 9.01),  # a had been final since 5.5
           _submit("f", "c", 2, 2.01),  # c did not exist yet
           _submit("g", "x", 1, 1.01),  # x holds another id
           _submit("h", "h", 1, 1.01),  # "created", but no record of h
           _submit("i", "zz", 1, 1.01)]  # fmt: skip
    found = pc.check_unique_submits(bad, spans)
    assert [(v.kind, v.task_id) for v in found] == [("unique_orphans", t) for t in "efghi"]
    assert "final 3.50s before the submit was sent" in found[0].detail
    assert "created 3.99s after the submit returned" in found[1].detail
    assert "which holds 'u9'" in found[2].detail


def test_the_unique_records_at_the_end_name_their_unfinished_holder_or_nothing() -> None:
    finals: dict[str, TaskSnapshot | None] = {
        "a": _snap("a", S, unique="u1"), "b": _snap("b", R, unique="u2"),
        "c": _snap("c", P, unique="u3"), "d": _snap("d", S, unique="u4"), "e": None,
    }  # fmt: skip
    holders = {"u1": None, "u2": "b", "u3": "c", "u4": None}
    assert pc.check_unique_holders(holders, finals) == []
    broken = {"u1": "a",  # names a finished holder
              "u2": None,  # b unfinished, its record gone
              "u3": "b",  # names a task of another id
              "u4": "e"}  # names a removed task  # fmt: skip
    found = pc.check_unique_holders(broken, finals)
    assert [(v.kind, v.task_id) for v in found] == [
        ("unique_orphans", u) for u in ("u1", "u2", "u3", "u4")
    ]
    assert "the record names a, succeeded" in found[0].detail
    assert "no record, but ['b'] unfinished hold it" in found[1].detail
    assert "the record names e, gone" in found[3].detail


def test_unique_submits_are_read_from_the_driver_log() -> None:
    records = [
        {"op": "submit", "id": "t1", "outcome": "ok", "unique": "u1", "returned": "t1",
         "created": True, "sent_at": 1.0, "acked_at": 1.1},
        {"op": "submit", "id": "t2", "outcome": "info", "error": "reset"},
        {"op": "submit", "id": "t2", "outcome": "ok", "unique": "u1", "returned": "t1",
         "created": False, "sent_at": 2.0, "acked_at": 2.6},
        {"op": "submit", "id": "t3", "outcome": "ok"},
    ]  # fmt: skip
    assert pc.unique_submits(records) == [pc.UniqueSubmit("t1", "u1", "t1", 1.0, 1.1),
                                          pc.UniqueSubmit("t2", "u1", "t1", 2.0, 2.6)]  # fmt: skip
    assert [s.created for s in pc.unique_submits(records)] == [True, False]


# -- the workload --------------------------------------------------------------------------------


def test_the_policies_are_a_small_share_of_the_load_and_the_seed_draws_stay_put() -> None:
    rng = random.Random(1)
    plan = [workload(i, rng) for i in range(150)]
    names = [p.name for p in plan]
    share = {n: names.count(n) for n in set(names)}
    assert share["flaky"] >= 5 and share["slow"] >= 4 and share["brief"] >= 4
    uniques = [p.unique for p in plan if p.unique]
    assert len(uniques) == 15 and len(set(uniques)) == 5  # three submits per unique id
    assert sum(1 for p in plan if p.name != "step" or p.unique) < 150 / 4
    modes = {p.params["mode"] for p in plan if p.name == "slow"}
    assert modes == {"silent", "checkpoints", "quick"}
    assert {p.params["fail_until"] for p in plan if p.name == "flaky"} >= {1, 2, 4, 5}
    # every submit draws the same two numbers, whatever its kind
    drawn, pairs = random.Random(1), random.Random(1)
    for i in range(40):
        workload(i, drawn)
        pairs.randint(3, 8), pairs.randint(10, 60)
    assert drawn.random() == pairs.random()


def test_watched_snapshots_and_tombstones_reach_the_removal_checker() -> None:
    """A removal judged from what the watch kept (``policy_report.removed``)."""
    from chongming_redis.model import Tombstone
    from chongming_redis.stress.feed_watch import FeedWatch, Seen
    from chongming_redis.stress.policy_report import removed

    watch = FeedWatch(store=None)  # type: ignore[arg-type]  # never started
    final = _snap("a", S, updated=10.0, retention=3.0)
    watch.tasks["a"] = Seen(final, final_by=E + 10.4, history=_unique_task("a", 0, 10))
    watch.tasks["b"] = Seen(replace(final, task_id="b", status=R))
    tombs = {t: Tombstone(t, T0 + timedelta(seconds=14), "step", 0) for t in "abc"}
    gone = removed({"a": None, "b": None, "c": None, "d": None}, tombs, watch)
    assert set(gone.tombstones) == {"a", "b", "c"} and set(gone.snapshots) == {"a"}
    assert set(gone.histories) == {"a"} and gone.unverifiable == {"b", "c"}


@pytest.mark.redis
def test_the_feed_watch_keeps_what_a_removal_takes_away(
    redis_proc: RedisProc, namespace: str
) -> None:
    """On a real store: the watch sees a finished task with a short retention (and reads its
    history), then its tombstone once it expired; the removal is judged from that, on time."""
    from chongming_redis.runtime.app import App
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.controller import Controller
    from chongming_redis.stores.redis import RedisTaskStore
    from chongming_redis.stress.feed_watch import FeedWatch, tombstones

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    app = App("watched")
    app.task("quick", retention=0.2)(lambda ctx, params: None)
    app.task("kept")(lambda ctx, params: None)
    driver = Controller(store, app=app, owner="drv", buckets=BucketPolicy(4))
    try:
        watch = FeedWatch(store)
        for task_id, name in (("q1", "quick"), ("k1", "kept")):
            driver.submit(name, None, task_id=task_id)
        assert watch.poll() and watch.tasks["q1"].final_by is None
        for task_id in ("q1", "k1"):
            snap = store.get(task_id)
            assert snap is not None
            done = snap.evolve(status=S, status_version=2, updated_at=store.server_time())
            store.save(done, expect_version=1)
        assert watch.poll()
        seen = watch.tasks["q1"]
        assert seen.last.status is S and seen.final_by is not None
        assert seen.history is not None and [e.version for e in seen.history] == [1]
        assert watch.tasks["k1"].history is None  # kept 7 days: read at the end, not now
        early = store.expire_finished(now=store.server_time(), limit=10)
        assert early == []  # not yet: 0.2 s
        later = store.server_time() + timedelta(seconds=1)
        assert store.expire_finished(now=later, limit=10) == ["q1"]
        assert watch.poll() and set(watch.removed_by) == {"q1"}
        tomb = tombstones(store)["q1"]
        removal = pc.removal_of("q1", tomb.removed_at.timestamp(), watch.removed_by["q1"],
                                seen.last)  # fmt: skip
        assert removal.final and pc.check_removals([removal]) == []
        # the watch saw the tombstone by a time the server gave, not the remover's stamp
        assert watch.removed_by["q1"] < tomb.removed_at.timestamp()
    finally:
        store.drop_namespace()
        store.close()
