"""``save``: compare-and-set, version jumps, conflicts, and the lease it never writes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chongming_redis import (
    ConcurrencyConflict,
    Failure,
    Progress,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.stores.codec import MAX_PAYLOAD_BYTES
from chongming_redis.testing.contract.support import (
    FAILED,
    PAUSED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    ContractBase,
    at,
    counted,
    raises,
    snapshot,
    transition,
)


class SaveRules(ContractBase):
    # -- save --------------------------------------------------------------------------------

    def test_save_with_the_expected_version_replaces_the_task(self) -> None:
        self.put(snapshot("t1"))
        moved = snapshot(
            "t1", status=RUNNING, version=2, tags=frozenset({"x"}), updated_at=at(5), attempt=2
        )
        self.store.save(moved, expect_version=1)
        assert self.store.get("t1") == moved

    def test_save_with_a_stale_version_raises_a_conflict_naming_both_versions(self) -> None:
        self.put(snapshot("t1"))
        self.store.save(snapshot("t1", status=RUNNING, version=2), expect_version=1)
        error = raises(
            ConcurrencyConflict,
            self.store.save,
            snapshot("t1", status=SUCCEEDED, version=3),
            expect_version=1,
        )
        assert isinstance(error, StoreError)
        assert (error.task_id, error.expected, error.actual) == ("t1", 1, 2)

    def test_save_with_an_expected_version_ahead_of_the_store_is_a_conflict(self) -> None:
        self.put(snapshot("t1", version=2))
        error = raises(
            ConcurrencyConflict, self.store.save, snapshot("t1", version=6), expect_version=5
        )
        assert (error.expected, error.actual) == (5, 2)

    def test_a_rejected_save_changes_nothing(self) -> None:
        before = snapshot("t1", status=RUNNING, version=4, params={"keep": True})
        self.put(before)
        self.store.append(transition("t1", 4))
        stale = snapshot("t1", status=FAILED, version=5, params={"keep": False}, bucket=9)
        raises(ConcurrencyConflict, self.store.save, stale, expect_version=3)
        self.assert_untouched(before)
        assert self.counts() == counted(running=1)
        assert self.where(statuses={FAILED}) == []
        assert self.where(buckets={9}) == []
        assert self.store.history("t1") == [transition("t1", 4)]

    def test_a_rejected_save_is_not_retried_against_the_newer_version(self) -> None:
        self.put(snapshot("t1"))
        self.store.save(snapshot("t1", status=RUNNING, version=2), expect_version=1)
        raises(
            ConcurrencyConflict,
            self.store.save,
            snapshot("t1", status=STOPPED, version=5),
            expect_version=1,
        )
        self.store.save(snapshot("t1", status=SUCCEEDED, version=3), expect_version=2)
        assert self.store.get("t1") == snapshot("t1", status=SUCCEEDED, version=3)

    def test_save_of_a_missing_task_is_a_conflict_with_actual_none(self) -> None:
        error = raises(
            ConcurrencyConflict, self.store.save, snapshot("ghost", version=2), expect_version=1
        )
        assert (error.task_id, error.expected, error.actual) == ("ghost", 1, None)
        assert self.store.get("ghost") is None
        assert self.store.query() == []
        assert self.counts() == counted()

    def test_save_allows_the_version_to_jump(self) -> None:
        self.put(snapshot("t1"))
        self.store.save(snapshot("t1", status=RUNNING, version=4), expect_version=1)
        got = self.store.get("t1")
        assert got is not None and got.status_version == 4
        for skipped in (1, 2, 3):
            error = raises(
                ConcurrencyConflict,
                self.store.save,
                snapshot("t1", version=skipped + 1),
                expect_version=skipped,
            )
            assert error.actual == 4
        self.store.save(snapshot("t1", status=SUCCEEDED, version=5), expect_version=4)
        assert self.store.get("t1") == snapshot("t1", status=SUCCEEDED, version=5)

    def test_save_of_a_version_not_above_expect_version_raises_value_error(self) -> None:
        before = snapshot("t1", version=3)
        self.put(before)
        raises(
            ValueError, self.store.save, snapshot("t1", status=RUNNING, version=3), expect_version=3
        )
        raises(
            ValueError, self.store.save, snapshot("t1", status=RUNNING, version=2), expect_version=3
        )
        self.assert_untouched(before)

    def test_save_refuses_a_bool_or_negative_expect_version(self) -> None:
        before = snapshot("t1")
        self.put(before)
        raises(TypeError, self.store.save, snapshot("t1", version=2), expect_version=True)
        raises(ValueError, self.store.save, snapshot("t1", version=2), expect_version=-1)
        self.assert_untouched(before)

    def test_save_does_not_clobber_the_lease(self) -> None:
        self.put(snapshot("t1"))
        self.store.touch("t1", lease_owner="worker-1", lease_until=at(30))
        moved = snapshot("t1", status=RUNNING, version=2)
        assert moved.lease_owner is None and moved.lease_until is None
        self.store.save(moved, expect_version=1)
        got = self.store.get("t1")
        assert got is not None and got.status == RUNNING
        assert (got.lease_owner, got.lease_until) == ("worker-1", at(30))

    def test_save_keeps_the_stored_lease_when_the_snapshot_carries_another(self) -> None:
        self.put(snapshot("t1"))
        self.store.touch("t1", lease_owner="worker-1", lease_until=at(30))
        other = snapshot("t1", status=RUNNING, version=2, lease_owner="w2", lease_until=at(99))
        self.store.save(other, expect_version=1)
        got = self.store.get("t1")
        assert got is not None and got.status == RUNNING
        assert (got.lease_owner, got.lease_until) == ("worker-1", at(30))

    def test_save_does_not_write_a_lease_onto_a_task_without_one(self) -> None:
        self.put(snapshot("t1"))
        other = snapshot("t1", status=RUNNING, version=2, lease_owner="w2", lease_until=at(99))
        self.store.save(other, expect_version=1)
        got = self.store.get("t1")
        assert got is not None and got.status == RUNNING
        assert (got.lease_owner, got.lease_until) == (None, None)

    def test_save_writes_the_progress_and_heartbeat_the_snapshot_carries(self) -> None:
        self.put(snapshot("t1"))
        self.store.touch("t1", progress=Progress(1, 10), heartbeat_at=at(5))
        moved = snapshot(
            "t1", status=RUNNING, version=2, progress=Progress(7.5, 10, "m"), heartbeat_at=at(8)
        )
        self.store.save(moved, expect_version=1)
        assert self.store.get("t1") == moved

    # -- what a save keeps (round two) -------------------------------------------------------

    def test_a_save_keeps_unchanged_index_entries_findable(self) -> None:
        indexed: dict[str, Any] = {
            "name": "etl.load",
            "bucket": 7,
            "tags": {"io", "urgent"},
            "pipeline_run_id": "run-1",
        }
        self.put(snapshot("t1", **indexed), snapshot("other", name="x", bucket=1, created=1))
        moves = ((RUNNING, 2), (RUNNING, 3), (PAUSED, 5), (PAUSED, 6))
        expected = 1
        for status, version in moves:  # status changes and saves that keep the status
            self.store.save(snapshot("t1", status=status, version=version, **indexed),
                            expect_version=expected)  # fmt: skip
            expected = version
            assert self.where(name="etl.load") == ["t1"], (status, version)
            assert self.where(name_prefix="etl") == ["t1"], (status, version)
            assert self.where(buckets={7}) == ["t1"], (status, version)
            assert self.where(tag="io") == ["t1"] and self.where(tag="urgent") == ["t1"]
            assert self.where(pipeline_run_id="run-1") == ["t1"], (status, version)
            assert self.where(statuses={status}, buckets={7}, tag="io") == ["t1"]
            assert self.where(buckets={1}) == ["other"] and self.where(name="x") == ["other"]

    def test_a_save_that_changes_one_tag_keeps_the_others(self) -> None:
        self.put(snapshot("t1", tags={"keep", "drop"}), snapshot("t2", tags={"keep"}, created=1))
        self.store.save(snapshot("t1", version=2, tags={"keep", "add"}), expect_version=1)
        assert self.where(tag="keep") == ["t1", "t2"]
        assert self.where(tag="add") == ["t1"] and self.where(tag="drop") == []
        self.store.save(snapshot("t1", version=3, tags=set()), expect_version=2)
        assert self.where(tag="keep") == ["t2"] and self.where(tag="add") == []
        got = self.store.get("t1")
        assert got is not None and got.tags == frozenset()

    def test_fields_that_become_none_read_back_as_none(self) -> None:
        filled = snapshot(
            "t1",
            status=RUNNING,
            version=2,
            key="k",
            pipeline_run_id="run-1",
            tags={"io"},
            params={"p": 1},
            result={"r": 2},
            progress=Progress(3, 4, "m"),
            failure=Failure("E", "m", "tb"),
            heartbeat_at=at(5),
            not_before=at(6),
        )
        self.put(filled)
        cleared = snapshot("t1", status=PENDING, version=3)
        self.store.save(cleared, expect_version=2)
        assert self.store.get("t1") == cleared
        assert self.store.query() == [cleared]
        assert self.where(pipeline_run_id="run-1") == [] and self.where(tag="io") == []
        self.store.save(replace(filled, status_version=4), expect_version=3)
        assert self.store.get("t1") == replace(filled, status_version=4)

    def test_each_optional_field_can_be_cleared_on_its_own(self) -> None:
        optional: dict[str, Any] = {
            "key": "k",
            "pipeline_run_id": "run",
            "params": [1],
            "result": 0,
            "progress": Progress(0),
            "failure": Failure("E", ""),
            "heartbeat_at": at(1),
            "not_before": at(2),
        }
        for i, field in enumerate(optional):
            full = snapshot(f"t{i}", created=i, **optional)
            self.put(full)
            none: dict[str, Any] = {field: None}
            cleared = replace(full, status_version=2, **none)
            self.store.save(cleared, expect_version=1)
            assert self.store.get(f"t{i}") == cleared, field

    def test_a_save_of_a_pruned_task_is_a_conflict_and_brings_nothing_back(self) -> None:
        self.put(snapshot("t1", status=SUCCEEDED, version=3, tags={"io"}, bucket=4))
        self.store.append(transition("t1", 3))
        assert self.store.prune(keep_terminal=0) == 1
        revived = snapshot("t1", status=RUNNING, version=4, tags={"io"}, bucket=4)
        error = raises(ConcurrencyConflict, self.store.save, revived, expect_version=3)
        assert (error.expected, error.actual) == (3, None)
        assert self.store.get("t1") is None
        assert self.store.query() == [] and self.where(tag="io") == []
        assert self.where(buckets={4}) == [] and self.where(statuses={RUNNING}) == []
        assert self.counts() == counted()
        assert self.store.history("t1") == []

    # -- found by an independent review of the suite (round two) --------------------

    def test_a_save_that_goes_back_is_a_value_error_whatever_is_stored(self) -> None:
        raises(ValueError, self.store.save, snapshot("ghost", version=2), expect_version=2)
        before = snapshot("t1", version=5)
        self.put(before)
        raises(ValueError, self.store.save, snapshot("t1", version=3), expect_version=4)
        assert self.store.get("ghost") is None
        self.assert_untouched(before)

    def test_save_replaces_created_at_and_the_order_follows(self) -> None:
        self.put(snapshot("a", created=1), snapshot("b", created=2))
        moved = snapshot("a", version=2, created=3)
        self.store.save(moved, expect_version=1)
        assert self.store.get("a") == moved
        assert self.ids() == ["b", "a"]

    def test_save_writes_an_earlier_heartbeat_as_given(self) -> None:
        self.put(snapshot("t1", status=RUNNING))
        self.store.touch("t1", heartbeat_at=at(10))
        moved = snapshot("t1", status=RUNNING, version=2, heartbeat_at=at(5))
        self.store.save(moved, expect_version=1)
        assert self.store.get("t1") == moved

    def test_a_save_refused_for_its_payload_moves_no_counter_or_index(self) -> None:
        self.put(snapshot("t1", tags={"old"}))
        huge = snapshot(
            "t1",
            status=RUNNING,
            version=2,
            tags={"new"},
            bucket=5,
            name="other",
            params=b"x" * (MAX_PAYLOAD_BYTES + 1),
        )
        raises(ValueError, self.store.save, huge, expect_version=1)
        assert self.counts() == counted(pending=1)
        assert self.where(statuses={RUNNING}) == [] and self.where(tag="new") == []
        assert self.where(buckets={5}) == [] and self.where(name="other") == []

    def test_a_refused_create_or_save_leaves_every_index_as_it_was(self) -> None:
        self.put(snapshot("t1", tags={"old"}, name="job", pipeline_run_id="p1"))
        raises(
            TaskAlreadyExists,
            self.store.create,
            snapshot("t1", tags={"dup"}, name="dup", pipeline_run_id="p2", bucket=7),
        )
        raises(
            ConcurrencyConflict,
            self.store.save,
            snapshot("t1", version=3, tags={"stale"}, name="stale", pipeline_run_id="p3", bucket=8),
            expect_version=2,
        )
        for value in ("dup", "stale"):
            assert self.where(tag=value) == [] and self.where(name=value) == []
            assert self.where(name_prefix=value[0]) == []
        assert self.where(pipeline_run_id="p2") == [] == self.where(pipeline_run_id="p3")
        assert self.where(buckets={7, 8}) == []
        assert self.where(tag="old") == ["t1"]

    def test_a_task_at_version_zero_can_be_saved(self) -> None:
        self.put(snapshot("t0", version=0))
        self.store.save(snapshot("t0", status=RUNNING, version=1), expect_version=0)
        got = self.store.get("t0")
        assert got is not None and got.status_version == 1
        error = raises(
            ConcurrencyConflict, self.store.save, snapshot("t0", version=2), expect_version=0
        )
        assert error.actual == 1
