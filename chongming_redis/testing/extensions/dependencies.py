"""The contract of ``DependenciesStore`` (``stores/dependency_store.py``): ``WAITING`` counted,
queried and in the feed; a missing parent refused with nothing written; each (child, parent)
edge applied once, in the write that ends the parent (or at the child's creation, for a parent
that had ended): the last success releases the child to ``PENDING``, a failure under
``"stop"`` ends it ``STOPPED`` and its own children after it, ``"run"`` waits for every end; a
retried attempt is not an end; a whole graph in one ``commit_tasks``, its items applied in
order (an end releases the children of the items before it); a wide fan-out in
bounded steps, none twice; only the store moves a task out of ``WAITING`` (but for an end);
a finished parent kept while a child that depends on it is unfinished. Mixed into
``ExtensionsContract``; every test returns at once unless the store is a
``DependenciesStore``.
"""

from __future__ import annotations

from typing import Any

from chongming_redis.errors import ConcurrencyConflict, ParentNotFound, StoreClosed, WaitingMove
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.dependency_store import RELEASE_STEP, DependenciesStore
from chongming_redis.stores.extensions import BatchingStore, TaskPoliciesStore
from chongming_redis.stores.protocol import ChangeFeed
from chongming_redis.testing.contract.support import (
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    ContractBase,
    at,
    counted,
    raises,
)

W = TaskStatus.WAITING


def node(task_id: str, status: TaskStatus = PENDING, version: int = 1, created: float = 0.0,
         **fields: Any) -> TaskSnapshot:  # fmt: skip
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, "job", status, version, at(created), **fields)


def child(task_id: str, *parents: str, created: float = 1.0, **fields: Any) -> TaskSnapshot:
    return node(task_id, W, created=created, parents=parents, **fields)


