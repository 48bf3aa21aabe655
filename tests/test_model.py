"""The model validates itself at construction: bad input never reaches a store."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.validation import EPOCH, MAX_EPOCH_US, MAX_INT

NOW = datetime(2024, 5, 17, 12, 30, 45, 123456, tzinfo=timezone.utc)
LAST_INSTANT = EPOCH + timedelta(microseconds=MAX_EPOCH_US)
PLUS_8 = timezone(timedelta(hours=8))
MINUS_0330 = timezone(-timedelta(hours=3, minutes=30))


def snapshot(**changes: object) -> TaskSnapshot:
    base: dict[str, object] = {
        "task_id": "t-1",
        "name": "resize",
        "status": TaskStatus.PENDING,
        "status_version": 1,
        "created_at": NOW,
        "updated_at": NOW,
    }
    base.update(changes)
    return TaskSnapshot(**base)  # type: ignore[arg-type]


# -- frozen records and dataclasses.replace --------------------------------------------------


def test_records_are_frozen() -> None:
    task = snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.status = TaskStatus.RUNNING  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Progress(1).current = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Transition("t-1", 1, None, TaskStatus.PENDING, NOW).version = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Command("c-1", "t-1", CommandKind.STOP, NOW).outcome = "x"  # type: ignore[misc]


def test_replace_returns_a_new_record_and_leaves_the_original_alone() -> None:
    task = snapshot()
    running = dataclasses.replace(task, status=TaskStatus.RUNNING, status_version=2)
    assert running.status is TaskStatus.RUNNING
    assert running.status_version == 2
    assert task.status is TaskStatus.PENDING
    assert task.status_version == 1


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"status_version": -1}, ValueError),
        ({"status_version": True}, TypeError),
        ({"created_at": datetime(2024, 1, 1)}, ValueError),
        ({"tags": frozenset({""})}, ValueError),
        ({"status": "running"}, TypeError),
    ],
)
def test_replace_re_runs_the_checks(changes: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        dataclasses.replace(snapshot(), **changes)


def test_replace_converts_datetimes_to_utc_too() -> None:
    local = NOW.astimezone(PLUS_8)
    task = dataclasses.replace(snapshot(), heartbeat_at=local)
    assert task.heartbeat_at is not None
    assert task.heartbeat_at.tzinfo is timezone.utc
    assert task.heartbeat_at == local


# -- datetimes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["created_at", "updated_at", "heartbeat_at", "lease_until", "not_before"]
)
def test_naive_datetimes_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        snapshot(**{field: datetime(2024, 1, 1, 12, 0)})


def test_naive_datetimes_are_refused_in_every_record() -> None:
    naive = datetime(2024, 1, 1)
    with pytest.raises(ValueError):
        Transition("t-1", 1, None, TaskStatus.PENDING, naive)
    with pytest.raises(ValueError):
        Command("c-1", "t-1", CommandKind.STOP, naive)
    with pytest.raises(ValueError):
        Command("c-1", "t-1", CommandKind.STOP, NOW, lease_until=naive)
    with pytest.raises(ValueError):
        Command("c-1", "t-1", CommandKind.STOP, NOW, finished_at=naive)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc),
        EPOCH - timedelta(microseconds=1),
        datetime(2300, 1, 1, tzinfo=timezone.utc),
        LAST_INSTANT + timedelta(microseconds=1),
        datetime(1, 1, 1, tzinfo=timezone.utc),
        datetime(9999, 12, 31, tzinfo=timezone.utc),
        # 1970-01-01 00:30 at +01:00 is 1969-12-31 23:30 UTC: out of range after conversion.
        datetime(1970, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_out_of_range_datetimes_are_refused(moment: datetime) -> None:
    with pytest.raises(ValueError, match="storable range"):
        snapshot(created_at=moment)


@pytest.mark.parametrize("moment", [EPOCH, LAST_INSTANT, EPOCH.astimezone(MINUS_0330)])
def test_the_boundaries_of_the_range_are_accepted(moment: datetime) -> None:
    assert snapshot(created_at=moment).created_at == moment


@pytest.mark.parametrize("value", ["2024-01-01T00:00:00Z", 1700000000, 1.5, None])
def test_a_datetime_field_refuses_other_types(value: object) -> None:
    with pytest.raises(TypeError):
        snapshot(created_at=value)


@pytest.mark.parametrize("tz", [PLUS_8, MINUS_0330, timezone(timedelta(seconds=-1))])
def test_non_utc_input_is_converted_to_utc_and_is_the_same_instant(tz: timezone) -> None:
    local = NOW.astimezone(tz)
    task = snapshot(created_at=local, updated_at=local, lease_until=local)
    for value in (task.created_at, task.updated_at, task.lease_until):
        assert value is not None
        assert value.tzinfo is timezone.utc
        assert value == local
        assert value.utcoffset() == timedelta(0)
    assert task == snapshot(created_at=NOW, updated_at=NOW, lease_until=NOW)
    converted = Transition("t-1", 1, None, TaskStatus.PENDING, local).at
    assert converted.tzinfo is timezone.utc


# -- integers --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, 2.5])
@pytest.mark.parametrize("field", ["status_version", "bucket", "attempt"])
def test_bool_float_and_str_are_refused_where_an_int_is_meant(field: str, value: object) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        snapshot(**{field: value})


def test_transition_version_must_be_an_int() -> None:
    with pytest.raises(TypeError):
        Transition("t-1", True, None, TaskStatus.PENDING, NOW)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Transition("t-1", -1, None, TaskStatus.PENDING, NOW)


@pytest.mark.parametrize("field", ["status_version", "bucket", "attempt"])
def test_negative_integers_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match="between"):
        snapshot(**{field: -1})


def test_integers_beyond_2_53_are_refused_and_the_limit_is_accepted() -> None:
    assert snapshot(status_version=MAX_INT).status_version == 2**53 - 1
    with pytest.raises(ValueError):
        snapshot(status_version=MAX_INT + 1)
    assert snapshot(bucket=2**31 - 1).bucket == 2**31 - 1
    with pytest.raises(ValueError):
        snapshot(bucket=2**31)


# -- identifiers -----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["task_id", "name", "key", "pipeline_run_id", "lease_owner"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", ValueError),
        ("a" * 1025, ValueError),
        ("é" * 512 + "a", ValueError),  # 1,025 UTF-8 bytes in 513 characters
        ("\ud800", ValueError),  # a lone surrogate does not encode to UTF-8
        ("ok\udfff", ValueError),
        (b"t-1", TypeError),
        (1, TypeError),
    ],
)
def test_unusable_identifiers_are_refused(
    field: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        snapshot(**{field: value})


@pytest.mark.parametrize(
    "value",
    ["a" * 1024, "é" * 512, "中" * 341 + "a", "\U0001f600" * 256],
)
def test_a_1024_byte_identifier_is_accepted(value: str) -> None:
    assert len(value.encode("utf-8")) == 1024
    assert snapshot(task_id=value).task_id == value


@pytest.mark.parametrize(
    "value", [" ", " a ", "a:b", "{evil}", "x}y", "*", "a[b]", "\x00", "line\nbreak", "x:history"]
)
def test_awkward_but_valid_identifiers_are_accepted(value: str) -> None:
    assert snapshot(task_id=value, name=value, tags=frozenset({value})).task_id == value


def test_none_is_refused_for_required_identifiers() -> None:
    with pytest.raises(TypeError):
        snapshot(task_id=None)
    with pytest.raises(TypeError):
        Command(None, "t-1", CommandKind.STOP, NOW)  # type: ignore[arg-type]


# -- tags ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [{"io", "urgent"}, ["io", "urgent", "io"], ("urgent", "io")])
def test_tags_are_coerced_to_a_frozenset(value: object) -> None:
    task = snapshot(tags=value)
    assert type(task.tags) is frozenset
    assert task.tags == frozenset({"io", "urgent"})


@pytest.mark.parametrize("value", [{"io", 1}, {"io", None}, {b"io"}, {""}, {"a" * 1025}])
def test_tags_with_a_member_that_is_not_an_identifier_are_refused(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        snapshot(tags=value)


@pytest.mark.parametrize("value", ["io", b"io", 5, None])
def test_tags_that_are_not_a_collection_are_refused(value: object) -> None:
    with pytest.raises(TypeError, match="tags"):
        snapshot(tags=value)


def test_default_tags_are_an_empty_frozenset() -> None:
    assert snapshot().tags == frozenset()


# -- nested records --------------------------------------------------------------------------


def test_progress_and_failure_must_be_the_record_types() -> None:
    with pytest.raises(TypeError):
        snapshot(progress={"current": 1})
    with pytest.raises(TypeError):
        snapshot(failure=("ValueError", "boom"))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((True,), TypeError),
        (("1",), TypeError),
        ((float("nan"),), ValueError),
        ((float("inf"),), ValueError),
        ((1, float("-inf")), ValueError),
        ((MAX_INT + 1,), ValueError),
        ((1, None, 5), TypeError),
        ((1, None, "x" * 4097), ValueError),
    ],
)
def test_progress_validates(args: tuple[object, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        Progress(*args)  # type: ignore[arg-type]


def test_progress_accepts_int_and_float() -> None:
    assert Progress(1, 2.5, "half").total == 2.5
    assert Progress(-MAX_INT).current == -MAX_INT


def test_failure_validates() -> None:
    assert Failure("ValueError", "boom", "Traceback ...").traceback == "Traceback ..."
    with pytest.raises(TypeError):
        Failure(ValueError, "boom")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Failure("E", "\ud800")


# -- statuses and commands -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "terminal"),
    [
        (TaskStatus.WAITING, False),
        (TaskStatus.PENDING, False),
        (TaskStatus.RUNNING, False),
        (TaskStatus.PAUSED, False),
        (TaskStatus.SUCCEEDED, True),
        (TaskStatus.FAILED, True),
        (TaskStatus.STOPPED, True),
        (TaskStatus.LOST, True),
    ],
)
def test_is_terminal_for_each_status(status: TaskStatus, terminal: bool) -> None:
    assert status.is_terminal is terminal


def test_every_status_is_classified_above() -> None:
    assert {s.value for s in TaskStatus} == {
        "waiting",
        "pending",
        "running",
        "paused",
        "succeeded",
        "failed",
        "stopped",
        "lost",
    }
    assert str(TaskStatus.RUNNING) == "running"
    assert str(CommandKind.STOP) == "stop"
    assert {k.value for k in CommandKind} >= {"stop", "pause", "resume"}


def test_transition_statuses_must_be_task_statuses() -> None:
    assert Transition("t-1", 1, None, TaskStatus.PENDING, NOW).from_status is None
    with pytest.raises(TypeError):
        Transition("t-1", 2, "pending", TaskStatus.RUNNING, NOW)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Transition("t-1", 2, TaskStatus.PENDING, "running", NOW)  # type: ignore[arg-type]


def test_command_kind_must_be_a_command_kind() -> None:
    with pytest.raises(TypeError):
        Command("c-1", "t-1", "stop", NOW)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Command("c-1", "t-1", CommandKind.STOP, NOW, outcome="x" * 1025)


# -- TaskQuery -------------------------------------------------------------------------------


def test_task_query_defaults_restrict_nothing() -> None:
    query = TaskQuery()
    assert query.statuses is None
    assert query.buckets is None
    assert query.limit is None
    assert query.newest_first is False


def test_task_query_coerces_sets_to_frozensets() -> None:
    query = TaskQuery(statuses={TaskStatus.RUNNING}, buckets=[1, 2, 2])  # type: ignore[arg-type]
    assert query.statuses == frozenset({TaskStatus.RUNNING})
    assert type(query.statuses) is frozenset
    assert query.buckets == frozenset({1, 2})
    assert type(query.buckets) is frozenset


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"statuses": {"running"}}, TypeError),
        ({"statuses": "running"}, TypeError),
        ({"statuses": TaskStatus.RUNNING}, TypeError),
        ({"buckets": {True}}, TypeError),
        ({"buckets": {-1}}, ValueError),
        ({"buckets": {2**31}}, ValueError),
        ({"buckets": 3}, TypeError),
        ({"name": ""}, ValueError),
        ({"name_prefix": 5}, TypeError),
        ({"tag": ""}, ValueError),
        ({"pipeline_run_id": "x" * 1025}, ValueError),
        ({"limit": -1}, ValueError),
        ({"limit": 1.0}, TypeError),
        ({"limit": True}, TypeError),
        ({"newest_first": 1}, TypeError),
        ({"newest_first": None}, TypeError),
    ],
)
def test_task_query_validates(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        TaskQuery(**kwargs)  # type: ignore[arg-type]


# -- TaskSnapshot.evolve: replace, checking only what changes -----------------------------------


def _base() -> TaskSnapshot:
    return TaskSnapshot("t1", "job", TaskStatus.RUNNING, 2, NOW, NOW, tags=frozenset({"io"}),
                        bucket=3, lease_owner="w", lease_until=NOW)  # fmt: skip


def test_evolve_checks_every_field_the_constructor_checks() -> None:
    from chongming_redis.model import _SNAPSHOT_CHECKS

    assert list(_SNAPSHOT_CHECKS) == [f.name for f in dataclasses.fields(TaskSnapshot)]


@pytest.mark.parametrize(
    "changes",
    [
        {"status": TaskStatus.SUCCEEDED, "status_version": 3, "updated_at": NOW, "result": [1]},
        {"progress": Progress(1, 2, "x"), "heartbeat_at": NOW + timedelta(seconds=1)},
        {"failure": Failure("E", "m"), "attempt": 2, "not_before": None, "tags": {"a", "b"}},
        {"updated_at": NOW.astimezone(timezone(timedelta(hours=5)))},  # stored in UTC
        {},
    ],
)
def test_evolve_gives_what_dataclasses_replace_gives(changes: dict[str, object]) -> None:
    evolved = _base().evolve(**changes)
    replaced = dataclasses.replace(_base(), **changes)
    assert evolved == replaced
    assert evolved.__dict__ == replaced.__dict__  # normalised alike (UTC, frozenset)
    assert evolved.updated_at.tzinfo is timezone.utc
    assert _base() == _base().evolve()  # the original is untouched


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"status": "succeeded"}, TypeError),
        ({"status_version": -1}, ValueError),
        ({"status_version": True}, TypeError),
        ({"updated_at": datetime(2024, 1, 1)}, ValueError),  # naive
        ({"bucket": 2**31}, ValueError),
        ({"lease_owner": ""}, ValueError),
        ({"progress": (1, 2)}, TypeError),
        ({"failure": "boom"}, TypeError),
        ({"tags": "io"}, TypeError),
        ({"no_such_field": 1}, TypeError),
    ],
)
def test_evolve_refuses_what_the_constructor_refuses(
    changes: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _base().evolve(**changes)
    if "no_such_field" not in changes:
        with pytest.raises(error):
            dataclasses.replace(_base(), **changes)


def test_a_waiting_task_names_its_parents_and_they_are_checked() -> None:
    made = TaskSnapshot("c", "job", TaskStatus.WAITING, 1, NOW, NOW, parents=["a", "b"])
    assert made.parents == ("a", "b") and made.on_parent_failure == "stop"
    assert made.evolve(on_parent_failure="run").on_parent_failure == "run"
    with pytest.raises(ValueError, match="at least one"):
        TaskSnapshot("c", "job", TaskStatus.WAITING, 1, NOW, NOW)
    with pytest.raises(ValueError, match="at least one"):
        made.evolve(parents=())
    with pytest.raises(ValueError, match="repeat"):
        made.evolve(parents=("a", "a"))
    with pytest.raises(TypeError, match="parents"):
        made.evolve(parents="ab")
    with pytest.raises(ValueError, match="'stop' or 'run'"):
        made.evolve(on_parent_failure="ignore")
    pending = made.evolve(status=TaskStatus.PENDING)  # parents stay: the task's record
    assert pending.parents == ("a", "b")
