"""The codec: exact round trips, strict decoding, and errors that name the column."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.codec import (
    COMMAND_COLUMNS,
    LEASE_COLUMNS,
    MAX_PAYLOAD_BYTES,
    SNAPSHOT_COLUMNS,
    TRANSITION_COLUMNS,
    Row,
    RowError,
    command_to_row,
    decode_dt,
    decode_tags,
    encode_dt,
    encode_payload,
    encode_tags,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
    snapshot_to_row,
    transition_to_row,
)
from chongming_redis.validation import EPOCH, MAX_EPOCH_US, MAX_INT

BOUNDED = settings(max_examples=150, deadline=None)
LAST_INSTANT = EPOCH + timedelta(microseconds=MAX_EPOCH_US)
TOKYO = timezone(timedelta(hours=9))
NEWFOUNDLAND = timezone(-timedelta(hours=3, minutes=30))
NOW = datetime(2024, 5, 17, 12, 30, 45, 123456, tzinfo=timezone.utc)


def full_snapshot() -> TaskSnapshot:
    """Every field filled, with non-UTC inputs, non-ASCII text and awkward payloads."""
    return TaskSnapshot(
        task_id="任务-{1}:a b",
        name="résumé/resize",
        status=TaskStatus.PAUSED,
        status_version=7,
        created_at=datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=TOKYO),
        updated_at=datetime(2024, 1, 2, 3, 4, 5, 999999, tzinfo=NEWFOUNDLAND),
        tags=frozenset({"io", "ios", "紧急", "a:b"}),
        bucket=2**31 - 1,
        key="user:42",
        pipeline_run_id="run-é",
        params={
            "big": 2**63 - 1,
            "small": -(2**63),
            "huge": 2**64 - 1,
            "float": 0.1,
            "text": "日本語 ✓",
            "bytes": b"\x00\xff",
            "nested": [1, [2, {"x": None, "y": True}]],
        },
        result=["ok", 1.5, b"raw", {"n": 0}],
        progress=Progress(3, 10.5, "3 of 10½"),
        failure=Failure("ValueError", "bad ✗", "Traceback (most recent call last):\n  ..."),
        heartbeat_at=datetime(2030, 6, 1, 0, 0, 0, 1, tzinfo=TOKYO),
        lease_owner="worker-ü",
        lease_until=datetime(2030, 6, 1, 0, 0, 30, tzinfo=timezone.utc),
        attempt=3,
        not_before=LAST_INSTANT,
    )


def as_redis_bytes(row: Row) -> dict[str, bytes]:
    """The row as Redis hands a hash back: every value as bytes, absent values dropped."""
    out: dict[str, bytes] = {}
    for column, value in row.items():
        if value is None:
            continue
        if isinstance(value, bytes):
            out[column] = value
        elif isinstance(value, str):
            out[column] = value.encode("utf-8")
        else:
            out[column] = repr(value).encode("ascii")
    return out


# -- exact round trips -----------------------------------------------------------------------


def test_a_snapshot_with_every_field_filled_round_trips_exactly() -> None:
    original = full_snapshot()
    row = snapshot_to_row(original)
    assert tuple(row) == SNAPSHOT_COLUMNS
    decoded = row_to_snapshot(row)
    assert decoded == original
    for name in ("created_at", "updated_at", "heartbeat_at", "lease_until", "not_before"):
        assert getattr(decoded, name).tzinfo is timezone.utc
        assert getattr(decoded, name) == getattr(original, name)
    assert type(decoded.tags) is frozenset
    assert decoded.params["big"] == 2**63 - 1
    assert type(decoded.progress) is Progress
    assert type(decoded.failure) is Failure


def test_the_full_snapshot_round_trips_from_redis_style_bytes() -> None:
    original = full_snapshot()
    assert row_to_snapshot(as_redis_bytes(snapshot_to_row(original))) == original


def test_a_minimal_snapshot_round_trips_and_absent_columns_mean_none() -> None:
    task = TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW)
    row = snapshot_to_row(task)
    assert row_to_snapshot(row) == task
    sparse = {k: v for k, v in row.items() if v is not None}
    assert row_to_snapshot(sparse) == task


def test_flat_columns_for_progress_failure_and_the_lease() -> None:
    row = snapshot_to_row(full_snapshot())
    assert row["progress_current"] == 3
    assert row["progress_total"] == 10.5
    assert row["progress_message"] == "3 of 10½"
    assert row["failure_type"] == "ValueError"
    assert row["failure_message"] == "bad ✗"
    assert row["status"] == "paused"
    assert LEASE_COLUMNS == ("lease_owner", "lease_until")
    assert all(not isinstance(v, dict | list | tuple) for v in row.values())


def test_tuples_in_params_come_back_as_lists() -> None:
    task = TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW, params=(1, (2, 3)))
    assert row_to_snapshot(snapshot_to_row(task)).params == [1, [2, 3]]


def test_transition_round_trips() -> None:
    first = Transition("任务", 1, None, TaskStatus.PENDING, datetime(2024, 1, 1, tzinfo=TOKYO))
    later = Transition("任务", 9, TaskStatus.RUNNING, TaskStatus.LOST, NOW, reason="lease ✗")
    for transition in (first, later):
        row = transition_to_row(transition)
        assert tuple(row) == TRANSITION_COLUMNS
        assert row_to_transition(row) == transition
        assert row_to_transition(as_redis_bytes(row)) == transition


def test_command_round_trips() -> None:
    bare = Command("c-1", "t-1", CommandKind.STOP, NOW)
    full = Command(
        "c-{2}",
        "任务",
        CommandKind.PAUSE,
        datetime(2024, 1, 1, 9, tzinfo=TOKYO),
        issued_by="ctl-ä",
        payload={"reason": "maintenance", "n": 2**63 - 1, "raw": b"\x01"},
        lease_until=datetime(2024, 1, 1, 0, 0, 30, tzinfo=timezone.utc),
        finished_at=LAST_INSTANT,
        outcome="paused ✓",
    )
    for command in (bare, full):
        row = command_to_row(command)
        assert tuple(row) == COMMAND_COLUMNS
        assert row_to_command(row) == command
        assert row_to_command(as_redis_bytes(row)) == command


# -- datetimes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "micros"),
    [
        (EPOCH, 0),
        (EPOCH + timedelta(microseconds=1), 1),
        (LAST_INSTANT, 2**53 - 1),
        (LAST_INSTANT - timedelta(microseconds=1), 2**53 - 2),
        (datetime(2024, 1, 1, 9, 0, 0, 1, tzinfo=TOKYO), 1704067200000001),
        (datetime(1970, 1, 1, 0, 0, 0, 999999, tzinfo=timezone.utc), 999999),
    ],
)
def test_encode_dt_is_exact_to_the_microsecond(moment: datetime, micros: int) -> None:
    assert encode_dt(moment) == micros
    assert decode_dt(micros) == moment
    assert decode_dt(str(micros)) == moment
    assert decode_dt(str(micros).encode()) == moment
    assert decode_dt(micros).tzinfo is timezone.utc


@pytest.mark.parametrize(
    "moment",
    [
        EPOCH - timedelta(microseconds=1),
        LAST_INSTANT + timedelta(microseconds=1),
        datetime(2024, 1, 1),
    ],
)
def test_encode_dt_refuses_what_the_model_refuses(moment: datetime) -> None:
    with pytest.raises(ValueError):
        encode_dt(moment)


@pytest.mark.parametrize(
    "text",
    ["1e3", "0x10", "-5", " 5", "5 ", "5\n", "05", "+5", "1.0", "", "abc", "inf", "nan", "٣"],
)
def test_decode_dt_refuses_non_canonical_or_out_of_range_text(text: str) -> None:
    with pytest.raises(ValueError):
        decode_dt(text)
    with pytest.raises(ValueError):
        decode_dt(text.encode("utf-8"))


@pytest.mark.parametrize("value", [-1, 2**53, 1.0, None, True])
def test_decode_dt_refuses_out_of_range_or_non_int_values(value: Any) -> None:
    with pytest.raises(ValueError):
        decode_dt(value)


# -- tags ------------------------------------------------------------------------------------


def test_encode_tags_is_sorted_compact_json() -> None:
    assert encode_tags(frozenset({"urgent", "io", "ios", "é"})) == '["io","ios","urgent","é"]'
    assert encode_tags(frozenset()) == "[]"
    assert decode_tags('["io","ios"]') == frozenset({"io", "ios"})
    assert decode_tags(b'["\xc3\xa9"]') == frozenset({"é"})


def test_equal_tag_sets_encode_equally() -> None:
    assert encode_tags(frozenset(["b", "a", "c"])) == encode_tags(frozenset(["c", "b", "a"]))


def test_a_quoted_tag_never_matches_a_substring_of_another() -> None:
    assert '"io"' not in encode_tags(frozenset({"ios", "radio"}))
    assert '"io"' in encode_tags(frozenset({"ios", "io"}))


@pytest.mark.parametrize("text", ["io", '{"a":1}', '["a",1]', '[""]', "[", '"io"'])
def test_decode_tags_refuses_anything_but_an_array_of_non_empty_strings(text: str) -> None:
    with pytest.raises(ValueError):
        decode_tags(text)


# -- payloads --------------------------------------------------------------------------------


def test_payload_of_exactly_the_limit_is_accepted_and_one_more_byte_is_refused() -> None:
    header = len(msgpack.packb(b"x" * 70000, use_bin_type=True)) - 70000  # bin32: 5 bytes
    at_limit = b"x" * (MAX_PAYLOAD_BYTES - header)
    encoded = encode_payload(at_limit)
    assert encoded is not None
    assert len(encoded) == MAX_PAYLOAD_BYTES
    with pytest.raises(ValueError, match="at most"):
        encode_payload(at_limit + b"x")


def test_the_payload_limit_applies_to_params_result_and_command_payload() -> None:
    too_big = b"x" * MAX_PAYLOAD_BYTES
    task = TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW, params=too_big)
    with pytest.raises(ValueError, match="params"):
        snapshot_to_row(task)
    task = TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW, result=too_big)
    with pytest.raises(ValueError, match="result"):
        snapshot_to_row(task)
    with pytest.raises(ValueError, match="payload"):
        command_to_row(Command("c", "t", CommandKind.STOP, NOW, payload=too_big))


@pytest.mark.parametrize("value", [object(), {1, 2}, NOW, {"when": NOW}, Progress(1)])
def test_an_unserialisable_payload_raises_type_error(value: object) -> None:
    task = TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW, params=value)
    with pytest.raises(TypeError, match="not serialisable"):
        snapshot_to_row(task)


def test_an_unencodable_payload_raises_value_error() -> None:
    with pytest.raises(ValueError):
        encode_payload(2**64)  # beyond msgpack's integers
    with pytest.raises(ValueError):
        encode_payload("\ud800")


def test_none_payload_stays_none() -> None:
    assert encode_payload(None) is None
    row = snapshot_to_row(TaskSnapshot("t", "n", TaskStatus.PENDING, 0, NOW, NOW))
    assert row["params"] is None
    assert row["result"] is None


# -- strict decoding: RowError names the column ----------------------------------------------


def corrupt(column: str, value: Any) -> Row:
    row = snapshot_to_row(full_snapshot())
    if value is _MISSING:
        del row[column]
    else:
        row[column] = value
    return row


_MISSING = object()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("status_version", _MISSING),
        ("status_version", None),
        ("status_version", "abc"),
        ("status_version", "1e3"),
        ("status_version", "0x10"),
        ("status_version", b"01"),
        ("status_version", "-5"),
        ("status_version", 1.5),
        ("status", "zombie"),
        ("status", b"RUNNING"),
        ("status", _MISSING),
        ("task_id", _MISSING),
        ("task_id", ""),
        ("name", b"\xff\xfe"),
        ("name", 5),
        ("created_at", "yesterday"),
        ("created_at", _MISSING),
        ("updated_at", "-1"),
        ("heartbeat_at", "1e3"),
        ("lease_until", str(2**53)),
        ("tags", "not json"),
        ("tags", "[1]"),
        ("tags", b"\xff"),
        ("tags", 5),
        ("params", b"\xc1"),
        ("params", b"\x92\x01"),
        ("params", b"\x01\x02"),
        ("params", "text, not bytes"),
        ("result", b"\xd9\x05ab"),
        ("bucket", str(2**31)),
        ("attempt", "one"),
        ("progress_current", "many"),
        ("progress_total", "nan"),
        ("failure_message", _MISSING),
        # decoded fine, then refused by the model: still the right column
        ("key", ""),
        ("lease_owner", ""),
        ("pipeline_run_id", "x" * 1025),
        ("attempt", "-1"),
        ("tags", json.dumps(["a" * 1025])),
        ("progress_message", "x" * 4097),
        ("failure_type", "x" * 1025),
        ("failure_traceback", "x" * (256 * 1024 + 1)),
    ],
)
def test_a_corrupt_snapshot_row_raises_row_error_naming_the_column(column: str, value: Any) -> None:
    with pytest.raises(RowError) as caught:
        row_to_snapshot(corrupt(column, value))
    assert caught.value.column == column
    assert repr(column) in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("row", [None, [("task_id", "t")], "task_id=t"])
def test_a_row_that_is_not_a_mapping_raises_row_error(row: Any) -> None:
    with pytest.raises(RowError) as caught:
        row_to_snapshot(row)
    assert caught.value.column is None


def test_corrupt_transition_and_command_rows_name_the_column() -> None:
    row = transition_to_row(Transition("t", 2, TaskStatus.PENDING, TaskStatus.RUNNING, NOW))
    with pytest.raises(RowError) as caught:
        row_to_transition({**row, "from_status": "sleeping"})
    assert caught.value.column == "from_status"
    with pytest.raises(RowError) as caught:
        row_to_transition({**row, "version": "2.0"})
    assert caught.value.column == "version"
    crow = command_to_row(Command("c", "t", CommandKind.STOP, NOW))
    with pytest.raises(RowError) as caught:
        row_to_command({**crow, "kind": "explode"})
    assert caught.value.column == "kind"
    with pytest.raises(RowError) as caught:
        row_to_command({**crow, "payload": b"\xc1"})
    assert caught.value.column == "payload"


# -- properties ------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
_offsets = st.integers(min_value=-(24 * 3600 - 1), max_value=24 * 3600 - 1).map(
    lambda s: timezone(timedelta(seconds=s))
)


@st.composite
def aware_datetimes(draw: st.DrawFn) -> datetime:
    """Any microsecond of the storable range, expressed in a random fixed offset."""
    micros = draw(
        st.one_of(
            st.integers(min_value=0, max_value=MAX_EPOCH_US),
            st.sampled_from([0, 1, MAX_EPOCH_US - 1, MAX_EPOCH_US]),
        )
    )
    return (EPOCH + timedelta(microseconds=micros)).astimezone(draw(_offsets))


_payloads = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | _text
    | st.binary(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=12,
)
_numbers = st.integers(min_value=-MAX_INT, max_value=MAX_INT) | st.floats(
    allow_nan=False, allow_infinity=False
)
_progress = st.builds(Progress, _numbers, st.none() | _numbers, st.none() | _text)
_failure = st.builds(Failure, _text, _text, st.none() | _text)
_statuses = st.sampled_from(list(TaskStatus))
_optional_dt = st.none() | aware_datetimes()
# A WAITING task names at least one parent (the model refuses it otherwise).
_parents = st.lists(_ids, min_size=1, max_size=4, unique=True).map(tuple)
_status_and_parents = st.one_of(
    st.tuples(st.sampled_from([s for s in TaskStatus if s is not TaskStatus.WAITING]),
              st.just(()) | _parents),
    st.tuples(st.just(TaskStatus.WAITING), _parents),
)  # fmt: skip


def _snapshot(
    status_and_parents: tuple[TaskStatus, tuple[str, ...]], **fields: object
) -> TaskSnapshot:
    status, parents = status_and_parents
    return TaskSnapshot(status=status, parents=parents, **fields)  # type: ignore[arg-type]


snapshots = st.builds(
    _snapshot,
    _status_and_parents,
    task_id=_ids,
    name=_ids,
    on_parent_failure=st.sampled_from(["stop", "run"]),
    status_version=st.integers(min_value=0, max_value=MAX_INT),
    created_at=aware_datetimes(),
    updated_at=aware_datetimes(),
    tags=st.frozensets(_ids, max_size=5),
    bucket=st.integers(min_value=0, max_value=2**31 - 1),
    key=st.none() | _ids,
    pipeline_run_id=st.none() | _ids,
    params=_payloads,
    result=_payloads,
    progress=st.none() | _progress,
    failure=st.none() | _failure,
    heartbeat_at=_optional_dt,
    lease_owner=st.none() | _ids,
    lease_until=_optional_dt,
    attempt=st.integers(min_value=0, max_value=MAX_INT),
    not_before=_optional_dt,
    priority=st.integers(-100, 100),
)
transitions = st.builds(
    Transition,
    task_id=_ids,
    version=st.integers(min_value=1, max_value=MAX_INT),
    from_status=st.none() | _statuses,
    to_status=_statuses,
    at=aware_datetimes(),
    reason=st.none() | _text,
)
commands = st.builds(
    Command,
    command_id=_ids,
    task_id=_ids,
    kind=st.sampled_from(list(CommandKind)),
    created_at=aware_datetimes(),
    issued_by=st.none() | _ids,
    payload=_payloads,
    lease_until=_optional_dt,
    finished_at=_optional_dt,
    outcome=st.none() | _text,
)


@BOUNDED
@given(snapshots)
def test_property_every_snapshot_round_trips_exactly(task: TaskSnapshot) -> None:
    row = snapshot_to_row(task)
    assert row_to_snapshot(row) == task
    assert row_to_snapshot(as_redis_bytes(row)) == task


@BOUNDED
@given(snapshots)
def test_property_the_row_survives_json_text_as_well(task: TaskSnapshot) -> None:
    """A text backend that stores the non-bytes columns as JSON gets the same snapshot."""
    row = snapshot_to_row(task)
    texts = {k: v for k, v in row.items() if not isinstance(v, bytes)}
    back: dict[str, Any] = json.loads(json.dumps(texts))
    back.update({k: v for k, v in row.items() if isinstance(v, bytes)})
    assert row_to_snapshot(back) == task


@BOUNDED
@given(transitions)
def test_property_every_transition_round_trips_exactly(transition: Transition) -> None:
    row = transition_to_row(transition)
    assert row_to_transition(row) == transition
    assert row_to_transition(as_redis_bytes(row)) == transition


@BOUNDED
@given(commands)
def test_property_every_command_round_trips_exactly(command: Command) -> None:
    row = command_to_row(command)
    assert row_to_command(row) == command
    assert row_to_command(as_redis_bytes(row)) == command


@BOUNDED
@given(aware_datetimes())
def test_property_datetimes_round_trip_to_the_microsecond_in_any_offset(moment: datetime) -> None:
    micros = encode_dt(moment)
    assert type(micros) is int
    assert 0 <= micros <= MAX_EPOCH_US
    decoded = decode_dt(micros)
    assert decoded == moment
    assert decoded.tzinfo is timezone.utc
    assert decode_dt(str(micros)) == moment
    assert decoded.replace(tzinfo=None) == moment.astimezone(timezone.utc).replace(tzinfo=None)


@BOUNDED
@given(aware_datetimes(), aware_datetimes())
def test_property_encoding_preserves_order(a: datetime, b: datetime) -> None:
    assert (encode_dt(a) < encode_dt(b)) == (a < b)
    assert (encode_dt(a) == encode_dt(b)) == (a == b)


@BOUNDED
@given(st.frozensets(_ids, max_size=8))
def test_property_tags_round_trip_and_encode_sorted(tags: frozenset[str]) -> None:
    text = encode_tags(tags)
    assert decode_tags(text) == tags
    assert decode_tags(text.encode("utf-8")) == tags
    assert json.loads(text) == sorted(tags)
