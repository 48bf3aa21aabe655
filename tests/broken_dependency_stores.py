"""Broken dependency stores: each a small subclass of ``InMemoryTaskStore`` that breaks one duty
of ``DependenciesStore`` (``stores/dependency_store.py``) through the smallest hook of its
``MemoryDependencies`` mixin; ``CAUGHT_BY`` names the ``ExtensionsContract`` test
(``testing/extensions/dependencies.py``) that must fail on it. ``test_extensions_teeth.py`` merges
``BROKEN``, ``CAUGHT_BY`` and ``SOUND`` (``_InCommit``: sound as written, so a subclass fails
for the one rule it changes) and declares ``EXTENSION``. The release rule is the reference's
own hook, ``_decide``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from chongming_redis.errors import ParentNotFound, StoreError, WaitingMove
from chongming_redis.model import ChangePage, TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.parents import STOP, Release, release
from chongming_redis.stores._memory_dependencies import row_parents
from chongming_redis.stores.codec import Row, snapshot_to_row
from chongming_redis.stores.dependency_store import RELEASE_STEP
from chongming_redis.stores.extensions import CommitItem
from chongming_redis.stores.memory import InMemoryTaskStore

EXTENSION = "DependenciesStore"
W = TaskStatus.WAITING
_WAITING = W.value
_Refusal = ParentNotFound | WaitingMove | None


# -- WAITING, counted, queried and in the feed --------------------------------------------------


class CountsLeaveWaitingOut(InMemoryTaskStore):
    """counts() lists the seven core statuses only: waiting tasks are never counted."""

    def counts(self) -> dict[TaskStatus, int]:
        result = super().counts()
        del result[W]
        return result


class QueriesMissWaiting(InMemoryTaskStore):
    """query() never finds a waiting task (no status index for WAITING)."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return [s for s in super().query(query) if s.status is not W]


class FeedSkipsWaiting(InMemoryTaskStore):
    """The change feed leaves waiting tasks out: a reader first hears of a released child."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        page = super().changes(after, limit)
        return replace(page, tasks=tuple(s for s in page.tasks if s.status != _WAITING))


# -- create: the parents must exist ----------------------------------------------------------


class AcceptsAMissingParent(InMemoryTaskStore):
    """A missing parent is skipped, not refused: the child waits on the parents that exist."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        error = super()._dependency_error(row, current)
        return None if isinstance(error, ParentNotFound) else error

    def _wait(self, child: str, row: Row) -> None:
        known = [p for p in row_parents(row) if p in self._tasks]
        super()._wait(child, {**row, "parents": json.dumps(known)})


class WritesTheChildBeforeRefusing(InMemoryTaskStore):
    """create raises ParentNotFound after storing the child: the refused child stays."""

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except ParentNotFound:
            with self._lock:
                self._tasks[snapshot.task_id] = snapshot_to_row(snapshot)
                self._feed.move(snapshot.task_id)
            raise


# -- a parent ends: the release rule ----------------------------------------------------------


class ReleasesOnTheFirstEnd(InMemoryTaskStore):
    """The first parent to succeed releases the child, whatever the others do."""

    def _decide(self, policy: str, outcome: str, unmet: int) -> Release | None:
        return release(policy, outcome, 0)


class IgnoresTheRunPolicy(InMemoryTaskStore):
    """on_parent_failure is never read: every child is judged under "stop"."""

    def _decide(self, policy: str, outcome: str, unmet: int) -> Release | None:
        return release(STOP, outcome, unmet)


class NeverStopsAChild(InMemoryTaskStore):
    """A failed parent under "stop" is skipped: the child waits for good, never STOPPED."""

    def _decide(self, policy: str, outcome: str, unmet: int) -> Release | None:
        decision = super()._decide(policy, outcome, unmet)
        return None if decision == "stopped" else decision


class StopsNoDescendants(InMemoryTaskStore):
    """A child stopped by its parent's failure is no end: its own children wait for good."""

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        super()._move_child(child, row, to, parent, outcome)
        self._releases.pop(child, None)
        return False


