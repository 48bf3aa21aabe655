"""The protocol's shape, exact round trips of every record, and ``create``."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from chongming_redis import (
    CommandKind,
    StoreError,
    TaskAlreadyExists,
    TaskSnapshot,
    Transition,
)
from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore
from chongming_redis.testing.contract.support import (
    PENDING,
    RUNNING,
    ContractBase,
    at,
    command,
    counted,
    full_snapshot,
    parameters_of,
    raises,
    snapshot,
)


class RecordRules(ContractBase):
    # -- the protocol's shape ----------------------------------------------------------------

    def test_the_store_is_a_structural_task_store(self) -> None:
        assert isinstance(self.store, TaskStore)
        for name in PROTOCOL_METHODS:
            assert callable(getattr(self.store, name, None)), name

    def test_every_method_has_the_protocol_signature(self) -> None:
        for name in PROTOCOL_METHODS:
            expected = parameters_of(getattr(TaskStore, name), drop_self=True)
            actual = parameters_of(getattr(self.store, name), drop_self=False)
            assert actual == expected, f"{name}: {actual} != {expected}"

    # -- round trips -------------------------------------------------------------------------

    def test_a_snapshot_with_every_field_filled_round_trips_exactly(self) -> None:
        original = full_snapshot()
        self.store.create(original)
        lease_until = datetime(2024, 3, 10, 12, 1, 0, 314159, tzinfo=timezone(timedelta(hours=5)))
        self.store.touch(original.task_id, lease_owner="worker-ü:7", lease_until=lease_until)
        expected = replace(original, lease_owner="worker-ü:7", lease_until=lease_until)
        got = self.store.get(original.task_id)
        assert got is not None
        for field in TaskSnapshot.__dataclass_fields__:
            assert getattr(got, field) == getattr(expected, field), field
        assert got == expected
        assert type(got.tags) is frozenset
        assert got.params["big"] == 2**62 + 1 and type(got.params["big"]) is int
        assert isinstance(got.params["bytes"], bytes)
        assert self.store.query() == [expected]

    def test_a_minimal_snapshot_round_trips_exactly(self) -> None:
        original = snapshot("min")
        self.store.create(original)
        got = self.store.get("min")
        assert got == original
        assert got is not None and got.tags == frozenset() and got.params is None
        assert got.progress is None and got.failure is None and got.lease_owner is None

    def test_datetimes_come_back_as_the_same_instant_in_utc_to_the_microsecond(self) -> None:
        tz = timezone(timedelta(hours=5, minutes=45))
        local = datetime(2024, 3, 10, 17, 45, 0, 123457, tzinfo=tz)
        self.store.create(snapshot("tz", created_at=local, updated_at=local))
        got = self.store.get("tz")
        assert got is not None
        assert got.created_at == local
        assert got.created_at.utcoffset() == timedelta(0)
        assert got.created_at.microsecond == 123457
        assert got.created_at == datetime(2024, 3, 10, 12, 0, 0, 123457, tzinfo=timezone.utc)

    def test_get_of_a_missing_task_returns_none(self) -> None:
        assert self.store.get("missing") is None
        self.put(snapshot("present"))
        assert self.store.get("missing") is None

    def test_stored_params_are_isolated_from_later_mutation_of_the_callers_dict(self) -> None:
        params: dict[str, Any] = {"a": [1, 2], "b": {"c": 3}}
        self.store.create(snapshot("iso", params=params))
        params["a"].append(99)
        params["b"]["c"] = 4
        params["new"] = True
        got = self.store.get("iso")
        assert got is not None and got.params == {"a": [1, 2], "b": {"c": 3}}

    def test_mutating_a_returned_snapshots_params_does_not_change_the_store(self) -> None:
        self.store.create(snapshot("iso", params={"a": [1]}))
        first = self.store.get("iso")
        assert first is not None
        first.params["a"].append(2)
        first.params["b"] = 1
        assert self.store.get("iso") == snapshot("iso", params={"a": [1]})

    def test_a_transition_round_trips_exactly(self) -> None:
        self.put(snapshot("t1"))
        created = Transition("t1", 1, None, PENDING, at(1), None)
        tz = timezone(timedelta(hours=-8))
        moved = Transition("t1", 2, PENDING, RUNNING, datetime(2024, 1, 1, 0, 0, 0, 7, tz), "ü ✓")
        self.store.append(created)
        self.store.append(moved)
        assert self.store.history("t1") == [created, moved]

    def test_a_command_round_trips_exactly_through_claim(self) -> None:
        original = command(
            "cmd-ü:1",
            task_id="task:{1}",
            kind=CommandKind.PAUSE,
            issued_by="controller-Ω",
            payload={"reason": "maintenance ✓", "n": 2**62, "raw": b"\x00", "list": [1, [2]]},
        )
        self.store.submit_command(original)
        got = self.store.claim_commands(now=at(10), lease_seconds=30, limit=1)
        assert got == [replace(original, lease_until=at(40))]

    # -- create ------------------------------------------------------------------------------

    def test_create_of_an_existing_id_raises_and_does_not_overwrite(self) -> None:
        first = snapshot("t1", status=RUNNING, version=3, params={"v": 1})
        self.store.create(first)
        error = raises(TaskAlreadyExists, self.store.create, snapshot("t1", params={"v": 2}))
        assert isinstance(error, StoreError)
        assert error.task_id == "t1"
        assert self.store.get("t1") == first
        assert self.store.counts() == counted(running=1)
        raises(TaskAlreadyExists, self.store.create, first)  # even an identical one