class DependenciesContract(ContractBase):
    def _deps(self) -> Any:
        return self.store if isinstance(self.store, DependenciesStore) else None

    def _end(self, task_id: str, status: TaskStatus, **fields: Any) -> None:
        current = self.store.get(task_id)
        assert current is not None, task_id
        version = current.status_version
        moved = current.evolve(status=status, status_version=version + 1, **fields)
        self.store.save(moved, expect_version=version)

    def _status(self, task_id: str) -> tuple[TaskStatus, int]:
        current = self.store.get(task_id)
        assert current is not None, task_id
        return current.status, current.status_version

    def _exits(self, task_id: str) -> list[Transition]:
        """The history entries that moved ``task_id`` out of ``WAITING``."""
        return [t for t in self.store.history(task_id) if t.from_status is W]

    def _drain(self, store: Any) -> int:
        judged = 0
        for _ in range(1000):
            step = store.release_dependents(limit=RELEASE_STEP)
            if step == 0:
                return judged
            judged += step
        raise AssertionError("release_dependents never reached 0")

    # -- WAITING, counted and found ---------------------------------------------------------------

    def test_a_waiting_task_is_counted_queried_and_in_the_feed(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p"), child("c", "p"))
        assert self.counts() == counted(pending=1, waiting=1)
        assert self.where(statuses={W}) == ["c"]
        assert self.where(statuses={PENDING}) == ["p"]
        stored = self.store.get("c")
        assert stored == child("c", "p")  # as given: parents and policy included
        assert stored is not None and stored.parents == ("p",)
        if isinstance(self.store, ChangeFeed):
            page = self.store.changes("0", 256)
            assert [s.task_id for s in page.tasks] == ["p", "c"]
            assert page.tasks[1] == stored

    def test_a_missing_parent_is_refused_and_nothing_is_written(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p"))
        error = raises(ParentNotFound, self.store.create, child("c", "p", "ghost"))
        assert (error.task_id, error.parent) == ("c", "ghost")
        raises(ParentNotFound, self.store.create, child("self", "self"))
        assert self.store.get("c") is None and self.store.get("self") is None
        assert self.counts() == counted(pending=1)
        assert self.store.history("c") == []
        self.store.create(child("c", "p"))  # nothing was left behind to refuse it
        assert self._status("c") == (W, 1)

    def test_the_last_parents_success_releases_the_child_in_the_same_write(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p1"), node("p2"), child("c", "p1", "p2"))
        self._end("p1", SUCCEEDED)
        assert self._status("c") == (W, 1)  # one parent left
        assert self._exits("c") == []
        self._end("p2", SUCCEEDED)
        assert self._status("c") == (PENDING, 2)
        (entry,) = self._exits("c")
        assert (entry.version, entry.to_status) == (2, PENDING)
        assert entry.reason is not None and "p2" in entry.reason
        assert self.counts() == counted(succeeded=2, pending=1)
        released = self.store.get("c")
        assert released is not None and released.parents == ("p1", "p2")
        assert released.updated_at > at(1)  # the release is a write of its own, now
        if isinstance(self.store, ChangeFeed):  # the release is a change after the parent's
            order = [s.task_id for s in self.store.changes("0", 256).tasks]
            assert order == ["p1", "p2", "c"]

    def test_a_failed_parent_stops_the_child_and_its_descendants(self) -> None:
        if self._deps() is None:
            return
        self.put(node("a"), node("other"), child("b", "a", "other"), child("c", "b", created=2))
        self.put(child("d", "c", created=3), child("free", "other", created=4))
        self._end("a", FAILED)
        for task_id, parent in (("b", "a"), ("c", "b"), ("d", "c")):
            assert self._status(task_id) == (STOPPED, 2), task_id
            (entry,) = self._exits(task_id)
            assert entry.to_status is STOPPED and entry.reason is not None
            assert parent in entry.reason, entry.reason
        assert self._status("free") == (W, 1)  # another parent's child is untouched
        self._end("other", SUCCEEDED)
        assert self._status("free") == (PENDING, 2)
        assert self._status("b") == (STOPPED, 2)  # ended children are judged no more
        assert self.counts() == counted(failed=1, succeeded=1, stopped=3, pending=1)

    def test_a_lost_parent_is_an_end_that_stops_the_child_under_stop(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p", RUNNING), child("c", "p"))
        self._end("p", LOST)  # found lost with no attempt left: it ended, not succeeded
        assert self._status("c") == (STOPPED, 2)
        reason = self._exits("c")[0].reason
        assert reason is not None and "p" in reason

    def test_a_waiting_task_stopped_by_hand_ends_its_edges_and_stops_its_children(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p", RUNNING), child("c", "p"), child("d", "c", created=2))
        self._end("c", STOPPED)  # an operator's stop: an end, allowed out of WAITING
        assert self._status("d") == (STOPPED, 2)
        reason = self._exits("d")[0].reason
        assert reason is not None and "c" in reason
        self._end("p", SUCCEEDED)  # c is final: nothing waits on p any more
        assert self._status("c") == (STOPPED, 2)
        assert self.store.prune(keep_terminal=0) == 3  # p is no longer kept for c

    def test_under_run_a_child_waits_for_every_parent_to_end_however_it_ends(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p1", RUNNING), node("p2", RUNNING))
        self.put(child("c", "p1", "p2", on_parent_failure="run"))
        self._end("p1", FAILED)
        assert self._status("c") == (W, 1)
        self._end("p2", LOST)
        assert self._status("c") == (PENDING, 2)
        assert len(self._exits("c")) == 1

    def test_a_parent_that_ended_before_the_child_was_created_is_applied_at_once(self) -> None:
        if self._deps() is None:
            return
        self.put(node("ok", SUCCEEDED), node("bad", FAILED), node("live"))
        self.put(child("now", "ok"), child("never", "ok", "bad"), child("later", "ok", "live"))
        self.put(child("anyway", "bad", on_parent_failure="run"))
        assert self._status("now") == (PENDING, 2)
        assert self._status("never") == (STOPPED, 2)
        assert self._status("later") == (W, 1)
        assert self._status("anyway") == (PENDING, 2)
        reason = self._exits("never")[0].reason
        assert reason is not None and "bad" in reason
        self._end("live", SUCCEEDED)
        assert self._status("later") == (PENDING, 2)

    def test_an_attempt_retried_in_the_same_write_is_not_an_end(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p", RUNNING), child("c", "p"))
        self._end("p", PENDING, attempt=2)  # LOST and retried, or failed and retried
        self._end("p", RUNNING)
        assert self._status("c") == (W, 1)
        self._end("p", SUCCEEDED)
        assert self._status("c") == (PENDING, 2)

    def test_a_fan_in_releases_its_child_once_after_all_parents(self) -> None:
        if self._deps() is None:
            return
        parents = [f"p{i}" for i in range(12)]
        self.put(*(node(p, RUNNING) for p in parents), child("join", *parents))
        for parent in parents:
            assert self._status("join") == (W, 1), parent
            self._end(parent, SUCCEEDED)
        assert self._status("join") == (PENDING, 2)
        assert len(self._exits("join")) == 1

    # -- graphs and wide releases -----------------------------------------------------------------

    def test_commit_tasks_creates_a_graph_whose_edges_point_to_earlier_items(self) -> None:
        store = self._deps()
        if store is None or not isinstance(store, BatchingStore):
            return
        first = [Transition("a", 1, None, PENDING, at(0))]
        items = [(node("a"), None, first), (child("b", "a"), None, []),
                 (child("c", "a"), None, []), (child("d", "b", "c"), None, []),
                 (child("e", "late"), None, []), (node("late"), None, [])]  # fmt: skip
        results = store.commit_tasks(items)
        assert results[:4] == [None] * 4 and results[5] is None
        assert isinstance(results[4], ParentNotFound)  # its parent came after it
        assert self.store.get("e") is None
        assert self.counts() == counted(pending=2, waiting=3)
        self._end("a", SUCCEEDED)
        assert [self._status(t) for t in "bcd"] == [(PENDING, 2), (PENDING, 2), (W, 1)]
        self._end("b", SUCCEEDED)
        self._end("c", SUCCEEDED)
        assert self._status("d") == (PENDING, 2)
        assert len(self._exits("d")) == 1

    def test_the_items_of_one_commit_apply_in_order_ends_included(self) -> None:
        """An end releases the children written by the items before it in the same call, and
        an item naming a child an earlier end moved conflicts (its version was judged before):
        as if the items were written one by one."""
        store = self._deps()
        if store is None or not isinstance(store, BatchingStore):
            return
        self.put(node("p", RUNNING), node("q", RUNNING), child("k", "q"))
        p, q, k = (self.store.get(t) for t in "pqk")
        assert p is not None and q is not None and k is not None
        results = store.commit_tasks([
            (child("c", "p"), None, []),  # created, then released by p's end below
            (p.evolve(status=SUCCEEDED, status_version=2), 1, []),
            (q.evolve(status=FAILED, status_version=2), 1, []),  # stops k
            (k.evolve(status_version=2, priority=5), 1, []),  # so this item conflicts
        ])  # fmt: skip
        assert results[:3] == [None, None, None]
        assert isinstance(results[3], ConcurrencyConflict)
        assert self._status("c") == (PENDING, 2) and self._status("k") == (STOPPED, 2)
        assert [(t.to_status, t.reason) for t in self._exits("c")] == [
            (PENDING, "parents ended (last: p succeeded)")
        ]
        assert self.counts() == counted(pending=1, succeeded=1, failed=1, stopped=1)
        assert self._deps().release_backlog() == 0

    def test_a_wide_fan_out_is_released_in_bounded_steps_none_twice(self) -> None:
        store = self._deps()
        if store is None:
            return
        width = 2 * RELEASE_STEP + 37
        self.put(node("root", RUNNING))
        kids = [child(f"k{i:03d}", "root", created=1 + i / 1000) for i in range(width)]
        if isinstance(store, BatchingStore):
            for start in range(0, width, 100):
                assert store.commit_tasks([(k, None, []) for k in kids[start:start + 100]]) == \
                    [None] * len(kids[start:start + 100])  # fmt: skip
        else:
            self.put(*kids)
        self.put(child("grand", "k000", created=5))
        assert store.release_backlog() == 0
        self._end("root", FAILED)
        stopped = self.counts()[STOPPED]
        assert 1 <= stopped <= RELEASE_STEP  # one write moves a bounded number
        assert store.release_backlog() >= 1
        judged = self._drain(store)
        assert judged + stopped >= width  # every child judged (grand may come in the drain)
        assert store.release_backlog() == 0
        assert self.counts() == counted(failed=1, stopped=width + 1)
        for kid in kids[::29]:
            assert len(self._exits(kid.task_id)) == 1, kid.task_id
        assert self._status("grand") == (STOPPED, 2)
        assert store.release_dependents(limit=1) == 0  # nothing left: nothing judged twice

    def test_a_successful_wide_fan_out_continues_where_the_last_step_stopped(self) -> None:
        store = self._deps()
        if store is None:
            return
        width = RELEASE_STEP + 37
        self.put(node("root", RUNNING))
        self.put(*(child(f"k{i:03d}", "root", created=1 + i / 1000) for i in range(width)))
        self._end("root", SUCCEEDED)
        released = [self.counts()[PENDING]]
        for _ in range(10):  # a continuation that starts over again never gets to the end
            if store.release_backlog() == 0:
                break
            released.append(store.release_dependents(limit=RELEASE_STEP))
        assert sum(released) == width and store.release_backlog() == 0, released
        assert self.counts() == counted(succeeded=1, pending=width)
        assert store.release_dependents(limit=RELEASE_STEP) == 0

    # -- only the store moves a task out of WAITING -----------------------------------------------

    def test_a_save_into_or_out_of_waiting_is_refused_but_an_end_is_not(self) -> None:
        if self._deps() is None:
            return
        self.put(node("p"), child("c", "p"), node("x", created=2))
        waiting = self.store.get("c")
        assert waiting is not None
        for status in (PENDING, RUNNING, TaskStatus.PAUSED):
            moved = waiting.evolve(status=status, status_version=2)
            error = raises(WaitingMove, self.store.save, moved, expect_version=1)
            assert (error.task_id, error.stored, error.given) == ("c", "waiting", status.value)
        plain = self.store.get("x")
        assert plain is not None
        into = plain.evolve(status=W, status_version=2, parents=("p",))
        raises(WaitingMove, self.store.save, into, expect_version=1)
        assert self._status("c") == (W, 1) and self._status("x") == (PENDING, 1)
        # A save that stays WAITING may change other fields; never the parents or the policy.
        self.store.save(waiting.evolve(status_version=2, tags=frozenset({"t"}), parents=("x",),
                                       on_parent_failure="run"), expect_version=1)  # fmt: skip
        kept = self.store.get("c")
        assert kept is not None and kept.tags == {"t"}
        assert (kept.parents, kept.on_parent_failure) == (("p",), "stop")
        self._end("c", STOPPED)  # a stop by hand: an end, allowed
        self._end("p", SUCCEEDED)
        assert self._status("c") == (STOPPED, 3)  # the parent's end no longer applies
        assert self._exits("c") == []  # the store wrote no move of its own

    def test_refused_commit_items_write_nothing_and_the_others_apply(self) -> None:
        store = self._deps()
        if store is None or not isinstance(store, BatchingStore):
            return
        self.put(node("p"), child("c", "p"))
        waiting = self.store.get("c")
        assert waiting is not None
        results = store.commit_tasks([
            (waiting.evolve(status=PENDING, status_version=2), 1, []),
            (child("d", "nope"), None, []),
            (child("e", "p"), None, []),
        ])  # fmt: skip
        assert isinstance(results[0], WaitingMove) and isinstance(results[1], ParentNotFound)
        assert results[2] is None
        assert self._status("c") == (W, 1) and self.store.get("d") is None
        assert self.store.history("c") == []

    # -- retention --------------------------------------------------------------------------------

    def test_a_finished_parent_is_kept_while_a_child_that_depends_on_it_is_unfinished(
        self,
    ) -> None:
        if self._deps() is None:
            return
        self.put(node("p", RUNNING, retention=1.0), node("old", SUCCEEDED, created=-5))
        self.put(child("c", "p"))
        self._end("p", SUCCEEDED, updated_at=at(2))
        assert self._status("c") == (PENDING, 2)
        assert self.store.prune(keep_terminal=0) == 1  # "old" only
        assert self.store.get("p") is not None
        if isinstance(self.store, TaskPoliciesStore):
            assert self.store.expire_finished(now=at(10_000)) == []
            assert self.store.expiry_backlog(now=at(10_000))[0] == 0
        self._end("c", RUNNING)
        assert self.store.prune(keep_terminal=0) == 0
        self._end("c", SUCCEEDED)
        if isinstance(self.store, TaskPoliciesStore):  # its retention ran out long ago
            assert self.store.expire_finished(now=at(10_000)) == ["p"]
        expired = isinstance(self.store, TaskPoliciesStore)
        assert self.store.prune(keep_terminal=0) == (1 if expired else 2)
        assert self.store.get("p") is None and self.store.get("c") is None

    # -- bad input --------------------------------------------------------------------------------

    def test_release_dependents_refuses_bad_limits_and_a_closed_store(self) -> None:
        store = self._deps()
        if store is None:
            return
        for bad in (0, 1001, -1):
            raises(ValueError, store.release_dependents, limit=bad)
        for wrong in (True, 1.0, "5"):
            raises(TypeError, store.release_dependents, limit=wrong)
        assert store.release_dependents(limit=1000) == 0
        self.close_store()
        raises(StoreClosed, store.release_dependents)
        raises(StoreClosed, store.release_backlog)
