"""``ExtensionsContract``: the executable contract of the optional store extensions.

Bind it like ``StoreContract``, and declare which extensions the store implements::

    from chongming_redis.testing.extensions_contract import ExtensionsContract

    class TestMyStoreExtensions(ExtensionsContract):
        expected_extensions = frozenset({"FencedTouchStore", "ServerClockStore"})

        def make_store(self) -> TaskStore:
            return MyStore(...)  # a fresh, isolated, empty store on every call

The first test fails unless the store implements exactly ``expected_extensions`` (names of
``stores/extensions.py``), so an extension that silently went missing (a renamed method, a
changed signature seen by ``isinstance``) cannot pass as "skipped". Every other test checks one
extension and returns at once when the store does not implement it. No test framework is
imported: plain ``assert``, and the ``raises``, fixed instants and store fixture
(``setup_method``/``teardown_method``) that ``StoreContract`` uses (``contract/support.py``).
Times are fixed instants, except ``server_time``, which is compared with this process's clock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from chongming_redis.errors import (
    ConcurrencyConflict,
    StoreClosed,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.model import Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.extensions import (
    EXTENSION_METHODS,
    EXTENSIONS,
    BatchingStore,
    BucketCountingStore,
    BucketPoolStore,
    FencedTouchStore,
    NudgeStore,
    ServerClockStore,
    extensions_of,
)
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.contract.support import (
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    T0,
    ContractBase,
    at,
    counted,
    raises,
)
from chongming_redis.testing.extensions.dashboard_reads import DashboardReadsContract
from chongming_redis.testing.extensions.paged_queries import PagedQueryContract
from chongming_redis.testing.extensions.producer_reads import ProducerReadsContract

__all__ = ["ExtensionsContract"]

P, R, PA, OK = PENDING, RUNNING, PAUSED, SUCCEEDED


def task(task_id: str, status: TaskStatus = P, version: int = 1, created: float = 0.0,
         **fields: Any) -> TaskSnapshot:  # fmt: skip
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, fields.pop("name", "job"), status, version, at(created), **fields)


def entry(task_id: str, version: int, to: TaskStatus = P, reason: str | None = None) -> Transition:
    before = None if version == 1 else P
    return Transition(task_id, version, before, to, at(version), reason)


class ExtensionsContract(
    ProducerReadsContract, PagedQueryContract, DashboardReadsContract, ContractBase
):
    """The extensions' contract as test methods. Define ``make_store`` and
    ``expected_extensions``. The store fixture (``setup_method``/``teardown_method``) and the
    helpers ``close_store``/``put`` are ``StoreContract``'s (``contract/support.py``)."""

    expected_extensions: frozenset[str] = frozenset()

    def make_store(self) -> TaskStore:
        raise NotImplementedError("bind ExtensionsContract: define make_store() in the subclass")

    # -- which extensions ------------------------------------------------------------------

    def test_the_store_implements_exactly_the_declared_extensions(self) -> None:
        assert set(self.expected_extensions) <= set(EXTENSIONS), "unknown extension names"
        assert extensions_of(self.store) == self.expected_extensions
        for name in self.expected_extensions:
            for member in EXTENSION_METHODS[name]:
                assert hasattr(self.store, member), (name, member)

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
        assert self.store.counts() == counted(pending=1)

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
        if (store := self.batching()) is None:
            return
        self.put(task("late", created=1, not_before=at(100.000001)),
                 task("due", created=2, not_before=at(100)), task("d", created=3),
                 task("c", created=3), task("old", created=0.5), task("e", created=4))  # fmt: skip
        assert self.start(store, limit=3) == ["old", "due", "c"]
        assert self.start(store, limit=3) == ["d", "e"]
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

    # -- FencedTouchStore --------------------------------------------------------------------

    def fenced(self) -> FencedTouchStore | None:
        return self.store if isinstance(self.store, FencedTouchStore) else None

    def test_a_fenced_touch_applies_on_its_version_and_never_bumps_it(self) -> None:
        if (store := self.fenced()) is None:
            return
        self.put(task("a", R, 3))
        assert store.touch_fenced("a", expect_version=3, lease_owner="w1", lease_until=at(30))
        assert store.touch_fenced("a", expect_version=3, progress=Progress(1, 2), heartbeat_at=T0)
        expected = task("a", R, 3, lease_owner="w1", lease_until=at(30),
                        progress=Progress(1, 2), heartbeat_at=T0)  # fmt: skip
        assert self.store.get("a") == expected

    def test_a_fenced_touch_on_another_version_or_missing_task_writes_nothing(self) -> None:
        if (store := self.fenced()) is None:
            return
        self.put(task("a", R, 3))
        self.store.touch("a", lease_owner="new", lease_until=at(60))
        before = self.store.get("a")
        assert (
            store.touch_fenced("a", expect_version=2, lease_owner="old", lease_until=at(9)) is False
        )
        assert store.touch_fenced("a", expect_version=4, progress=Progress(9)) is False
        assert self.store.get("a") == before
        assert store.touch_fenced("nope", expect_version=1, heartbeat_at=T0) is False
        assert self.store.get("nope") is None
        raises(TypeError, store.touch_fenced, "a", expect_version="3", heartbeat_at=T0)
        self.close_store()
        raises(StoreClosed, store.touch_fenced, "a", expect_version=3, heartbeat_at=T0)

    def test_a_fenced_touch_checks_nothing_but_the_version(self) -> None:
        if (store := self.fenced()) is None:
            return
        self.put(task("a", PA, 3), task("b", OK, 4))
        self.store.touch("a", lease_owner="old", lease_until=at(999))
        assert store.touch_fenced("a", expect_version=3, lease_owner="new", lease_until=at(5))
        assert self.store.get("a") == task("a", PA, 3, lease_owner="new", lease_until=at(5))
        assert store.touch_fenced("b", expect_version=4, heartbeat_at=at(7))
        assert self.store.get("b") == task("b", OK, 4, heartbeat_at=at(7))

    # -- ServerClockStore --------------------------------------------------------------------

    def test_server_time_is_an_aware_utc_now(self) -> None:
        if not isinstance(self.store, ServerClockStore):
            return
        moment = self.store.server_time()
        assert moment.tzinfo is not None and moment.utcoffset() == timedelta(0)
        assert abs((moment - datetime.now(timezone.utc)).total_seconds()) < 60
        self.close_store()
        raises(StoreClosed, self.store.server_time)

    # -- BucketCountingStore -----------------------------------------------------------------

    def test_bucket_counts_follow_every_write_and_list_zeros(self) -> None:
        if not isinstance(self.store, BucketCountingStore):
            return
        counts = self.store.bucket_counts
        assert all(per == counted() for per in counts().values())
        self.put(task("a", R, 2, bucket=1), task("b", bucket=1), task("c", R, 2, bucket=7))
        self.store.save(task("c", OK, 3, bucket=7), expect_version=2)
        assert counts()[1] == counted(running=1, pending=1)
        assert counts()[7] == counted(succeeded=1)
        if (store := self.batching()) is not None:
            store.commit_tasks(
                [(task("d", bucket=7), None, []), (task("a", OK, 3, bucket=1), 2, [])]
            )
            self.start(store, buckets=[1])
            assert counts()[1] == counted(running=1, succeeded=1)
            assert counts()[7] == counted(succeeded=1, pending=1)
        assert self.store.prune(keep_terminal=0) >= 1
        assert counts().get(7, counted())[OK] == 0 and counts().get(1, counted())[OK] == 0
        self.close_store()
        raises(StoreClosed, counts)

    def test_bucket_counts_follow_a_task_that_changes_bucket(self) -> None:
        if not isinstance(self.store, BucketCountingStore):
            return
        counts = self.store.bucket_counts
        self.put(task("a", bucket=1))
        self.store.save(task("a", R, 2, bucket=2), expect_version=1)
        assert counts()[2] == counted(running=1)
        assert counts().get(1, counted()) == counted()
        if (store := self.batching()) is not None:
            assert store.commit_tasks([(task("a", OK, 3, bucket=3), 2, [])]) == [None]
            assert counts()[3] == counted(succeeded=1)
            assert counts().get(2, counted()) == counted()

    # -- BucketPoolStore ---------------------------------------------------------------------

    def pool(self) -> BucketPoolStore | None:
        return self.store if isinstance(self.store, BucketPoolStore) else None

    def test_pool_ticks_take_free_buckets_and_never_give_one_two_owners(self) -> None:
        if (store := self.pool()) is None:
            return
        now = T0.replace(microsecond=0)
        tick = store.pool_tick
        held, live = tick(worker="w1", now=now, lease_seconds=5, num_buckets=4, wanted=[0, 1])
        assert sorted(held) == [0, 1] and live == ["w1"]
        held, live = tick(worker="w2", now=now, lease_seconds=5, num_buckets=4, wanted=[1, 2])
        assert sorted(held) == [2] and sorted(live) == ["w1", "w2"]
        workers, owners = store.pool_state()
        assert workers == {"w1": now + timedelta(seconds=5), "w2": now + timedelta(seconds=5)}
        assert owners == {0: "w1", 1: "w1", 2: "w2"}
        assert tick(worker="w1", now=now, lease_seconds=5, num_buckets=4, wanted=[0],
                    leaving=True)[0] == []  # fmt: skip
        assert store.pool_state()[1] == {2: "w2"}
        later = now + timedelta(seconds=6)  # w2's leases have expired
        held, live = tick(worker="w3", now=later, lease_seconds=5, num_buckets=4, wanted=[2, 3])
        assert sorted(held) == [2, 3] and live == ["w3"]

    def test_a_pool_tick_with_another_num_buckets_is_refused_and_writes_nothing(self) -> None:
        if (store := self.pool()) is None:
            return
        now = T0.replace(microsecond=0)
        store.pool_tick(worker="w1", now=now, lease_seconds=5, num_buckets=4, wanted=[0])
        before = store.pool_state()
        raises(StoreError, store.pool_tick, worker="w2", now=now, lease_seconds=5,
               num_buckets=8, wanted=[1])  # fmt: skip
        assert store.pool_state() == before

    # -- NudgeStore --------------------------------------------------------------------------

    def test_the_nudge_channel_names_a_namespace_and_a_client(self) -> None:
        if not isinstance(self.store, NudgeStore):
            return
        nudge = cast(NudgeStore, self.store)
        assert isinstance(nudge.namespace, str) and nudge.namespace
        assert callable(nudge.client.publish) and callable(nudge.client.pubsub)
        assert isinstance(nudge.publishes_work, bool)

    def test_a_store_that_publishes_work_does_so_for_each_create_and_only_then(self) -> None:
        if not isinstance(self.store, NudgeStore) or not self.store.publishes_work:
            return
        nudge = cast(Any, self.store)
        listener = nudge.client.pubsub(ignore_subscribe_messages=True)
        channel = "{" + nudge.namespace + "}:nudge:work"
        listener.subscribe(channel)
        try:
            listener.get_message(timeout=1.0)  # the subscription is in place

            def published() -> int:
                count = 0
                while listener.get_message(timeout=0.2) is not None:
                    count += 1
                return count

            nudge.create(task("n1"))
            assert published() == 1
            if isinstance(self.store, BatchingStore):
                nudge.commit_tasks([(task("n2"), None, [entry("n2", 1)]),
                                    (task("n3"), None, [])])  # fmt: skip
                assert published() >= 1  # one call: at least one nudge
                running = replace(task("n2"), status=TaskStatus.RUNNING, status_version=2)
                nudge.commit_tasks([(running, 1, [entry("n2", 2, TaskStatus.RUNNING)])])
                assert published() == 0  # a save creates nothing: no nudge
            nudge.save(replace(task("n1"), status_version=2), expect_version=1)
            raises(TaskAlreadyExists, nudge.create, task("n1", version=2))
            assert published() == 0  # neither a save nor a refused create
        finally:
            listener.close()
