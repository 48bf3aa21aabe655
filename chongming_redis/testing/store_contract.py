"""``StoreContract``: the executable ``TaskStore`` contract, for any backend.

Bind it to a backend with one factory and let pytest collect the subclass::

    from chongming_redis.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self) -> TaskStore:
            return MyStore(...)  # a fresh, isolated store on every call

The suite imports no test framework: plain ``assert`` and a local ``raises`` helper, with
``setup_method``/``teardown_method`` hooks that pytest calls on plain classes (and any other
runner can call by hand). The class name does not start with ``Test``, so only bindings are
collected. It checks what one connection can see: the semantics of the 14 methods (store guide
§2, §6, the checklist of §8 and the pitfalls of §9). Cross-process atomicity is not covered;
each backend proves that with its own concurrent tests.

Times are fixed instants (never the wall clock), so the suite is deterministic. Where a
protocol docstring leaves a behaviour open, the suite does not test it.
"""

from __future__ import annotations

import inspect
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from chongming_redis import (
    Command,
    CommandAlreadyExists,
    CommandKind,
    CommandNotFound,
    ConcurrencyConflict,
    Failure,
    Progress,
    StoreClosed,
    StoreError,
    TaskAlreadyExists,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.codec import MAX_PAYLOAD_BYTES
from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore

__all__ = ["StoreContract", "raises"]

E = TypeVar("E", bound=BaseException)

T0 = datetime(2024, 3, 10, 12, 0, 0, 123456, tzinfo=timezone.utc)
ONE_US = timedelta(microseconds=1)
PENDING, RUNNING, PAUSED = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED
SUCCEEDED, FAILED, STOPPED, LOST = (
    TaskStatus.SUCCEEDED,
    TaskStatus.FAILED,
    TaskStatus.STOPPED,
    TaskStatus.LOST,
)
LIVE = (PENDING, RUNNING, PAUSED)
TERMINAL = (SUCCEEDED, FAILED, STOPPED, LOST)
MAX_CLAIM_LIMIT = 1000  # the shared argument checks (stores/_common.py) cap a claim batch

# Ids that are valid (non-empty, <= 1,024 UTF-8 bytes, encodable) but awkward for a backend that
# builds keys, patterns or SQL from them (RELIABILITY B1-B3). Each must be its own task.
AWKWARD_IDS: tuple[str, ...] = (
    ":",
    "a:b",
    "x",
    "x:history",
    "x:commands",
    "{x}",
    "x}y",
    "*",
    "?",
    "a[b]",
    "%",
    "a_b",
    " ",
    "  ",
    " lead",
    "trail ",
    "\n",
    "\r\n",
    "\t",
    "\x00",
    "..",
    "/",
    "\\",
    "'; DROP TABLE tasks; --",
    '"quoted"',
    "\u00e9",  # é, NFC
    "e\u0301",  # é, NFD: a different id
    "任务",
    "🙂",
    "é" * 512,  # exactly 1,024 UTF-8 bytes
)


def raises(exc_type: type[E], fn: Callable[..., object], /, *args: Any, **kwargs: Any) -> E:
    """Call ``fn(*args, **kwargs)`` and return the ``exc_type`` it raised; fail otherwise."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}"
        ) from exc
    raise AssertionError(f"expected {exc_type.__name__}, but nothing was raised")


def at(seconds: float = 0.0) -> datetime:
    """The fixed instant ``seconds`` after ``T0`` (UTC)."""
    return T0 + timedelta(seconds=seconds)


def snapshot(
    task_id: str = "t1",
    *,
    name: str = "job",
    status: TaskStatus = PENDING,
    version: int = 1,
    created: float = 0.0,
    **fields: Any,
) -> TaskSnapshot:
    """A task created ``created`` seconds after ``T0``; ``fields`` fill anything else."""
    fields.setdefault("created_at", at(created))
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id=task_id, name=name, status=status, status_version=version, **fields)


def transition(
    task_id: str,
    version: int,
    *,
    to: TaskStatus = RUNNING,
    reason: str | None = None,
) -> Transition:
    """The history entry that produced ``version`` (version 1 records the creation)."""
    return Transition(
        task_id=task_id,
        version=version,
        from_status=None if version == 1 else PENDING,
        to_status=to,
        at=at(version),
        reason=reason,
    )


def command(
    command_id: str = "c1",
    *,
    created: float = 0.0,
    task_id: str = "t1",
    kind: CommandKind = CommandKind.STOP,
    **fields: Any,
) -> Command:
    return Command(
        command_id=command_id, task_id=task_id, kind=kind, created_at=at(created), **fields
    )


def full_snapshot() -> TaskSnapshot:
    """A task with every field filled, in the shapes that get lost silently: a non-UTC
    timezone, microseconds, non-ASCII frozenset tags, nested payloads with bytes and a large
    int, a float progress and a failure with a traceback. The lease is left to ``touch``."""
    tz = timezone(timedelta(hours=-3, minutes=-30))
    created = datetime(2024, 3, 10, 8, 30, 0, 654321, tzinfo=tz)
    return TaskSnapshot(
        task_id="full-任务-1",
        name="etl.load-ü",
        status=RUNNING,
        status_version=7,
        created_at=created,
        updated_at=created + timedelta(seconds=5, microseconds=1),
        tags=frozenset({"io", "紧急", "with space", "a:b"}),
        bucket=2**31 - 1,
        key="customer:42/ü",
        pipeline_run_id="run-Ω-3",
        params={
            "nested": {"list": [1, 2.5, "três", None, True, False, b"\x00\xff"], "empty": {}},
            "big": 2**62 + 1,  # not exact in a double
            "negative": -(2**62) - 1,
            "bytes": b"\x00\x01\x02",
            "text": "ünï©ødé ✓",
            "items": [[1, [2, [3]]], {"k": []}],
        },
        result=[{"ok": True, "rows": 10**12}, 3.25, "done"],
        progress=Progress(2.5, 10.0, "halfway ✓"),
        failure=Failure(
            "ValueError",
            "bad ünicode",
            'Traceback (most recent call last):\n  File "job.py", line 1\nValueError: ✗\n',
        ),
        heartbeat_at=datetime(2024, 3, 10, 15, 0, 0, 1, tzinfo=timezone(timedelta(hours=2))),
        attempt=3,
        not_before=datetime(2024, 3, 11, 0, 0, 0, 999999, tzinfo=timezone(timedelta(hours=9))),
    )


def counted(**by_status: int) -> dict[TaskStatus, int]:
    """Every status at zero except the ones named (``counted(pending=2)``)."""
    result = dict.fromkeys(TaskStatus, 0)
    for value, number in by_status.items():
        result[TaskStatus(value)] = number
    return result


class StoreContract:
    """The ``TaskStore`` contract as test methods. Subclass it and define ``make_store``."""

    store: TaskStore
    _store_closed: bool = False

    def make_store(self) -> TaskStore:
        """Return a fresh, isolated, empty store. Every binding must define this."""
        raise NotImplementedError("bind StoreContract: define make_store() in the subclass")

    def setup_method(self, method: object) -> None:
        self._store_closed = False
        self.store = self.make_store()

    def teardown_method(self, method: object) -> None:
        if not self._store_closed and hasattr(self, "store"):
            self.store.close()

    # -- helpers -----------------------------------------------------------------------------

    def close_store(self) -> None:
        self._store_closed = True
        self.store.close()

    def put(self, *snapshots: TaskSnapshot) -> None:
        for item in snapshots:
            self.store.create(item)

    def ids(self, query: TaskQuery | None = None) -> list[str]:
        return [s.task_id for s in self.store.query(query)]

    def where(self, **filters: Any) -> list[str]:
        return self.ids(TaskQuery(**filters))

    def claimed(self, seconds: float, *, lease: float = 30.0, limit: int = 50) -> list[str]:
        found = self.store.claim_commands(now=at(seconds), lease_seconds=lease, limit=limit)
        return [c.command_id for c in found]

    def assert_untouched(self, before: TaskSnapshot) -> None:
        assert self.store.get(before.task_id) == before

    # -- the protocol's shape ----------------------------------------------------------------

    def test_the_store_is_a_structural_task_store(self) -> None:
        assert isinstance(self.store, TaskStore)
        for name in PROTOCOL_METHODS:
            assert callable(getattr(self.store, name, None)), name

    def test_every_method_has_the_protocol_signature(self) -> None:
        for name in PROTOCOL_METHODS:
            expected = _parameters(getattr(TaskStore, name), drop_self=True)
            actual = _parameters(getattr(self.store, name), drop_self=False)
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
        assert self.store.counts() == counted(running=1)
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
        assert self.store.counts() == counted()

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

    # -- query -------------------------------------------------------------------------------

    def test_query_of_an_empty_store_is_empty(self) -> None:
        assert self.store.query() == []
        assert self.store.query(None) == []
        assert self.where(statuses={PENDING}, tag="io", limit=5) == []
        assert self.where(newest_first=True) == []

    def test_query_none_returns_every_task_oldest_first(self) -> None:
        self.put(snapshot("b", created=2), snapshot("c", created=1), snapshot("a", created=3))
        assert self.ids(None) == ["c", "b", "a"]
        assert self.ids() == ["c", "b", "a"]
        assert self.ids(TaskQuery()) == ["c", "b", "a"]

    def test_query_orders_by_created_at_not_by_id_or_insertion(self) -> None:
        created = {"m": 5, "z": 1, "a": 9, "q": 3, "b": 7}
        self.put(*(snapshot(i, created=c) for i, c in created.items()))
        assert self.ids() == ["z", "q", "m", "b", "a"]
        self.put(snapshot("old", created=1.5, updated_at=at(100)), snapshot("new", created=2))
        assert self.ids() == ["z", "old", "new", "q", "m", "b", "a"]

    def test_query_newest_first_reverses_the_order(self) -> None:
        created = {"m": 5, "z": 1, "a": 9, "q": 3, "b": 7}
        self.put(*(snapshot(i, created=c) for i, c in created.items()))
        assert self.where(newest_first=True) == ["a", "b", "m", "q", "z"]

    def test_query_breaks_created_at_ties_by_task_id(self) -> None:
        self.put(*(snapshot(i, created=1) for i in ("b", "c", "a")), snapshot("0", created=2))
        assert self.ids() == ["a", "b", "c", "0"]
        assert self.where(newest_first=True) == ["0", "c", "b", "a"]

    def test_query_orders_by_the_instant_to_the_microsecond(self) -> None:
        east = datetime(2024, 3, 10, 14, 0, tzinfo=timezone(timedelta(hours=5)))  # 09:00 UTC
        west = datetime(2024, 3, 10, 5, 0, tzinfo=timezone(timedelta(hours=-5)))  # 10:00 UTC
        self.put(
            snapshot("west", created_at=west, updated_at=west),
            snapshot("east", created_at=east, updated_at=east),
        )
        assert self.ids() == ["east", "west"]
        self.put(
            snapshot("later", created_at=T0 + ONE_US, updated_at=T0),
            snapshot("earlier", created_at=T0, updated_at=T0),
        )
        assert self.ids() == ["east", "west", "earlier", "later"]

    def test_query_filters_by_any_of_the_given_statuses(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=i) for i, s in enumerate(TaskStatus)))
        assert self.where(statuses={RUNNING}) == ["running"]
        assert self.where(statuses={PENDING, FAILED, LOST}) == ["pending", "failed", "lost"]
        assert self.where(statuses=set(TaskStatus)) == [s.value for s in TaskStatus]

    def test_query_filters_by_exact_name(self) -> None:
        self.put(
            snapshot("1", name="job", created=1),
            snapshot("2", name="job2", created=2),
            snapshot("3", name="jo", created=3),
            snapshot("4", name="Job", created=4),
            snapshot("5", name="job", created=5),
        )
        assert self.where(name="job") == ["1", "5"]
        assert self.where(name="jo") == ["3"]
        assert self.where(name="nothing") == []

    def test_query_filters_by_name_prefix(self) -> None:
        self.put(
            snapshot("1", name="etl", created=1),
            snapshot("2", name="etl.load", created=2),
            snapshot("3", name="xetl", created=3),
            snapshot("4", name="et", created=4),
            snapshot("5", name="ETL.x", created=5),
        )
        assert self.where(name_prefix="etl") == ["1", "2"]
        assert self.where(name_prefix="e") == ["1", "2", "4"]
        assert self.where(name_prefix="etl.load.more") == []

    def test_name_prefix_is_matched_literally_not_as_a_pattern(self) -> None:
        names = ["a*b", "ab", "a_b", "axb", "a%b", "a[b", "a?b", "a.b", "a\\b", "a"]
        self.put(*(snapshot(f"t{i}", name=n, created=i) for i, n in enumerate(names)))
        for prefix in ("a*", "a_", "a%", "a[", "a?", "a.", "a\\"):
            expected = [f"t{i}" for i, n in enumerate(names) if n.startswith(prefix)]
            assert self.where(name_prefix=prefix) == expected, prefix

    def test_query_filters_by_exact_tag(self) -> None:
        self.put(
            snapshot("io", tags={"io"}, created=1),
            snapshot("ios", tags={"ios"}, created=2),
            snapshot("i", tags={"i"}, created=3),
            snapshot("both", tags={"io", "urgent"}, created=4),
            snapshot("none", created=5),
            snapshot("upper", tags={"IO"}, created=6),
            snapshot("prio", tags={"prio"}, created=7),
        )
        assert self.where(tag="io") == ["io", "both"]
        assert self.where(tag="i") == ["i"]
        assert self.where(tag="ios") == ["ios"]
        assert self.where(tag="o") == []
        assert self.where(tag="urgent") == ["both"]

    def test_tag_matching_is_exact_for_awkward_tags(self) -> None:
        tags = ['"io"', "io,ios", "io ", "[io]", "io\\", "i*", "%", "io"]
        self.put(*(snapshot(f"t{i}", tags={t}, created=i) for i, t in enumerate(tags)))
        for i, tag in enumerate(tags):
            assert self.where(tag=tag) == [f"t{i}"], tag
        assert self.where(tag="i") == []

    def test_query_filters_by_any_of_the_given_buckets(self) -> None:
        self.put(*(snapshot(f"b{b}", bucket=b, created=b) for b in (0, 1, 2, 3, 2**31 - 1)))
        assert self.where(buckets={1}) == ["b1"]
        assert self.where(buckets={0, 3}) == ["b0", "b3"]
        assert self.where(buckets={2**31 - 1, 99}) == [f"b{2**31 - 1}"]
        assert self.where(buckets={99}) == []

    def test_query_filters_by_pipeline_run_id(self) -> None:
        self.put(
            snapshot("a", pipeline_run_id="run-1", created=1),
            snapshot("b", pipeline_run_id="run-2", created=2),
            snapshot("c", pipeline_run_id="run-1", created=3),
            snapshot("d", created=4),
            snapshot("e", pipeline_run_id="run-10", created=5),
        )
        assert self.where(pipeline_run_id="run-1") == ["a", "c"]
        assert self.where(pipeline_run_id="run-2") == ["b"]
        assert self.where(pipeline_run_id="run") == []

    def test_query_combines_every_filter_with_and(self) -> None:
        base: dict[str, Any] = {
            "name": "etl.load",
            "status": RUNNING,
            "tags": {"io"},
            "bucket": 3,
            "pipeline_run_id": "run-1",
        }
        wrong: dict[str, dict[str, Any]] = {
            "status": {"status": PAUSED},
            "name": {"name": "etl.load2"},
            "prefix": {"name": "xetl.load"},
            "tag": {"tags": {"ios"}},
            "bucket": {"bucket": 4},
            "pipeline": {"pipeline_run_id": "run-2"},
        }
        self.put(snapshot("match1", created=1, **base), snapshot("match2", created=9, **base))
        for i, (task_id, change) in enumerate(wrong.items()):
            self.put(snapshot(task_id, created=2 + i, **{**base, **change}))
        everything: dict[str, Any] = {
            "statuses": {RUNNING, PENDING},
            "name": "etl.load",
            "name_prefix": "etl",
            "tag": "io",
            "buckets": {3, 5},
            "pipeline_run_id": "run-1",
        }
        assert self.where(**everything) == ["match1", "match2"]
        assert self.where(**everything, newest_first=True, limit=1) == ["match2"]
        assert self.where(statuses={RUNNING}, tag="io", buckets={3, 4}) == [
            "match1",
            "name",
            "prefix",
            "bucket",
            "pipeline",
            "match2",
        ]

    def test_query_limit_returns_the_first_tasks_in_order(self) -> None:
        self.put(*(snapshot(f"t{i}", created=10 - i) for i in range(6)))
        assert self.where(limit=2) == ["t5", "t4"]
        assert self.where(limit=2, newest_first=True) == ["t0", "t1"]
        assert self.where(limit=100) == ["t5", "t4", "t3", "t2", "t1", "t0"]
        assert self.where(limit=6) == self.ids()

    def test_query_limit_zero_returns_nothing(self) -> None:
        self.put(snapshot("a"), snapshot("b"))
        assert self.where(limit=0) == []

    def test_query_limit_applies_after_filtering(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i, bucket=i % 2) for i in range(8)))
        assert self.where(buckets={1}, limit=2) == ["t1", "t3"]
        assert self.where(buckets={1}, limit=3, newest_first=True) == ["t7", "t5", "t3"]

    def test_query_reflects_a_status_change_by_save(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        self.store.save(snapshot("t1", status=RUNNING, version=2), expect_version=1)
        assert self.where(statuses={PENDING}) == ["t2"]
        assert self.where(statuses={RUNNING}) == ["t1"]
        self.store.save(snapshot("t1", status=SUCCEEDED, version=3), expect_version=2)
        assert self.where(statuses={RUNNING}) == []
        assert self.where(statuses={SUCCEEDED}) == ["t1"]

    def test_query_reflects_a_tag_change_by_save(self) -> None:
        self.put(snapshot("t1", tags={"io", "old"}))
        self.store.save(snapshot("t1", version=2, tags={"ios", "new"}), expect_version=1)
        assert self.where(tag="io") == []
        assert self.where(tag="old") == []
        assert self.where(tag="ios") == ["t1"]
        assert self.where(tag="new") == ["t1"]

    def test_query_reflects_a_bucket_name_and_pipeline_change_by_save(self) -> None:
        self.put(snapshot("t1", name="old", bucket=1, pipeline_run_id="p1"))
        changed = snapshot("t1", name="new", bucket=2, pipeline_run_id="p2", version=2)
        self.store.save(changed, expect_version=1)
        assert self.where(buckets={1}) == [] and self.where(buckets={2}) == ["t1"]
        assert self.where(name="old") == [] and self.where(name="new") == ["t1"]
        assert self.where(name_prefix="o") == [] and self.where(name_prefix="n") == ["t1"]
        assert self.where(pipeline_run_id="p1") == []
        assert self.where(pipeline_run_id="p2") == ["t1"]

    # -- counts ------------------------------------------------------------------------------

    def test_counts_of_an_empty_store_has_every_status_at_zero(self) -> None:
        assert self.store.counts() == counted()
        assert set(self.store.counts()) == set(TaskStatus)

    def test_counts_track_create(self) -> None:
        self.put(snapshot("a"), snapshot("b"), snapshot("c", status=RUNNING))
        counts = self.store.counts()
        assert counts == counted(pending=2, running=1)
        assert all(type(n) is int for n in counts.values())

    def test_counts_track_status_changes_by_save(self) -> None:
        self.put(snapshot("a"), snapshot("b"))
        self.store.save(snapshot("a", status=RUNNING, version=2), expect_version=1)
        assert self.store.counts() == counted(pending=1, running=1)
        self.store.save(snapshot("a", status=FAILED, version=3), expect_version=2)
        assert self.store.counts() == counted(pending=1, failed=1)

    def test_counts_track_prune(self) -> None:
        self.put(snapshot("a", status=SUCCEEDED), snapshot("b", status=LOST, created=1))
        self.put(snapshot("c"))
        self.store.prune(keep_terminal=1)
        assert self.store.counts() == counted(pending=1, lost=1)

    # -- history -----------------------------------------------------------------------------

    def test_history_is_ascending_by_version_whatever_the_append_order(self) -> None:
        self.put(snapshot("t1"))
        for version in (3, 1, 10, 2):
            self.store.append(transition("t1", version))
        assert [t.version for t in self.store.history("t1")] == [1, 2, 3, 10]

    def test_append_is_idempotent_on_task_and_version(self) -> None:
        self.put(snapshot("t1"))
        entries = [transition("t1", v) for v in (1, 2, 3)]
        for entry in entries + entries + entries[1:]:
            self.store.append(entry)
        assert self.store.history("t1") == entries

    def test_replaying_an_entry_with_different_content_keeps_the_first(self) -> None:
        self.put(snapshot("t1"))
        first = transition("t1", 2, reason="first")
        self.store.append(first)
        self.store.append(transition("t1", 2, reason="second"))
        self.store.append(transition("t1", 2, to=FAILED, reason=None))
        assert self.store.history("t1") == [first]

    def test_history_since_version_returns_only_later_entries(self) -> None:
        self.put(snapshot("t1"))
        entries = [transition("t1", v) for v in (1, 2, 4, 7)]
        for entry in entries:
            self.store.append(entry)
        assert self.store.history("t1", since_version=0) == entries
        assert self.store.history("t1", since_version=1) == entries[1:]
        assert self.store.history("t1", since_version=2) == entries[2:]
        assert self.store.history("t1", since_version=3) == entries[2:]
        assert self.store.history("t1", since_version=6) == entries[3:]
        assert self.store.history("t1", since_version=7) == []
        assert self.store.history("t1", since_version=100) == []
        raises(TypeError, self.store.history, "t1", since_version=True)
        raises(ValueError, self.store.history, "t1", since_version=-1)

    def test_history_of_an_unknown_task_is_empty(self) -> None:
        assert self.store.history("nobody") == []
        assert self.store.history("nobody", since_version=3) == []

    def test_history_is_kept_per_task(self) -> None:
        self.put(snapshot("a"), snapshot("b"), snapshot("ab"))
        self.store.append(transition("a", 1, reason="a"))
        self.store.append(transition("b", 1, reason="b"))
        assert self.store.history("a") == [transition("a", 1, reason="a")]
        assert self.store.history("b") == [transition("b", 1, reason="b")]
        assert self.store.history("ab") == []

    # -- touch -------------------------------------------------------------------------------

    def test_touch_never_bumps_the_status_version(self) -> None:
        self.put(snapshot("t1", status=RUNNING, version=3))
        for i in range(5):
            self.store.touch("t1", progress=Progress(i), heartbeat_at=at(i))
            self.store.touch("t1", lease_owner="w", lease_until=at(30 + i))
        got = self.store.get("t1")
        assert got is not None and got.status_version == 3
        self.store.save(snapshot("t1", status=SUCCEEDED, version=4), expect_version=3)

    def test_touch_writes_progress_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, version=2, params={"p": 1})
        self.put(before)
        self.store.touch("t1", progress=Progress(3.5, 7, "step ✓"))
        self.assert_untouched(replace(before, progress=Progress(3.5, 7, "step ✓")))

    def test_touch_writes_the_heartbeat_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, progress=Progress(1))
        self.put(before)
        self.store.touch("t1", heartbeat_at=at(12.5))
        self.assert_untouched(replace(before, heartbeat_at=at(12.5)))

    def test_touch_writes_the_lease_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, heartbeat_at=at(1))
        self.put(before)
        self.store.touch("t1", lease_owner="w1", lease_until=at(60))
        self.assert_untouched(replace(before, lease_owner="w1", lease_until=at(60)))

    def test_touch_takes_each_argument_on_its_own(self) -> None:
        before = snapshot("t1")
        self.put(before)
        self.store.touch("t1", lease_owner="w1")
        self.assert_untouched(replace(before, lease_owner="w1"))
        self.store.touch("t1", lease_until=at(9))
        self.assert_untouched(replace(before, lease_owner="w1", lease_until=at(9)))
        self.store.touch("t1", heartbeat_at=at(3))
        expected = replace(before, lease_owner="w1", lease_until=at(9), heartbeat_at=at(3))
        self.assert_untouched(expected)
        self.store.touch("t1", progress=Progress(1))
        self.assert_untouched(replace(expected, progress=Progress(1)))

    def test_touch_keeps_the_values_of_arguments_it_was_not_given(self) -> None:
        self.put(snapshot("t1"))
        self.store.touch(
            "t1", progress=Progress(1, 2), heartbeat_at=at(1), lease_owner="w", lease_until=at(5)
        )
        self.store.touch("t1", progress=Progress(2, 2))
        self.store.touch("t1", heartbeat_at=at(2))
        got = self.store.get("t1")
        assert got is not None
        assert got.progress == Progress(2, 2) and got.heartbeat_at == at(2)
        assert (got.lease_owner, got.lease_until) == ("w", at(5))

    def test_touch_with_every_argument_none_changes_nothing(self) -> None:
        before = snapshot("t1", progress=Progress(1), heartbeat_at=at(1))
        self.put(before)
        self.store.touch("t1")
        self.store.touch("t1", progress=None, heartbeat_at=None, lease_owner=None, lease_until=None)
        self.assert_untouched(before)

    def test_touch_of_a_missing_task_is_silent_and_creates_nothing(self) -> None:
        self.store.touch(
            "ghost", progress=Progress(1), heartbeat_at=at(1), lease_owner="w", lease_until=at(2)
        )
        self.store.touch("ghost")
        assert self.store.get("ghost") is None
        assert self.store.query() == []
        assert self.store.counts() == counted()

    def test_touch_stores_heartbeat_and_lease_exactly_as_given(self) -> None:
        self.put(snapshot("t1", status=RUNNING))
        heartbeat = datetime(2024, 3, 10, 14, 0, 0, 1, tzinfo=timezone(timedelta(hours=2)))
        until = at(-3600)  # an expired lease, earlier than the heartbeat: stored as is
        self.store.touch("t1", heartbeat_at=heartbeat, lease_owner="w", lease_until=until)
        got = self.store.get("t1")
        assert got is not None
        assert got.heartbeat_at == heartbeat and got.lease_until == until

    def test_touch_never_derives_the_heartbeat_from_the_lease_or_back(self) -> None:
        self.put(snapshot("lease"), snapshot("beat", created=1))
        self.store.touch("lease", lease_owner="w", lease_until=at(30))
        self.store.touch("beat", heartbeat_at=at(7))
        lease, beat = self.store.get("lease"), self.store.get("beat")
        assert lease is not None and beat is not None
        assert lease.heartbeat_at is None
        assert (beat.lease_owner, beat.lease_until) == (None, None)

    def test_touch_refuses_a_naive_datetime_and_changes_nothing(self) -> None:
        before = snapshot("t1")
        self.put(before)
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, self.store.touch, "t1", heartbeat_at=naive)
        raises(ValueError, self.store.touch, "t1", lease_owner="w", lease_until=naive)
        self.assert_untouched(before)

    # -- commands ----------------------------------------------------------------------------

    def test_claim_leases_until_now_plus_lease_seconds(self) -> None:
        assert self.store.claim_commands(now=at(0), lease_seconds=30) == []
        self.store.submit_command(command("c1"))
        got = self.store.claim_commands(now=at(100), lease_seconds=30, limit=10)
        assert got == [replace(command("c1"), lease_until=at(130))]
        assert got[0].finished_at is None

    def test_claim_honours_a_fractional_lease(self) -> None:
        self.store.submit_command(command("c1"))
        got = self.store.claim_commands(now=at(0), lease_seconds=0.25, limit=1)
        assert [c.lease_until for c in got] == [at(0.25)]
        assert self.claimed(0.25 - 1e-6) == []
        assert self.claimed(0.25) == ["c1"]

    def test_claim_returns_oldest_created_first_with_ties_by_command_id(self) -> None:
        for command_id, created in (("d", 3), ("b", 1), ("c", 1), ("a", 2), ("0", 9)):
            self.store.submit_command(command(command_id, created=created))
        assert self.claimed(100) == ["b", "c", "a", "d", "0"]

    def test_claim_respects_the_limit_and_leaves_the_rest_claimable(self) -> None:
        for i in range(5):
            self.store.submit_command(command(f"c{i}", created=i))
        assert self.claimed(10, limit=2) == ["c0", "c1"]
        assert self.claimed(10, limit=1) == ["c2"]
        assert self.claimed(10, limit=50) == ["c3", "c4"]
        assert self.claimed(10) == []

    def test_a_leased_command_is_not_claimed_again_before_its_lease_expires(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        assert self.claimed(0, lease=30) == []
        assert self.claimed(15) == []
        got = self.store.claim_commands(now=at(30) - ONE_US, lease_seconds=30)
        assert got == []

    def test_a_command_is_claimable_again_once_its_lease_has_expired(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        again = self.store.claim_commands(now=at(30), lease_seconds=10)
        assert again == [replace(command("c1"), lease_until=at(40))]
        assert self.claimed(39) == []
        assert self.claimed(41) == ["c1"]

    def test_claim_skips_leased_commands_and_takes_the_next_ones(self) -> None:
        for i in range(3):
            self.store.submit_command(command(f"c{i}", created=i))
        assert self.claimed(0, limit=1) == ["c0"]
        self.store.submit_command(command("late", created=-5))
        assert self.claimed(1) == ["late", "c1", "c2"]

    def test_a_completed_command_is_never_claimed_again(self) -> None:
        self.store.submit_command(command("c1"))
        self.store.submit_command(command("c2", created=1))
        assert self.claimed(0, lease=30) == ["c1", "c2"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        assert self.claimed(31) == ["c2"]
        assert self.claimed(10_000) == ["c2"]
        self.store.submit_command(command("never-claimed"))
        self.store.complete_command("never-claimed", now=at(1), outcome="already-terminal")
        assert self.claimed(20_000) == ["c2"]

    def test_completing_a_finished_command_again_is_harmless(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        self.store.complete_command("c1", now=at(2), outcome="other")
        self.store.complete_command("c1", now=at(3))
        assert self.claimed(100) == []

    def test_release_makes_a_claimed_command_claimable_at_once(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        self.store.release_command("c1", now=at(1))
        got = self.store.claim_commands(now=at(1), lease_seconds=30)
        assert got == [replace(command("c1"), lease_until=at(31))]

    def test_release_does_not_complete_the_command(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        self.store.release_command("c1", now=at(1))
        self.store.release_command("c1", now=at(1))
        assert self.claimed(100, lease=30) == ["c1"]
        self.store.complete_command("c1", now=at(101), outcome="stopped")
        assert self.claimed(1000) == []

    def test_release_of_an_unclaimed_command_leaves_it_claimable(self) -> None:
        self.store.submit_command(command("c1"))
        self.store.release_command("c1", now=at(0))
        assert self.claimed(0) == ["c1"]

    def test_release_of_a_finished_command_leaves_it_finished(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        self.store.release_command("c1", now=at(2))
        assert self.claimed(2) == []
        assert self.claimed(1000) == []

    def test_complete_of_an_unknown_command_raises_command_not_found(self) -> None:
        error = raises(CommandNotFound, self.store.complete_command, "nope", now=at(0))
        assert isinstance(error, StoreError) and error.command_id == "nope"
        assert self.claimed(0) == []

    def test_release_of_an_unknown_command_raises_command_not_found(self) -> None:
        error = raises(CommandNotFound, self.store.release_command, "nope", now=at(0))
        assert isinstance(error, StoreError) and error.command_id == "nope"
        assert self.claimed(0) == []

    def test_submit_of_an_existing_command_id_raises_and_keeps_the_original(self) -> None:
        original = command("c1", kind=CommandKind.STOP, payload={"v": 1})
        self.store.submit_command(original)
        duplicate = command("c1", kind=CommandKind.PAUSE, created=-1, payload={"v": 2})
        error = raises(CommandAlreadyExists, self.store.submit_command, duplicate)
        assert isinstance(error, StoreError) and error.command_id == "c1"
        claimed = self.store.claim_commands(now=at(0), lease_seconds=5)
        assert claimed == [replace(original, lease_until=at(5))]

    def test_submitting_a_command_does_not_touch_tasks(self) -> None:
        before = snapshot("t1", status=RUNNING)
        self.put(before)
        self.store.submit_command(command("c1", task_id="t1"))
        self.assert_untouched(before)
        assert self.store.history("t1") == []

    def test_claim_refuses_a_lease_that_is_not_a_positive_finite_number(self) -> None:
        self.store.submit_command(command("c1"))
        for bad in (0, 0.0, -1, -0.5, float("nan"), float("inf")):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=bad)
        for wrong in (True, "30", None):
            raises(TypeError, self.store.claim_commands, now=at(0), lease_seconds=wrong)
        assert self.claimed(0) == ["c1"]

    def test_claim_refuses_a_limit_outside_one_to_a_thousand(self) -> None:
        self.store.submit_command(command("c1"))
        for bad in (0, -1, MAX_CLAIM_LIMIT + 1):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=1, limit=bad)
        for wrong in (True, 1.0, "5"):
            raises(TypeError, self.store.claim_commands, now=at(0), lease_seconds=1, limit=wrong)
        assert self.claimed(0, limit=MAX_CLAIM_LIMIT) == ["c1"]

    def test_claim_complete_and_release_refuse_a_naive_now(self) -> None:
        self.store.submit_command(command("c1"))
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, self.store.claim_commands, now=naive, lease_seconds=30)
        raises(ValueError, self.store.complete_command, "c1", now=naive)
        raises(ValueError, self.store.release_command, "c1", now=naive)
        assert self.claimed(0) == ["c1"]

    # -- prune -------------------------------------------------------------------------------

    def test_prune_keeps_the_newest_terminal_tasks_and_drops_the_oldest(self) -> None:
        created = {"t3": 3, "t1": 1, "t5": 5, "t2": 2, "t4": 4}
        self.put(*(snapshot(i, status=SUCCEEDED, created=c) for i, c in created.items()))
        assert self.store.prune(keep_terminal=2) == 3
        assert self.ids() == ["t4", "t5"]
        assert self.store.get("t1") is None

    def test_prune_decides_by_created_at_not_updated_at(self) -> None:
        self.put(
            snapshot("old", status=FAILED, created=1, updated_at=at(100)),
            snapshot("new", status=FAILED, created=2, updated_at=at(2)),
        )
        assert self.store.prune(keep_terminal=1) == 1
        assert self.ids() == ["new"]

    def test_prune_drops_the_history_of_dropped_tasks_only(self) -> None:
        self.put(
            snapshot("old", status=STOPPED, created=1), snapshot("new", status=LOST, created=2)
        )
        self.put(snapshot("live", created=0))
        for task_id in ("old", "new", "live"):
            self.store.append(transition(task_id, 1))
            self.store.append(transition(task_id, 2))
        assert self.store.prune(keep_terminal=1) == 1
        assert self.store.history("old") == []
        assert self.store.history("new") == [transition("new", 1), transition("new", 2)]
        assert self.store.history("live") == [transition("live", 1), transition("live", 2)]

    def test_prune_never_drops_a_live_task(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=-100 + i) for i, s in enumerate(LIVE)))
        self.put(snapshot("done", status=SUCCEEDED, created=50))
        assert self.store.prune(keep_terminal=0) == 1
        assert self.ids() == ["pending", "running", "paused"]
        assert self.store.prune(keep_terminal=0) == 0
        assert self.ids() == ["pending", "running", "paused"]

    def test_prune_counts_only_terminal_tasks_toward_keep_terminal(self) -> None:
        self.put(snapshot("a", status=FAILED, created=1), snapshot("b", status=FAILED, created=2))
        self.put(*(snapshot(f"live{i}", status=RUNNING, created=10 + i) for i in range(3)))
        assert self.store.prune(keep_terminal=2) == 0
        assert len(self.ids()) == 5

    def test_prune_treats_every_terminal_status_as_terminal(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=i) for i, s in enumerate(TERMINAL)))
        self.put(snapshot("live", status=PAUSED, created=-1))
        assert self.store.prune(keep_terminal=0) == len(TERMINAL)
        assert self.ids() == ["live"]

    def test_prune_with_keep_terminal_at_or_above_the_count_drops_nothing(self) -> None:
        assert self.store.prune(keep_terminal=0) == 0
        assert self.store.prune(keep_terminal=10) == 0
        self.put(snapshot("a", status=FAILED), snapshot("b", status=LOST, created=1))
        assert self.store.prune(keep_terminal=2) == 0
        assert self.store.prune(keep_terminal=1000) == 0
        assert self.ids() == ["a", "b"]

    def test_prune_refuses_a_negative_or_bool_keep_terminal(self) -> None:
        self.put(snapshot("a", status=FAILED))
        raises(ValueError, self.store.prune, keep_terminal=-1)
        raises(TypeError, self.store.prune, keep_terminal=True)
        assert self.ids() == ["a"]

    def test_a_pruned_id_can_be_created_again(self) -> None:
        self.put(snapshot("t1", status=FAILED))
        self.store.append(transition("t1", 1))
        assert self.store.prune(keep_terminal=0) == 1
        self.put(snapshot("t1", created=5))
        assert self.store.get("t1") == snapshot("t1", created=5)
        assert self.store.history("t1") == []

    # -- close -------------------------------------------------------------------------------

    def test_close_is_idempotent(self) -> None:
        self.close_store()
        self.store.close()
        self.store.close()

    def test_every_method_after_close_raises_store_closed(self) -> None:
        self.put(snapshot("t1"))
        self.store.submit_command(command("c1"))
        self.close_store()
        calls: dict[str, Callable[[], object]] = {
            "create": lambda: self.store.create(snapshot("t2")),
            "save": lambda: self.store.save(snapshot("t1", version=2), expect_version=1),
            "get": lambda: self.store.get("t1"),
            "query": lambda: self.store.query(),
            "counts": lambda: self.store.counts(),
            "append": lambda: self.store.append(transition("t1", 1)),
            "history": lambda: self.store.history("t1"),
            "touch": lambda: self.store.touch("t1", heartbeat_at=at(1)),
            "submit_command": lambda: self.store.submit_command(command("c2")),
            "claim_commands": lambda: self.store.claim_commands(now=at(0), lease_seconds=1),
            "complete_command": lambda: self.store.complete_command("c1", now=at(0)),
            "release_command": lambda: self.store.release_command("c1", now=at(0)),
            "prune": lambda: self.store.prune(keep_terminal=0),
        }
        assert set(calls) == set(PROTOCOL_METHODS) - {"close"}
        wrong = {name: _outcome(call) for name, call in calls.items()}
        wrong = {name: outcome for name, outcome in wrong.items() if outcome != "StoreClosed"}
        assert not wrong, f"after close() these did not raise StoreClosed: {wrong}"

    # -- bad input ---------------------------------------------------------------------------

    def test_naive_datetimes_are_refused_when_a_record_is_built(self) -> None:
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, snapshot, created_at=naive)
        raises(ValueError, snapshot, heartbeat_at=naive)
        raises(ValueError, Transition, "t1", 1, None, PENDING, naive)
        raises(ValueError, Command, "c1", "t1", CommandKind.STOP, naive)
        assert self.store.counts() == counted()

    def test_unusable_ids_are_refused_before_the_store_changes(self) -> None:
        self.put(snapshot("t1"))
        self.store.submit_command(command("c1"))
        for bad in ("", "x" * 1025, "é" * 512 + "x", "\ud800", "a\udfffb"):
            raises(ValueError, snapshot, bad)
            raises(ValueError, command, bad)
            raises(ValueError, self.store.get, bad)
            raises(ValueError, self.store.history, bad)
            raises(ValueError, self.store.touch, bad, heartbeat_at=at(1))
            raises(ValueError, self.store.complete_command, bad, now=at(1))
            raises(ValueError, self.store.release_command, bad, now=at(1))
        for wrong in (None, 1, b"t1"):
            raises(TypeError, self.store.get, wrong)
            raises(TypeError, self.store.touch, wrong, heartbeat_at=at(1))
        assert self.ids() == ["t1"]
        assert self.store.counts() == counted(pending=1)
        assert self.claimed(0) == ["c1"]

    def test_a_bool_or_float_version_is_refused(self) -> None:
        raises(TypeError, snapshot, version=True)
        raises(TypeError, snapshot, version=1.0)
        raises(TypeError, Transition, "t1", True, None, PENDING, T0)
        raises(ValueError, snapshot, version=-1)

    def test_wrong_record_types_are_refused_with_type_error(self) -> None:
        raises(TypeError, self.store.create, {"task_id": "t1"})
        raises(TypeError, self.store.save, None, expect_version=1)
        raises(TypeError, self.store.append, snapshot("t1"))
        raises(TypeError, self.store.submit_command, snapshot("t1"))
        assert self.store.counts() == counted()
        assert self.claimed(0) == []
        raises(TypeError, self.store.query, {"statuses": {PENDING}})

    def test_params_over_the_payload_limit_are_refused_and_nothing_is_created(self) -> None:
        huge = snapshot("huge", params=b"x" * (MAX_PAYLOAD_BYTES + 1))
        raises(ValueError, self.store.create, huge)
        assert self.store.get("huge") is None
        assert self.store.counts() == counted()
        raises(ValueError, self.store.submit_command, command("c1", payload=huge.params))
        assert self.claimed(0) == []

    def test_unserialisable_params_are_refused_and_nothing_is_created(self) -> None:
        for bad in (object(), {"nested": [object()]}, {1.5j: 1}):
            raises(TypeError, self.store.create, snapshot("bad", params=bad))
            raises(TypeError, self.store.submit_command, command("bad", payload=bad))
        assert self.store.get("bad") is None
        assert self.store.counts() == counted()
        assert self.claimed(0) == []

    def test_a_refused_payload_in_a_save_leaves_the_task_unchanged(self) -> None:
        before = snapshot("t1", params={"ok": True})
        self.put(before)
        huge = snapshot("t1", version=2, params=b"x" * (MAX_PAYLOAD_BYTES + 1))
        raises(ValueError, self.store.save, huge, expect_version=1)
        raises(
            TypeError, self.store.save, snapshot("t1", version=2, result=object()), expect_version=1
        )
        self.assert_untouched(before)
        self.store.save(snapshot("t1", version=2), expect_version=1)

    def test_awkward_but_valid_ids_round_trip_and_never_collide(self) -> None:
        assert len(set(AWKWARD_IDS)) == len(AWKWARD_IDS)
        assert unicodedata.normalize("NFC", "e\u0301") == "\u00e9"
        for i, task_id in enumerate(AWKWARD_IDS):
            self.store.create(snapshot(task_id, created=i, params={"id": task_id}))
            self.store.append(transition(task_id, 1, reason=task_id))
        for task_id in AWKWARD_IDS:
            got = self.store.get(task_id)
            assert got is not None and got.task_id == task_id, repr(task_id)
            assert got.params == {"id": task_id}, repr(task_id)
            assert self.store.history(task_id) == [transition(task_id, 1, reason=task_id)]
        assert self.ids() == list(AWKWARD_IDS)
        assert self.store.counts() == counted(pending=len(AWKWARD_IDS))

    def test_awkward_names_tags_and_pipeline_ids_filter_exactly(self) -> None:
        for i, text in enumerate(AWKWARD_IDS):
            self.store.create(
                snapshot(f"t{i}", name=text, tags={text}, pipeline_run_id=text, created=i)
            )
        for i, text in enumerate(AWKWARD_IDS):
            assert self.where(name=text) == [f"t{i}"], repr(text)
            assert self.where(tag=text) == [f"t{i}"], repr(text)
            assert self.where(pipeline_run_id=text) == [f"t{i}"], repr(text)
            expected = [f"t{j}" for j, other in enumerate(AWKWARD_IDS) if other.startswith(text)]
            assert self.where(name_prefix=text) == expected, repr(text)

    def test_awkward_command_ids_round_trip_and_never_collide(self) -> None:
        for i, command_id in enumerate(AWKWARD_IDS):
            self.store.submit_command(command(command_id, task_id=command_id, created=i))
        got = self.store.claim_commands(now=at(0), lease_seconds=5, limit=MAX_CLAIM_LIMIT)
        assert [c.command_id for c in got] == list(AWKWARD_IDS)
        assert all(c.task_id == c.command_id for c in got)
        self.store.complete_command("x", now=at(1))
        self.store.release_command("x:history", now=at(1))
        assert self.claimed(1) == ["x:history"]
        self.put(snapshot("same"))
        self.store.submit_command(command("same", task_id="same"))
        assert self.ids() == ["same"]
        assert self.claimed(0) == ["same"]


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__ if isinstance(exc, StoreClosed) else f"{exc!r}"
    return "returned normally"


def _parameters(fn: Callable[..., object], *, drop_self: bool) -> list[tuple[str, str, object]]:
    """Name, kind and default of each parameter (annotations are not compared)."""
    params: Iterable[inspect.Parameter] = inspect.signature(fn).parameters.values()
    listed = [(p.name, p.kind.name, p.default) for p in params]
    return listed[1:] if drop_self else listed
