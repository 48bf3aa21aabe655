"""The contract of ``BatchingStore`` (``commit_tasks``: many creates and saves in one atomic
step per item; ``start_tasks``: PENDING -> RUNNING for due tasks of given buckets): mixed into
``ExtensionsContract``. Each test returns at once when the store does not implement it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from chongming_redis.errors import ConcurrencyConflict, StoreClosed, TaskAlreadyExists
from chongming_redis.model import Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.extensions import BatchingStore
from chongming_redis.testing.contract.support import (
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
    counted,
    raises,
)

P, R, PA, OK = PENDING, RUNNING, PAUSED, SUCCEEDED


def task(task_id: str, status: TaskStatus = P, version: int = 1, created: float = 0.0,
         **fields: Any) -> TaskSnapshot:  # fmt: skip
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, fields.pop("name", "job"), status, version, at(created), **fields)


def entry(task_id: str, version: int, to: TaskStatus = P, reason: str | None = None) -> Transition:
    before = None if version == 1 else P
    return Transition(task_id, version, before, to, at(version), reason)


class BatchingContract(ContractBase):
    # -- BatchingStore.commit_tasks ---------------------------------------------------------

    def batching(self) -> BatchingStore | None:
        return self.store if isinstance(self.store, BatchingStore) else None

    def test_commit_with_no_expected_version_creates_the_task_with_its_history(self) -> None:
        if (store := self.batching()) is None:
            return
        fresh = task("a", lease_owner="w1", lease_until=at(30))  # a create writes the lease
        assert store.commit_tasks([(fresh, None, [entry("a", 1)])]) == [None]
        assert self.store.get("a") == fresh
        assert self.store.history("a") == [entry("a", 1)]
        assert self.store.counts()[P] == 1
        assert store.commit_tasks([]) == []

    def test_commit_of_an_existing_id_is_task_already_exists_and_writes_nothing(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("a"))
        (error,) = store.commit_tasks([(task("a", bucket=5), None, [entry("a", 1, reason="x")])])
        assert isinstance(error, TaskAlreadyExists) and error.task_id == "a"
        assert self.store.get("a") == task("a") and self.store.history("a") == []

    def test_commit_saves_by_compare_and_set_and_keeps_the_stored_lease(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("a"))
        self.store.touch("a", lease_owner="w1", lease_until=at(30))
        running = task("a", R, 2, updated_at=at(2), lease_owner="other", lease_until=at(99))
        assert store.commit_tasks([(running, 1, [entry("a", 2, R)])]) == [None]
        assert self.store.get("a") == replace(running, lease_owner="w1", lease_until=at(30))
        assert self.store.history("a") == [entry("a", 2, R)]
        assert self.store.counts()[R] == 1 and self.store.counts()[P] == 0

    def test_a_conflicting_item_writes_nothing_and_the_others_still_apply(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("a", R, 3), task("b"), task("c"))
        items = [
            (task("a", OK, 5), 2, [entry("a", 5, OK)]),  # stale expectation
            (task("b", R, 2), 1, [entry("b", 2, R)]),
            (task("gone", R, 2), 1, [entry("gone", 2, R)]),  # missing: a conflict too
            (task("new"), None, [entry("new", 1)]),
            (task("c", R), None, []),  # exists
        ]
        a, b, gone, new, exists = store.commit_tasks(items)
        assert isinstance(a, ConcurrencyConflict) and (a.expected, a.actual) == (2, 3)
        assert isinstance(gone, ConcurrencyConflict) and gone.actual is None
        assert b is None and new is None and isinstance(exists, TaskAlreadyExists)
        assert self.store.get("a") == task("a", R, 3) and self.store.history("a") == []
        assert self.store.get("gone") is None and self.store.history("gone") == []
        assert self.store.get("b") == task("b", R, 2) and self.store.get("new") == task("new")
        assert self.store.history("b") == [entry("b", 2, R)]

    def test_committed_history_entries_are_idempotent(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("a"))
        self.store.append(entry("a", 2, R, reason="first"))
        items = [(task("a", R, 3), 1, [entry("a", 2, R, reason="second"), entry("a", 3, R)])]
        assert store.commit_tasks(items) == [None]
        assert self.store.history("a") == [entry("a", 2, R, reason="first"), entry("a", 3, R)]

    def test_bad_items_are_refused_before_anything_is_written(self) -> None:
        if (store := self.batching()) is None:
            return
        good = (task("ok"), None, [entry("ok", 1)])
        raises(ValueError, store.commit_tasks, [good, (task("x", R, 2), 2, [])])  # version
        raises(ValueError, store.commit_tasks, [good, (task("y"), None, [entry("z", 1)])])
        raises(TypeError, store.commit_tasks, [good, ("not a snapshot", None, [])])
        assert self.store.get("ok") is None and self.store.history("ok") == []
        self.close_store()
        raises(StoreClosed, store.commit_tasks, [])

    def test_a_task_named_twice_in_one_call_is_refused_and_nothing_is_written(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("s"))
        twice = [(task("n"), None, []), (task("n"), None, [entry("n", 1)])]
        raises(ValueError, store.commit_tasks, twice)
        saves: list[Any] = [(task("s", R, 2), 1, []), (task("s", OK, 2), 1, [])]
        raises(ValueError, store.commit_tasks, saves)
        raises(ValueError, store.commit_tasks, [(task("n"), None, []), (task("s", R, 2), 1, []),
                                                (task("n"), None, [])])  # fmt: skip
        assert self.store.get("n") is None and self.store.get("s") == task("s")
        assert self.counts() == counted(pending=1)

    # -- BatchingStore.start_tasks ----------------------------------------------------------

    def start(self, store: BatchingStore, **options: Any) -> list[str]:
        args: dict[str, Any] = {"owner": "w1", "now": at(100), "lease_until": at(130),
                                "buckets": [0]}  # fmt: skip
        return [s.task_id for s in store.start_tasks(**{**args, **options})]

    def test_start_moves_pending_tasks_to_running_with_lease_heartbeat_and_history(self) -> None:
        if (store := self.batching()) is None:
            return
        pending = task("a", P, 4, tags=frozenset({"t"}), params={"n": 1}, attempt=2,
                       progress=Progress(1, 2), updated_at=at(3))  # fmt: skip
        self.put(pending)
        (started,) = store.start_tasks(owner="w1", now=at(100), lease_until=at(130), buckets=[0])
        expected = replace(pending, status=R, status_version=5, updated_at=at(100),
                           heartbeat_at=at(100), lease_owner="w1", lease_until=at(130))  # fmt: skip
        assert started == expected and self.store.get("a") == expected
        reason = "started by w1 (attempt 2)"
        assert self.store.history("a") == [Transition("a", 5, P, R, at(100), reason)]
        assert self.store.counts()[R] == 1 and self.store.counts()[P] == 0
        assert [s.task_id for s in self.store.query(TaskQuery(statuses=frozenset({R})))] == ["a"]
        assert self.start(store) == [], "a started task is never started again"
        assert self.store.get("a") == expected

    def test_start_takes_only_pending_tasks_of_the_given_buckets_and_names(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("run", R, 2), task("paused", PA, 2), task("done", OK, 3),
                 task("b1", bucket=1), task("b2", bucket=2), task("other", name="other"),
                 task("p"))  # fmt: skip
        assert self.start(store, buckets=[0], names=["job", "job"]) == ["p"]  # once, not twice
        assert self.store.counts()[R] == 2
        assert self.start(store, buckets=[2, 1, 2]) == ["b1", "b2"]
        assert self.start(store, buckets=[]) == []
        assert self.start(store) == ["other"]
        assert self.store.get("run") == task("run", R, 2)
        assert self.store.get("done") == task("done", OK, 3)

    def test_start_respects_not_before_order_and_limit(self) -> None:
        """Due tasks start in the order they became due (``max(created_at, not_before)``),
        ties by id; a task due exactly ``now`` is due."""
        if (store := self.batching()) is None:
            return
        self.put(task("late", created=1, not_before=at(100.000001)),
                 task("due", created=2, not_before=at(100)), task("d", created=3),
                 task("c", created=3), task("old", created=0.5), task("e", created=4))  # fmt: skip
        assert self.start(store, limit=3) == ["old", "c", "d"]
        assert self.start(store, limit=3) == ["e", "due"]
        assert self.start(store, now=at(101)) == ["late"]

    def test_start_takes_the_oldest_tasks_across_buckets_up_to_the_limit(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("x1", created=1, bucket=1), task("x2", created=0, bucket=2),
                 task("x3", created=2, bucket=1), task("x4", created=3, bucket=2),
                 task("x5", created=4, bucket=1))  # fmt: skip
        assert self.start(store, buckets=[1, 2], limit=2) == ["x2", "x1"]
        assert self.start(store, buckets=[2, 1], limit=2) == ["x3", "x4"]
        assert self.start(store, buckets=[1, 2], limit=2) == ["x5"]

    def test_start_refuses_bad_arguments(self) -> None:
        if (store := self.batching()) is None:
            return
        self.put(task("a"))
        raises(ValueError, self.start, store, limit=0)
        raises(ValueError, self.start, store, limit=101)
        raises(ValueError, self.start, store, owner="")
        raises(ValueError, self.start, store, now=datetime(2024, 1, 1))  # naive
        raises(TypeError, self.start, store, buckets=["0"])
        assert self.store.get("a") == task("a")
        self.close_store()
        raises(StoreClosed, self.start, store)
