"""The checkers of the dependencies (issue 28) over a stress run's records: the graphs the
driver submitted (``producer.graph_clumps``: diamonds, failing parents with ``"stop"`` and
``"run"`` children, one wide fan-out with its join), judged from the final snapshots and the
stored histories against the edges the driver *planned* (not the ones the store kept, so a
store that dropped them is caught too). Violations:

* ``early_releases``: a child that could start before its parents allowed it: created
  runnable (its first entry is not ``WAITING``), started though its parents' end stopped it,
  or started before a parent's end was recorded (entry times, each from its writer's clock,
  which follows the server's: ``TOLERANCE`` seconds of slack);
* ``wrong_releases``: a move out of ``WAITING`` the parents' final statuses do not allow: to
  ``PENDING`` under ``"stop"`` with a parent that did not succeed, or to ``STOPPED`` by a
  parent's end when every parent succeeded (or under ``"run"``);
* ``waiting_exits``: a child that left ``WAITING`` more than once, or that is no longer
  ``WAITING`` with no entry recording how it left;
* ``stuck_waiting``: a child still ``WAITING`` at the end of the run with every parent final.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress.checkers import Violation

W, R, S = TaskStatus.WAITING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED
#: The clocks' slack when a child's start is compared with its parents' ends.
TOLERANCE = timedelta(seconds=0.25)

Edges = Mapping[str, tuple[tuple[str, ...], str]]


def _ended_at(history: list[Transition]) -> Any:
    """When the task last reached a final status (``None``: never)."""
    ends = [t.at for t in history if t.to_status.is_terminal]
    return max(ends) if ends else None


def _landed_starts(history: list[Transition]) -> list[Any]:
    """A lower bound of when each start landed: the latest time of its entry and of every entry
    before it (a write lands after the writes it follows). A start entry's own time is its
    starter's ``now``, read before the call, which can land seconds later (a SIGSTOP, a call
    that waited for a restarting server): after the child's release, with an older time."""
    found, latest = [], None
    for entry in sorted(history, key=lambda t: t.version):
        latest = entry.at if latest is None else max(latest, entry.at)
        if entry.to_status is R:
            found.append(latest)
    return found


def check_graphs(
    edges: Edges,
    known: Mapping[str, TaskSnapshot | None],
    histories: Mapping[str, list[Transition]],
) -> tuple[list[Violation], dict[str, Any]]:
    """The violations, and the counts the report prints."""
    found: list[Violation] = []
    released = stopped = judged = 0
    for child, (parents, policy) in sorted(edges.items()):
        snap, history = known.get(child), histories.get(child, [])
        finals = {p: known.get(p) for p in parents}
        if snap is None or not history or any(s is None for s in finals.values()):
            continue  # not acknowledged, or a parent was not: nothing was promised
        judged += 1
        statuses = {p: s.status for p, s in finals.items() if s is not None}
        exits = [t for t in history if t.from_status is W]
        if history[0].to_status is not W:
            found.append(Violation("early_releases", child, "created runnable, not waiting"))
        if len(exits) > 1 or (snap.status is not W and history[0].to_status is W and not exits):
            found.append(Violation("waiting_exits", child, f"{len(exits)} exits from waiting"))
        if snap.status is W and all(s.is_terminal for s in statuses.values()):
            found.append(Violation("stuck_waiting", child, f"parents ended: {statuses}"))
        for exit_ in exits[:1]:
            by_parent = (exit_.reason or "").startswith("parent")
            all_ok = all(s is S for s in statuses.values())
            if exit_.to_status is TaskStatus.PENDING:
                released += 1
                if policy == "stop" and not all_ok:
                    found.append(Violation("wrong_releases", child, f"pending with {statuses}"))
            elif exit_.to_status is TaskStatus.STOPPED and by_parent:
                stopped += 1
                if all_ok or policy == "run":
                    found.append(Violation("wrong_releases", child,
                                           f"stopped under {policy} with {statuses}"))  # fmt: skip
        starts = _landed_starts(history)
        if not starts:
            continue
        if exits and exits[0].to_status is TaskStatus.STOPPED:
            found.append(Violation("early_releases", child, "started though stopped by a parent"))
        for parent in parents:
            ended = _ended_at(histories.get(parent, []))
            if ended is None or min(starts) + TOLERANCE < ended:
                detail = f"started {min(starts)}, before {parent} ended ({ended})"
                found.append(Violation("early_releases", child, detail))
    return found, {"graph_children": judged, "children_released": released,
                   "children_stopped": stopped}  # fmt: skip