class RetryIsAnEnd(InMemoryTaskStore):
    """A parent saved from RUNNING back to PENDING (retried in the same write) is taken for
    an end, LOST: its "stop" children are stopped."""

    def _dependencies_written(self, task_id: str, previous: Row | None) -> None:
        row = self._tasks[task_id]
        retried = (previous is not None and previous["status"] == TaskStatus.RUNNING.value
                   and row["status"] == TaskStatus.PENDING.value)  # fmt: skip
        if retried and self._ended(task_id, {**row, "status": TaskStatus.LOST.value}):
            self._release_from([task_id], RELEASE_STEP)
            return
        super()._dependencies_written(task_id, previous)


class IgnoresEndedParents(InMemoryTaskStore):
    """A parent that ended before the child was created is never applied: it waits for good."""

    def _wait(self, child: str, row: Row) -> None:
        parents = row_parents(row)
        self._edges[child] = dict.fromkeys(parents, False)
        for parent in parents:
            self._children.setdefault(parent, {})[child] = None


class ReleaseKeepsTheVersion(InMemoryTaskStore):
    """The release writes the child's history entry but does not bump its version."""

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        ended = super()._move_child(child, row, to, parent, outcome)
        row["status_version"] = int(row["status_version"]) - 1  # type: ignore[arg-type]
        return ended


class ReleaseWritesNoHistory(InMemoryTaskStore):
    """The release moves the child without its WAITING -> PENDING/STOPPED history entry."""

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        ended = super()._move_child(child, row, to, parent, outcome)
        self._history[child].pop(int(row["status_version"]))  # type: ignore[arg-type]
        return ended


class ReleaseSkipsTheFeed(InMemoryTaskStore):
    """The release gives the child no new feed position: a reader never sees it move."""

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        self._feed.move = lambda task_id: None  # type: ignore[method-assign]
        try:
            return super()._move_child(child, row, to, parent, outcome)
        finally:
            del self._feed.move


class ReleasesTwice(InMemoryTaskStore):
    """The release is written twice (a step retried, not idempotent): two exits, version +2."""

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        ended = super()._move_child(child, row, to, parent, outcome)
        if to == "pending":
            super()._move_child(child, row, to, parent, outcome)
        return ended


# -- wide releases, and the extension's own calls ------------------------------------------


class ReleasesTheWholeFanOut(InMemoryTaskStore):
    """The write that ends a parent moves every child of it, however many (unbounded)."""

    def _release_from(self, queue: list[str], budget: int) -> int:
        return super()._release_from(queue, 1_000_000)


class ForgetsTheRestOfARelease(InMemoryTaskStore):
    """What one write leaves over is not noted for release_dependents: it waits for good."""

    def _dependencies_written(self, task_id: str, previous: Row | None) -> None:
        super()._dependencies_written(task_id, previous)
        self._releases.clear()


class ContinuesButReportsNothing(InMemoryTaskStore):
    """release_dependents does one step but returns 0: the caller stops after it."""

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        super().release_dependents(limit=limit)
        return 0


class AcceptsAnyReleaseLimit(InMemoryTaskStore):
    """release_dependents takes any limit (0, negative, a bool, a float, a str)."""

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        with self._open():
            return self._release_from(list(self._releases), max(1, int(limit)))


class BacklogAfterClose(InMemoryTaskStore):
    """release_backlog still answers after close()."""

    def release_backlog(self) -> int:
        return len(self._releases)


# -- only the store moves a task out of WAITING (by save or commit_tasks) ----------------------


