"""``stress/dependency_checks.py`` on hand-made records: a clean graph passes and is counted,
and each way a release can go wrong trips its violation (a child created runnable, started
before its parent ended, released though its parent failed, stopped though every parent
succeeded, started though stopped, released twice, left waiting with its parents ended)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress.dependency_checks import check_graphs

T0 = datetime(2026, 5, 1, 8, 0, 0, tzinfo=timezone.utc)
W, P, R, S, F, X = (TaskStatus.WAITING, TaskStatus.PENDING, TaskStatus.RUNNING,
                    TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED)  # fmt: skip


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def snap(task_id: str, status: TaskStatus, parents: tuple[str, ...] = ()) -> TaskSnapshot:
    return TaskSnapshot(task_id, "step", status, 4, T0, T0, parents=parents)


def h(
    task_id: str, *moves: tuple[TaskStatus | None, TaskStatus, float, str | None]
) -> list[Transition]:
    return [Transition(task_id, v, a, b, at(t), why) for v, (a, b, t, why) in enumerate(moves, 1)]


def parent_ok(task_id: str, end: float = 2.0) -> list[Transition]:
    return h(task_id, (None, P, 0, None), (P, R, 1, None), (R, S, end, None))


def released_child(task_id: str, start: float = 3.0) -> list[Transition]:
    return h(task_id, (None, W, 0.5, None), (W, P, 2.0, "parents ended (last: p S)"),
             (P, R, start, None), (R, S, start + 1, None))  # fmt: skip


def kinds(edges, known, histories) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(v.kind for v in check_graphs(edges, known, histories)[0])


def test_a_clean_graph_passes_and_is_counted() -> None:
    known = {"p": snap("p", S), "c": snap("c", S, ("p",)), "bad": snap("bad", F),
             "s": snap("s", X, ("bad",))}  # fmt: skip
    histories = {"p": parent_ok("p"), "c": released_child("c"),
                 "bad": h("bad", (None, P, 0, None), (P, R, 1, None), (R, F, 2, None)),
                 "s": h("s", (None, W, 0.5, None), (W, X, 2, "parent bad ended"))}  # fmt: skip
    edges = {"c": (("p",), "stop"), "s": (("bad",), "stop")}
    found, counts = check_graphs(edges, known, histories)
    assert found == []
    assert counts == {"graph_children": 2, "children_released": 1, "children_stopped": 1}


def test_each_wrong_release_is_reported() -> None:
    known = {"p": snap("p", S), "bad": snap("bad", F)}
    histories = {"p": parent_ok("p", end=5.0),
                 "bad": h("bad", (None, P, 0, None), (P, R, 1, None), (R, F, 2, None))}  # fmt: skip
    cases = {
        # created PENDING: no waiting at all
        "runnable": (h("runnable", (None, P, 0.5, None), (P, R, 6, None)), ("p",), "stop",
                     ["early_releases"]),
        # started at 3 s, its parent ended at 5 s
        "early": (released_child("early", start=3.0), ("p",), "stop", ["early_releases"]),
        # released to PENDING though its parent failed, under "stop"
        "wrong": (h("wrong", (None, W, 0.5, None), (W, P, 2.1, "parents ended"),
                    (P, R, 3, None)), ("bad",), "stop", ["wrong_releases"]),
        # stopped by its parent's end though the parent succeeded
        "stopped": (h("stopped", (None, W, 0.5, None), (W, X, 5.1, "parent p ended")), ("p",),
                    "stop", ["wrong_releases"]),
        # stopped by its parent's end, and started all the same
        "zombie": (h("zombie", (None, W, 0.5, None), (W, X, 2.1, "parent bad ended failed"),
                     (X, R, 3, None)), ("bad",), "stop", ["early_releases"]),
        # two exits from WAITING
        "twice": (h("twice", (None, W, 0.5, None), (W, P, 5.1, "parents ended"),
                    (P, W, 5.2, None), (W, P, 5.3, "parents ended")), ("p",), "stop",
                  ["waiting_exits"]),
    }  # fmt: skip
    for child, (history, parents, policy, expected) in cases.items():
        final = history[-1].to_status
        got = kinds({child: (parents, policy)}, {**known, child: snap(child, final, parents)},
                    {**histories, child: history})  # fmt: skip
        assert got == expected, (child, got)


def test_a_child_left_waiting_with_every_parent_ended_is_stuck() -> None:
    known = {"p": snap("p", S), "c": snap("c", W, ("p",)), "q": snap("q", R),
             "d": snap("d", W, ("q",))}  # fmt: skip
    histories = {"p": parent_ok("p"), "q": h("q", (None, P, 0, None), (P, R, 1, None)),
                 "c": h("c", (None, W, 0.5, None)), "d": h("d", (None, W, 0.5, None))}  # fmt: skip
    edges = {"c": (("p",), "stop"), "d": (("q",), "stop")}
    assert kinds(edges, known, histories) == ["stuck_waiting"]  # d's parent still runs


def test_children_whose_submit_or_parents_were_not_acknowledged_are_not_judged() -> None:
    edges = {"c": (("p",), "stop"), "orphan": (("never",), "stop")}
    known = {"p": snap("p", S), "c": None, "orphan": snap("orphan", P)}
    found, counts = check_graphs(edges, known, {"p": parent_ok("p")})
    assert found == [] and counts["graph_children"] == 0


def test_a_start_that_landed_late_with_an_older_time_is_judged_by_when_it_landed() -> None:
    """A start entry's time is its starter's ``now``, read before the call: a call that waited
    for a restarting server lands after the child's release with an older time (seen in the
    PostgreSQL stress run). The start landed after every entry before it, so the latest of
    their times bounds it; a start before the release is still caught."""
    known = {"p": snap("p", S), "c": snap("c", S, ("p",)), "e": snap("e", S, ("p",))}
    late = h("c", (None, W, 0.5, None), (W, P, 5.1, "parents ended (last: p S)"),
             (P, R, 3.0, None), (R, S, 6.0, None))  # fmt: skip
    early = h("e", (None, W, 0.5, None), (W, R, 3.0, None), (R, S, 6.0, None))
    histories = {"p": parent_ok("p", end=5.0), "c": late, "e": early}
    found, _ = check_graphs({"c": (("p",), "stop"), "e": (("p",), "stop")}, known, histories)
    assert [(v.kind, v.task_id) for v in found] == [("early_releases", "e")]
