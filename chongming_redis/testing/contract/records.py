"""The protocol's shape, exact round trips of every record, and ``create``."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from chongming_redis import (
    Command,
    CommandKind,
    Failure,
    Progress,
    StoreError,
    TaskAlreadyExists,
    TaskSnapshot,
    Transition,
)
from chongming_redis.stores.codec import MAX_PAYLOAD_BYTES, encode_payload
from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore
from chongming_redis.testing.contract.support import (
    AWKWARD_IDS,
    EARLIEST,
    FAILED,
    LATEST,
    MAX,
    ONE_US,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
    command,
    counted,
    full_snapshot,
    parameters_of,
    raises,
    snapshot,
    transition,
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

    def test_priority_round_trips_at_its_bounds_and_changes_only_by_save(self) -> None:
        """``priority`` is stored as given (-100..100; 0 by default) and a save can change
        it; a store that drops it would start every retry as priority 0."""
        low, high = snapshot("low", priority=-100), snapshot("high", priority=100)
        self.store.create(low)
        self.store.create(high)
        self.store.create(snapshot("plain"))
        assert self.store.get("low") == low and self.store.get("high") == high
        plain = self.store.get("plain")
        assert plain is not None and plain.priority == 0
        bumped = replace(low, status_version=low.status_version + 1, priority=7)
        self.store.save(bumped, expect_version=low.status_version)
        assert self.store.get("low") == bumped
        assert {s.task_id: s.priority for s in self.store.query()} == {
            "low": 7,
            "high": 100,
            "plain": 0,
        }
        self.store.touch("high", heartbeat_at=at(5))
        stored = self.store.get("high")
        assert stored is not None and stored.priority == 100, "touch leaves the priority"

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
        assert self.counts() == counted(running=1)
        raises(TaskAlreadyExists, self.store.create, first)  # even an identical one

    # -- identity, time and types (round two) ------------------------------------------------

    def test_ids_are_case_sensitive(self) -> None:
        self.put(snapshot("task", params={"i": 1}), snapshot("Task", params={"i": 2}, created=1))
        self.put(snapshot("TASK", status=RUNNING, created=2))
        self.store.append(transition("task", 1, reason="lower"))
        self.store.save(snapshot("Task", status=FAILED, version=2, params={"i": 2}, created=1),
                        expect_version=1)  # fmt: skip
        lower = self.store.get("task")
        assert lower is not None and lower.params == {"i": 1} and lower.status == PENDING
        assert self.store.history("Task") == [] and self.store.history("TASK") == []
        assert self.store.history("task") == [transition("task", 1, reason="lower")]
        assert self.ids() == ["task", "Task", "TASK"]
        assert self.counts() == counted(pending=1, failed=1, running=1)
        self.store.submit_command(command("cmd"))
        self.store.submit_command(command("CMD", created=1))
        self.store.complete_command("cmd", now=at(0))
        assert self.claimed(0) == ["CMD"]

    def test_an_id_that_is_a_prefix_of_another_shares_nothing_with_it(self) -> None:
        ids = ("t1", "t10", "t1:", "t1 ", "t")
        self.put(*(snapshot(i, bucket=3, tags={"x"}, created=n) for n, i in enumerate(ids)))
        for task_id in ids:
            self.store.append(transition(task_id, 1, reason=task_id))
        self.store.save(snapshot("t1", status=SUCCEEDED, version=2, bucket=4, tags={"y"}),
                        expect_version=1)  # fmt: skip
        assert self.where(buckets={3}) == ["t10", "t1:", "t1 ", "t"]
        assert self.where(tag="x") == ["t10", "t1:", "t1 ", "t"]
        assert self.where(statuses={SUCCEEDED}) == ["t1"]
        self.store.append(transition("t1", 2, reason="t1 again"))
        for task_id in ids[1:]:
            assert self.store.history(task_id) == [transition(task_id, 1, reason=task_id)]
            got = self.store.get(task_id)
            assert got is not None and got.status == PENDING and got.bucket == 3
        assert self.store.prune(keep_terminal=0) == 1
        assert self.store.history("t1") == []
        assert [len(self.store.history(i)) for i in ids[1:]] == [1, 1, 1, 1]
        for n, command_id in enumerate(("c1", "c10", "c1:", "c2")):
            self.store.submit_command(command(command_id, task_id="t1", created=n))
        assert self.claimed(0, lease=5) == ["c1", "c10", "c1:", "c2"]
        self.store.release_command("c1", now=at(1))
        assert self.claimed(1) == ["c1"]
        self.store.complete_command("c1", now=at(2))
        assert self.claimed(6) == ["c10", "c1:", "c2"]

    def test_the_whole_documented_time_range_round_trips(self) -> None:
        instants = (
            EARLIEST,
            EARLIEST + ONE_US,
            datetime(2038, 1, 19, 3, 14, 8, tzinfo=timezone.utc),  # past 2**31 seconds
            datetime(2106, 2, 7, 6, 28, 16, 1, tzinfo=timezone.utc),  # past 2**32 seconds
            datetime(2200, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
            LATEST - ONE_US,
            LATEST,
        )
        for i, moment in enumerate(instants):
            task = snapshot(f"t{i}", created_at=moment, updated_at=moment, heartbeat_at=moment,
                            not_before=moment)  # fmt: skip
            self.store.create(task)
            self.store.touch(f"t{i}", lease_owner="w", lease_until=moment)
            self.store.append(Transition(f"t{i}", 1, None, PENDING, moment))
            got = self.store.get(f"t{i}")
            assert got == replace(task, lease_owner="w", lease_until=moment), moment
            assert self.store.history(f"t{i}")[0].at == moment, moment
        assert self.ids() == [f"t{i}" for i in range(len(instants))]
        assert self.where(newest_first=True, limit=1) == [f"t{len(instants) - 1}"]

    def test_command_times_round_trip_across_the_documented_range(self) -> None:
        late = LATEST - timedelta(seconds=10)
        self.store.submit_command(Command("late", "t1", CommandKind.STOP, late))
        self.store.submit_command(Command("early", "t1", CommandKind.STOP, EARLIEST + ONE_US))
        got = self.store.claim_commands(now=late, lease_seconds=10)
        assert [(c.command_id, c.created_at) for c in got] == [
            ("early", EARLIEST + ONE_US),
            ("late", late),
        ]
        assert [c.lease_until for c in got] == [LATEST, LATEST]
        raises(ValueError, self.store.claim_commands, now=late, lease_seconds=11)

    def test_values_come_back_with_their_types(self) -> None:
        params: dict[str, Any] = {
            "integral float": 1.0,
            "zero float": 0.0,
            "negative float": -2.0,
            "big float": 1e300,
            "fraction": 0.1,
            "int": 1,
            "zero": 0,
            "true": True,
            "false": False,
            "none": None,
            "empty bytes": b"",
            "empty text": "",
            "digits": "123",
            "empty list": [],
            "empty map": {},
            "int keys": {1: "one", 2: "two"},
        }
        task = snapshot("typed", params=params, result=2.0, progress=Progress(3.0, 4.0, ""))
        self.store.create(task)
        got = self.store.get("typed")
        assert got is not None and got == task
        for key, value in params.items():
            assert type(got.params[key]) is type(value), key
        assert type(got.result) is float
        assert got.progress is not None
        assert type(got.progress.current) is float and type(got.progress.total) is float
        assert got.progress.message == ""
        self.store.touch("typed", progress=Progress(5, 6.0))
        got = self.store.get("typed")
        assert got is not None and got.progress is not None
        assert type(got.progress.current) is int and type(got.progress.total) is float
        version = 1
        for result in (0, 7, 1.5, "7", [1.0], True, 2**53, -0.5):
            self.store.save(replace(task, status_version=version + 1, result=result),
                            expect_version=version)  # fmt: skip
            version += 1
            stored = self.store.get("typed")
            assert stored is not None and stored.result == result
            assert type(stored.result) is type(result), result

    # -- found by an independent review of the suite (round two) --------------------

    def test_every_identifier_field_round_trips_awkward_values(self) -> None:
        texts = (*AWKWARD_IDS, "\u2126", "x" * 1024)  # OHM SIGN: NFC turns it into Ω
        for i, text in enumerate(texts):
            task = snapshot(f"t{i}", created=i, key=text)
            self.store.create(task)
            self.store.touch(f"t{i}", lease_owner=text, lease_until=at(1))
            got = self.store.get(f"t{i}")
            assert got == replace(task, lease_owner=text, lease_until=at(1)), repr(text)
            self.store.submit_command(command(f"c{i}", created=i, issued_by=text))
        got_cmds = self.store.claim_commands(now=at(0), lease_seconds=5, limit=1000)
        assert [c.issued_by for c in got_cmds] == list(texts)

    def test_the_longest_texts_round_trip(self) -> None:
        failure = Failure("E" * 1024, "m" * (64 * 1024), "t" * (256 * 1024))
        task = snapshot("t1", failure=failure, progress=Progress(1, 2, "p" * 4096))
        self.put(task)
        assert self.store.get("t1") == task
        entry = Transition("t1", 1, None, PENDING, at(1), "r" * (64 * 1024))
        self.store.append(entry)
        assert self.store.history("t1") == [entry]

    def test_empty_and_zero_values_are_not_none(self) -> None:
        task = snapshot(
            "t1",
            params=[],
            result={},
            failure=Failure("E", "", ""),
            progress=Progress(0, 0, ""),
            attempt=0,
            bucket=0,
        )
        self.put(task)
        assert self.store.get("t1") == task
        self.put(snapshot("t2", params={}, created=1))
        got = self.store.get("t2")
        assert got is not None and got.params == {}
        entry = Transition("t1", 1, None, PENDING, at(1), "")
        self.store.append(entry)
        assert self.store.history("t1") == [entry]

    def test_a_payload_of_exactly_the_limit_is_accepted(self) -> None:
        params = b"x" * (MAX_PAYLOAD_BYTES - 5)
        assert len(encode_payload(params) or b"") == MAX_PAYLOAD_BYTES
        task = snapshot("t1", params=params)
        self.put(task)
        assert self.store.get("t1") == task
        self.store.submit_command(command("c1", payload=params))
        assert [c.payload for c in self.store.claim_commands(now=at(0), lease_seconds=1)] == [
            params
        ]

    def test_a_bad_payload_is_refused_as_bad_input_even_for_an_existing_id(self) -> None:
        self.put(snapshot("t1"))
        self.store.submit_command(command("c1"))
        huge = b"x" * (MAX_PAYLOAD_BYTES + 1)
        raises(ValueError, self.store.create, snapshot("t1", params=huge))
        raises(TypeError, self.store.create, snapshot("t1", params=object()))
        raises(ValueError, self.store.submit_command, command("c1", payload=huge))
        raises(TypeError, self.store.submit_command, command("c1", payload=object()))

    def test_the_largest_integers_round_trip(self) -> None:
        task = snapshot("t1", version=MAX - 1, attempt=MAX)
        self.put(task)
        assert self.store.get("t1") == task
        moved = replace(task, status=RUNNING, status_version=MAX)
        self.store.save(moved, expect_version=MAX - 1)
        entry = Transition("t1", MAX, PENDING, RUNNING, at(1))
        self.store.append(entry)
        assert self.store.get("t1") == moved
        assert self.store.history("t1", since_version=MAX - 1) == [entry]
        assert self.where(limit=MAX) == ["t1"]

    def test_create_stores_the_lease_the_snapshot_carries(self) -> None:
        task = snapshot("t1", lease_owner="w", lease_until=at(9))
        self.put(task)
        assert self.store.get("t1") == task
