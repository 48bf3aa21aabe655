"""The start order of ``BatchingStore.start_tasks`` (``model.start_rank``): among the due
``PENDING`` tasks of the given buckets, higher ``priority`` first, then the one due earliest
(``max(created_at, not_before)``, whole milliseconds), then ``task_id``; a task not yet due
never holds back a due one, however many wait in front of it. Mixed into
``ExtensionsContract``; each test returns at once when the store does not batch starts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.stores.extensions import BatchingStore
from chongming_redis.testing.contract.support import PENDING, RUNNING, ContractBase, at

P, R = PENDING, RUNNING


def _task(task_id: str, created: float = 0.0, **fields: Any) -> TaskSnapshot:
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, fields.pop("name", "job"), P, 1, at(created), **fields)


class StartOrderContract(ContractBase):
    def _batching(self) -> BatchingStore | None:
        return self.store if isinstance(self.store, BatchingStore) else None

    def _start(self, store: BatchingStore, **options: Any) -> list[str]:
        args: dict[str, Any] = {"owner": "w1", "now": at(100), "lease_until": at(130),
                                "buckets": [0]}  # fmt: skip
        return [s.task_id for s in store.start_tasks(**{**args, **options})]

    def test_delayed_tasks_in_front_of_a_due_one_in_every_bucket_never_hold_it_back(self) -> None:
        """Eight buckets, each with six older tasks not yet due in front of one due task: every
        call, whatever its limit, starts due tasks only, and all of them."""
        if (store := self._batching()) is None:
            return
        buckets = list(range(8))
        for b in buckets:
            self.put(*(_task(f"late-{b}-{i}", created=i / 10, bucket=b, not_before=at(500))
                       for i in range(6)))  # fmt: skip
            self.put(_task(f"due-{b}", created=1 + b / 100, bucket=b))
        assert self._start(store, buckets=buckets, limit=1) == ["due-0"]
        assert self._start(store, buckets=buckets, limit=3) == ["due-1", "due-2", "due-3"]
        assert self._start(store, buckets=buckets, limit=10) == [f"due-{b}" for b in range(4, 8)]
        assert self._start(store, buckets=buckets) == [], "nothing else is due"
        assert self.store.counts()[P] == 48 and self.store.counts()[R] == 8
        later = self._start(store, buckets=buckets, now=at(500), limit=100)
        assert sorted(later) == sorted(f"late-{b}-{i}" for b in buckets for i in range(6))

    def test_higher_priority_starts_first_within_a_call_and_across_buckets(self) -> None:
        if (store := self._batching()) is None:
            return
        self.put(_task("low", created=0, priority=-5, bucket=1), _task("zero", created=1),
                 _task("top", created=9, priority=100, bucket=2),
                 _task("high", created=5, priority=3, bucket=1),
                 _task("high-later", created=6, priority=3),
                 _task("bottom", created=0.5, priority=-100, bucket=2))  # fmt: skip
        assert self._start(store, buckets=[0, 1, 2], limit=3) == ["top", "high", "high-later"]
        assert self._start(store, buckets=[0, 1, 2], limit=2) == ["zero", "low"]
        assert self._start(store, buckets=[0, 1, 2]) == ["bottom"]

    def test_a_higher_priority_task_not_yet_due_waits_and_then_goes_first(self) -> None:
        if (store := self._batching()) is None:
            return
        self.put(_task("urgent-later", created=0, priority=50, not_before=at(200)),
                 _task("a", created=1), _task("b", created=2))  # fmt: skip
        assert self._start(store, limit=1) == ["a"]
        assert self._start(store, now=at(200), limit=1) == ["urgent-later"]
        assert self._start(store, now=at(200)) == ["b"]

    def test_equal_priorities_start_first_come_first_served_by_when_they_became_due(
        self,
    ) -> None:
        """FIFO among equals: by ``max(created_at, not_before)``; within one millisecond by id
        (a tie is stable: the same every call)."""
        if (store := self._batching()) is None:
            return
        self.put(_task("retry", created=0, not_before=at(3)), _task("second", created=2),
                 _task("first", created=1), _task("fourth", created=4),
                 _task("tie-b", created=5.0001), _task("tie-a", created=5.0004),
                 _task("fifth", created=3.5),
                 _task("unseen", created=4.5, name="other"))  # fmt: skip
        order = self._start(store, names=["job"], limit=100)
        assert order == ["first", "second", "retry", "fifth", "fourth", "tie-a", "tie-b"]

    def test_a_retry_keeps_its_priority_and_goes_before_older_tasks_of_lower_priority(
        self,
    ) -> None:
        if (store := self._batching()) is None:
            return
        self.put(_task("vip", created=10, priority=7), _task("old", created=0))
        (started,) = store.start_tasks(owner="w1", now=at(100), lease_until=at(130),
                                       buckets=[0], limit=1)  # fmt: skip
        assert started.task_id == "vip" and started.priority == 7
        retry = replace(started, status=P, status_version=started.status_version + 1,
                        updated_at=at(101), attempt=2, not_before=at(110))  # fmt: skip
        self.store.save(retry, expect_version=started.status_version)
        self.store.append(Transition("vip", retry.status_version, R, P, at(101), "retry"))
        stored = self.store.get("vip")
        assert stored is not None and stored.priority == 7
        assert self._start(store, now=at(105)) == ["old"], "the retry is not due yet"
        self.put(_task("young", created=50))
        assert self._start(store, now=at(110), limit=1) == ["vip"]
        assert self._start(store, now=at(110)) == ["young"]

    def test_a_saved_priority_change_moves_the_task_in_the_start_order(self) -> None:
        if (store := self._batching()) is None:
            return
        self.put(_task("a", created=0), _task("b", created=1), _task("c", created=2))
        c = self.store.get("c")
        assert c is not None
        self.store.save(replace(c, priority=1, status_version=2), expect_version=1)
        a = self.store.get("a")
        assert a is not None
        self.store.save(replace(a, priority=-1, status_version=2), expect_version=1)
        assert self._start(store, limit=100) == ["c", "b", "a"]
        assert [self.store.get(t).priority for t in "abc"] == [-1, 0, 1]  # type: ignore[union-attr]

    def test_a_batch_takes_the_best_tasks_even_when_they_crowd_one_bucket(self) -> None:
        """Four high-priority tasks in one bucket, two low ones in each of three others: a call
        of limit 4 takes the four high ones (a store that reads a few heads per bucket takes
        two of them and two low ones)."""
        if (store := self._batching()) is None:
            return
        self.put(*(_task(f"hi-{i}", created=i, priority=10) for i in range(4)))
        self.put(*(_task(f"lo-{b}-{i}", created=i, bucket=b) for b in (1, 2, 3) for i in range(2)))
        assert self._start(store, buckets=[0, 1, 2, 3], limit=4) == [f"hi-{i}" for i in range(4)]
        assert self._start(store, buckets=[0, 1, 2, 3], limit=2) == ["lo-1-0", "lo-2-0"]

    def test_due_delayed_tasks_start_by_priority_not_by_when_they_came_due(self) -> None:
        """Three delayed tasks all due by now, the latest due with the highest priority: one
        at a time, it starts first (a store that moves due tasks over a few at a time, earliest
        due first, starts the other two before it)."""
        if (store := self._batching()) is None:
            return
        self.put(_task("a", not_before=at(1)), _task("b", not_before=at(2)),
                 _task("c", priority=50, not_before=at(3)))  # fmt: skip
        assert [self._start(store, limit=1) for _ in range(4)] == [["c"], ["a"], ["b"], []]
