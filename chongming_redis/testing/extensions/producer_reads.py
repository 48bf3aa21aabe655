"""The contract of what a producer reads (``CommandReadingStore.get_command``,
``RecordedBucketsStore.recorded_num_buckets``, ``TaskTypesStore``): mixed into
``ExtensionsContract``. Each test returns at once when the store does not implement the
extension it checks."""

from __future__ import annotations

from datetime import timedelta

from chongming_redis.errors import StoreClosed
from chongming_redis.model import Command, CommandKind
from chongming_redis.stores.extensions import (
    BucketPoolStore,
    CommandReadingStore,
    RecordedBucketsStore,
    TaskTypesStore,
)
from chongming_redis.testing.contract.support import T0, ContractBase, at, raises


def command(command_id: str, created: float = 0.0, **fields: object) -> Command:
    return Command(command_id, "t-1", CommandKind.STOP, at(created), issued_by="ops",
                   **fields)  # type: ignore[arg-type]  # fmt: skip


class ProducerReadsContract(ContractBase):
    def command_reader(self) -> CommandReadingStore | None:
        return self.store if isinstance(self.store, CommandReadingStore) else None

    def test_get_command_reads_a_command_back_as_it_moves_and_never_claims_it(self) -> None:
        if (store := self.command_reader()) is None:
            return
        assert store.get_command("c-1") is None  # unknown: None, not an error
        self.store.submit_command(command("c-1"))
        self.store.submit_command(command("c-2", created=1.0, payload={"why": "test"}))
        assert store.get_command("c-1") == command("c-1")
        assert store.get_command("c-1") == command("c-1")  # reading twice changes nothing
        assert store.get_command("c-2") == command("c-2", created=1.0, payload={"why": "test"})
        assert store.get_command("c-10") is None and store.get_command("c") is None  # exact ids
        claimed = self.store.claim_commands(now=at(5), lease_seconds=30, limit=1)
        assert [c.command_id for c in claimed] == ["c-1"]  # the reads took no lease
        assert store.get_command("c-1") == command("c-1", lease_until=at(35))
        self.store.complete_command("c-1", now=at(6), outcome="stopped")
        done = store.get_command("c-1")
        assert done is not None and (done.finished_at, done.outcome) == (at(6), "stopped")
        assert store.get_command("c-2") == command("c-2", created=1.0, payload={"why": "test"})

    def test_get_command_refuses_bad_ids_and_a_closed_store(self) -> None:
        if (store := self.command_reader()) is None:
            return
        raises(ValueError, store.get_command, "")
        raises(TypeError, store.get_command, 7)
        self.close_store()
        raises(StoreClosed, store.get_command, "c-1")

    def test_recorded_num_buckets_is_what_the_first_pool_member_recorded(self) -> None:
        if not isinstance(self.store, RecordedBucketsStore):
            return
        assert self.store.recorded_num_buckets() is None  # nobody joined yet
        if isinstance(self.store, BucketPoolStore):
            self.store.pool_tick(worker="w1", now=T0, lease_seconds=5, num_buckets=8,
                                 wanted=[0])  # fmt: skip
            assert self.store.recorded_num_buckets() == 8
            later = T0 + timedelta(seconds=1)
            self.store.pool_tick(worker="w1", now=later, lease_seconds=5, num_buckets=8, wanted=[])
            assert self.store.recorded_num_buckets() == 8
        self.close_store()
        raises(StoreClosed, self.store.recorded_num_buckets)

    def test_task_types_are_a_union_of_what_workers_recorded(self) -> None:
        if not isinstance(self.store, TaskTypesStore):
            return
        assert self.store.task_types() == frozenset()  # nobody recorded any
        self.store.record_task_types(["resize", "crop"])
        self.store.record_task_types(["resize"])  # a second worker of the same app
        self.store.record_task_types({"mail"})  # a worker of another app
        self.store.record_task_types([])  # nothing: writes nothing
        assert self.store.task_types() == frozenset({"resize", "crop", "mail"})
        assert self.store.task_types() == frozenset({"resize", "crop", "mail"})  # a read twice

    def test_task_types_refuse_bad_names_whole_and_a_closed_store(self) -> None:
        if not isinstance(self.store, TaskTypesStore):
            return
        raises(TypeError, self.store.record_task_types, "resize")  # a str is not a collection
        raises(ValueError, self.store.record_task_types, ["fine", ""])
        raises(TypeError, self.store.record_task_types, ["fine", 7])
        assert self.store.task_types() == frozenset()  # nothing of a refused call
        self.close_store()
        raises(StoreClosed, self.store.record_task_types, ["resize"])
        raises(StoreClosed, self.store.task_types)
