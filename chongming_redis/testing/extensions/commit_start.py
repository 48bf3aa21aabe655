"""``CommitStartStore.commit_and_start`` (``stores/commit_start.py``): the commit of a group of
finished tasks, then the start of as many tasks as the commit moved out of ``RUNNING``, in one
atomic step. Mixed into ``ExtensionsContract``; each test returns at once when the store does
not implement it."""

from __future__ import annotations

from typing import Any

from chongming_redis.errors import ConcurrencyConflict, StoreError
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.commit_start import CommitStartStore
from chongming_redis.testing.contract.support import (
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
    counted,
    raises,
    snapshot,
)

P, R = PENDING, RUNNING


def _running(task_id: str, version: int = 2, **fields: Any) -> TaskSnapshot:
    return snapshot(task_id, status=R, version=version, lease_owner="w1", lease_until=at(130),
                    **fields)  # fmt: skip


def _end(held: TaskSnapshot, to: TaskStatus, **changes: Any) -> tuple[Any, ...]:
    """A commit item that moves ``held`` (as stored) to ``to``, with its history entry."""
    version = held.status_version + 1
    moved = held.evolve(status=to, status_version=version, updated_at=at(90), **changes)
    return (moved, held.status_version, [Transition(held.task_id, version, held.status, to,
                                                    at(90), "ended")])  # fmt: skip


class CommitStartContract(ContractBase):
    def _commit_start(self) -> CommitStartStore | None:
        return self.store if isinstance(self.store, CommitStartStore) else None

    def _call(
        self, store: CommitStartStore, items: list[Any], **options: Any
    ) -> tuple[list[StoreError | None], list[str]]:
        args: dict[str, Any] = {"owner": "w1", "now": at(100), "lease_until": at(130),
                                "buckets": [0], "limit": 10}  # fmt: skip
        results, started = store.commit_and_start(items, **{**args, **options})
        assert isinstance(started, list), started
        return results, [snapshot.task_id for snapshot in started]

    def test_a_commit_and_start_ends_the_tasks_then_starts_as_many_in_start_order(self) -> None:
        if (store := self._commit_start()) is None:
            return
        done, broken = _running("done"), _running("broken")
        self.put(done, broken, snapshot("p-late", created=3), snapshot("p-first", created=1),
                 snapshot("p-urgent", created=5, priority=9))  # fmt: skip
        results, started = self._call(store, [_end(done, SUCCEEDED), _end(broken, FAILED)])
        assert results == [None, None]
        assert started == ["p-urgent", "p-first"], "two ended: two started, in start order"
        assert self.store.counts() == counted(pending=1, running=2, succeeded=1, failed=1)
        first = self.store.get("p-first")
        assert first is not None and first.status is R and first.status_version == 2
        assert (first.lease_owner, first.lease_until, first.updated_at) == ("w1", at(130), at(100))
        assert [t.reason for t in self.store.history("p-first")][-1] == "started by w1 (attempt 1)"
        assert [t.version for t in self.store.history("done")] == [3]
        again, more = self._call(store, [])
        assert (again, more) == ([], []), "no items: nothing ended, nothing started"

    def test_only_items_that_leave_running_free_a_start(self) -> None:
        """A save that keeps a task ``RUNNING`` (its progress), a save of a ``PENDING`` task
        and a conflicting end free nothing: nothing starts, whatever the limit."""
        if (store := self._commit_start()) is None:
            return
        busy, queued, stale = _running("busy"), snapshot("queued"), _running("stale", 4)
        self.put(busy, queued, stale, snapshot("waiting-start", created=1))
        items = [
            (busy.evolve(status_version=3, updated_at=at(90)), 2, []),
            (queued.evolve(status_version=2, priority=3, updated_at=at(90)), 1, []),
            _end(stale.evolve(status_version=3), SUCCEEDED),  # expects 3: stored 4
        ]
        results, started = self._call(store, items)
        assert results[:2] == [None, None] and isinstance(results[2], ConcurrencyConflict)
        assert started == []
        assert self.store.counts() == counted(pending=2, running=2)

    def test_the_limit_caps_the_starts_below_what_the_commit_freed(self) -> None:
        if (store := self._commit_start()) is None:
            return
        held = [_running(f"r{i}") for i in range(3)]
        self.put(*held, *(snapshot(f"p{i}", created=i) for i in range(4)))
        results, started = self._call(store, [_end(h, SUCCEEDED) for h in held], limit=1)
        assert results == [None] * 3 and started == ["p0"]
        assert self.store.counts() == counted(pending=3, running=1, succeeded=3)

    def test_the_start_sees_what_the_commit_wrote(self) -> None:
        """The commit applies first: a task it retries into ``PENDING`` with a higher priority
        than every queued task is the one the start takes (a new attempt, one version up)."""
        if (store := self._commit_start()) is None:
            return
        retried = _running("retried", attempt=1)
        self.put(retried, snapshot("queued", created=1))
        item = _end(retried, P, priority=50, attempt=2, lease_owner=None, lease_until=None)
        results, started = self._call(store, [item], limit=1)
        assert results == [None] and started == ["retried"]
        again = self.store.get("retried")
        assert again is not None and again.status is R and again.status_version == 4
        assert again.attempt == 2 and self.store.get("queued").status is P  # type: ignore[union-attr]

    def test_bad_items_or_start_arguments_write_nothing(self) -> None:
        if (store := self._commit_start()) is None:
            return
        held = _running("held")
        self.put(held, snapshot("queued", created=1))
        before = (self.store.get("held"), self.store.get("queued"), self.store.counts())
        raises(TypeError, store.commit_and_start, "not a list", owner="w1", now=at(100),
               lease_until=at(130), buckets=[0])  # fmt: skip
        for bad in ({"limit": 0}, {"limit": 101}, {"owner": ""}, {"buckets": [-1]}):
            options: dict[str, Any] = {"owner": "w1", "now": at(100), "lease_until": at(130),
                                       "buckets": [0], **bad}  # fmt: skip
            raises((ValueError, TypeError), store.commit_and_start,  # type: ignore[arg-type]
                   [_end(held, SUCCEEDED)], **options)  # fmt: skip
        assert (self.store.get("held"), self.store.get("queued"), self.store.counts()) == before