class SaveLeavesWaiting(InMemoryTaskStore):
    """A save may move a task out of WAITING to PENDING (or any unfinished status)."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        error = super()._dependency_error(row, current)
        return None if isinstance(error, WaitingMove) and error.stored == _WAITING else error


class SaveEntersWaiting(InMemoryTaskStore):
    """A save may move a task into WAITING (a task no parent's end will ever release)."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        error = super()._dependency_error(row, current)
        return None if isinstance(error, WaitingMove) and error.given == _WAITING else error


class RefusesAStopByHand(InMemoryTaskStore):
    """Every save out of WAITING is WaitingMove, a stop too: a waiting task cannot be stopped."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        if current is not None and current["status"] == _WAITING != row["status"]:
            return WaitingMove(str(row["task_id"]), _WAITING, str(row["status"]))
        return super()._dependency_error(row, current)


class SaveChangesTheParents(InMemoryTaskStore):
    """A save writes the given parents and on_parent_failure over the stored ones."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        given = snapshot_to_row(snapshot)
        with self._lock:
            row = self._tasks[snapshot.task_id]
            row["parents"], row["on_parent_failure"] = given["parents"], given["on_parent_failure"]


class _InCommit(InMemoryTaskStore):
    """The ids stored before the commit_tasks call under way (``None`` outside one)."""

    _before: frozenset[str] | None = None

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        self._before = frozenset(self._tasks)
        try:
            return super().commit_tasks(items)
        finally:
            self._before = None


class CommitJudgesParentsBeforeTheCall(_InCommit):
    """commit_tasks looks the parents up in the store as it was before the call: a child of a
    task created by an earlier item of the same call is ParentNotFound."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        if self._before is not None and current is None and row["status"] == _WAITING:
            for parent in row_parents(row):
                if parent not in self._before:
                    return ParentNotFound(str(row["task_id"]), parent)
        return super()._dependency_error(row, current)


class CommitSkipsTheWaitingCheck(_InCommit):
    """commit_tasks never refuses a move into or out of WAITING (only save checks it)."""

    def _dependency_error(self, row: Row, current: Row | None) -> _Refusal:
        error = super()._dependency_error(row, current)
        return None if self._before is not None and isinstance(error, WaitingMove) else error


class LeavesTheCallsOwnChildren(_InCommit):
    """An end in commit_tasks skips the children the same call wrote (the Redis scripts once
    did): a child created by an earlier item stays WAITING though its parent succeeded."""

    def _apply(self, child: str, parent: str, outcome: str) -> bool:
        if self._before is not None and child not in self._before:
            return False
        return super()._apply(child, parent, outcome)


class LostCountsAsSuccess(InMemoryTaskStore):
    """Only FAILED and STOPPED stop a child: a parent that ended LOST releases it."""

    def _decide(self, policy: str, outcome: str, unmet: int) -> Release | None:
        return super()._decide(policy, "succeeded" if outcome == "lost" else outcome, unmet)


class HandStopKeepsTheEdges(InMemoryTaskStore):
    """A waiting task stopped by hand is not an end: its edges stay (its parents stay kept)
    and its own waiting children are never stopped."""

    def _dependencies_written(self, task_id: str, previous: Row | None) -> None:
        if previous is None or previous["status"] != _WAITING:
            super()._dependencies_written(task_id, previous)


class RewalksAParentsChildren(InMemoryTaskStore):
    """A continuation lists the parent's children from the first again, released ones too:
    each step judges the same children, the rest of a successful fan-out never moves."""

    def _release_from(self, queue: list[str], budget: int) -> int:
        done = 0
        while queue and done < budget:
            parent = queue[0]
            outcome = self._releases.get(parent)
            waiting = [] if outcome is None else list(self._children.get(parent, {}))
            taken = waiting[: budget - done]
            for child in taken:
                done += 1
                if self._apply(child, parent, str(outcome)):
                    queue.append(child)
            if len(taken) < len(waiting):
                break
            self._releases.pop(parent, None)
            queue.pop(0)
        return done


# -- retention --------------------------------------------------------------------------------


class PinsOnlyWhileWaiting(InMemoryTaskStore):
    """A parent is kept only while a child WAITS: released (PENDING, unfinished), it is not."""

    def _pinned(self, task_id: str) -> bool:
        children = self._children.get(task_id, {})
        return any(self._tasks[c]["status"] == _WAITING for c in children)


class ExpiresAPinnedParent(InMemoryTaskStore):
    """prune keeps a pinned parent, expire_finished does not."""

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        self._pinned = lambda task_id: False  # type: ignore[method-assign]
        try:
            return super().expire_finished(now=now, limit=limit)
        finally:
            del self._pinned


class PinsForever(InMemoryTaskStore):
    """A child's end never unpins its parents: a finished parent is kept for good."""

    def _ended(self, task_id: str, row: Row) -> bool:
        kept = {p: dict(self._children.get(p, {})) for p in self._edges.get(task_id, {})}
        ended = super()._ended(task_id, row)
        for parent, children in kept.items():
            self._children.setdefault(parent, {}).update(children)
        return ended


COUNTED = "test_a_waiting_task_is_counted_queried_and_in_the_feed"
MISSING = "test_a_missing_parent_is_refused_and_nothing_is_written"
LAST = "test_the_last_parents_success_releases_the_child_in_the_same_write"
STOPS = "test_a_failed_parent_stops_the_child_and_its_descendants"
FAN_OUT = "test_a_wide_fan_out_is_released_in_bounded_steps_none_twice"
SAVES = "test_a_save_into_or_out_of_waiting_is_refused_but_an_end_is_not"
KEPT = "test_a_finished_parent_is_kept_while_a_child_that_depends_on_it_is_unfinished"
BAD = "test_release_dependents_refuses_bad_limits_and_a_closed_store"

#: Broken store -> the ExtensionsContract test that pins the duty it breaks.
CAUGHT_BY: dict[str, str] = {
    "CountsLeaveWaitingOut": COUNTED,
    "QueriesMissWaiting": COUNTED,
    "FeedSkipsWaiting": COUNTED,
    "AcceptsAMissingParent": MISSING,
    "WritesTheChildBeforeRefusing": MISSING,
    "ReleasesOnTheFirstEnd": LAST,
    "IgnoresTheRunPolicy": "test_under_run_a_child_waits_for_every_parent_to_end_however_it_ends",
    "NeverStopsAChild": STOPS,
    "StopsNoDescendants": STOPS,
    "RetryIsAnEnd": "test_an_attempt_retried_in_the_same_write_is_not_an_end",
    "IgnoresEndedParents": "test_a_parent_that_ended_before_the_child_was_created_is_applied_at_once",
    "ReleaseKeepsTheVersion": LAST,
    "ReleaseWritesNoHistory": LAST,
    "ReleaseSkipsTheFeed": LAST,
    "ReleasesTwice": "test_a_fan_in_releases_its_child_once_after_all_parents",
    "ReleasesTheWholeFanOut": FAN_OUT,
    "ForgetsTheRestOfARelease": FAN_OUT,
    "ContinuesButReportsNothing": FAN_OUT,
    "SaveLeavesWaiting": SAVES,
    "SaveEntersWaiting": SAVES,
    "RefusesAStopByHand": SAVES,
    "SaveChangesTheParents": SAVES,
    "CommitJudgesParentsBeforeTheCall": "test_commit_tasks_creates_a_graph_whose_edges_point_to_earlier_items",
    "CommitSkipsTheWaitingCheck": "test_refused_commit_items_write_nothing_and_the_others_apply",
    "PinsOnlyWhileWaiting": KEPT,
    "ExpiresAPinnedParent": KEPT,
    "PinsForever": KEPT,
    "LeavesTheCallsOwnChildren": "test_the_items_of_one_commit_apply_in_order_ends_included",
    "LostCountsAsSuccess": "test_a_lost_parent_is_an_end_that_stops_the_child_under_stop",
    "HandStopKeepsTheEdges": (
        "test_a_waiting_task_stopped_by_hand_ends_its_edges_and_stops_its_children"
    ),
    "RewalksAParentsChildren": (
        "test_a_successful_wide_fan_out_continues_where_the_last_step_stopped"
    ),
    "AcceptsAnyReleaseLimit": BAD,
    "BacklogAfterClose": BAD,
}
SOUND: dict[str, type[InMemoryTaskStore]] = {"_InCommit": _InCommit}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
