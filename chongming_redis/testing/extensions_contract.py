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
    StoreClosed,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.model import Progress, TaskStatus
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
from chongming_redis.testing.extensions.batching import BatchingContract, entry, task
from chongming_redis.testing.extensions.commit_start import CommitStartContract
from chongming_redis.testing.extensions.dashboard_reads import DashboardReadsContract
from chongming_redis.testing.extensions.dependencies import DependenciesContract
from chongming_redis.testing.extensions.limits import LimitsContract
from chongming_redis.testing.extensions.paged_queries import PagedQueryContract
from chongming_redis.testing.extensions.producer_reads import ProducerReadsContract
from chongming_redis.testing.extensions.schedules import SchedulesContract
from chongming_redis.testing.extensions.start_order import StartOrderContract
from chongming_redis.testing.extensions.task_policies import TaskPoliciesContract
from chongming_redis.testing.extensions.task_retention import TaskRetentionContract
from chongming_redis.testing.extensions.task_schemas import TaskSchemasContract

__all__ = ["ExtensionsContract"]

P, R, PA, OK = PENDING, RUNNING, PAUSED, SUCCEEDED


class ExtensionsContract(
    BatchingContract,
    StartOrderContract,
    ProducerReadsContract,
    PagedQueryContract,
    DashboardReadsContract,
    TaskPoliciesContract,
    TaskRetentionContract,
    LimitsContract,
    SchedulesContract,
    DependenciesContract,
    TaskSchemasContract,
    CommitStartContract,
    ContractBase,
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
