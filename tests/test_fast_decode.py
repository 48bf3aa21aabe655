"""``fast_snapshot`` (``stores/_redis/rows.py``): the fast decoder of a task hash in its common
shape must agree with the strict decoder wherever it answers, and answer ``None`` (so the strict
decoder reports the corruption) for everything the strict decoder refuses.

Hashes are built the way ``RedisTaskStore`` writes them (``snapshot_to_row`` + the hash field
names), then a field at a time is replaced by something odd.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import Failure, Progress, TaskSnapshot, TaskStatus
from chongming_redis.stores._redis.keys import TASK_COLUMNS_BY_FIELD, TASK_FIELDS
from chongming_redis.stores._redis.rows import fast_snapshot
from chongming_redis.stores.codec import row_to_snapshot, snapshot_to_row

T0 = datetime(2026, 12, 1, 3, 4, 5, 678901, tzinfo=timezone.utc)


def stored(snapshot: TaskSnapshot) -> dict[bytes, bytes]:
    """The hash ``RedisTaskStore`` writes for ``snapshot`` (plus its tokens and feed fields)."""
    fields = {b"w": b"token123", b"ct": b"token000", b"fs": b"17"}
    for column, value in snapshot_to_row(snapshot).items():
        if column == "task_id" or value is None:
            continue
        text = repr(value) if type(value) is float else value
        fields[TASK_FIELDS[column].encode()] = (
            text if isinstance(text, bytes) else str(text).encode()
        )
    return fields


def strict(task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot:
    """What ``RedisTaskStore`` decodes without the fast path: the codec's strict reader."""
    row: dict[str, Any] = {"task_id": task_id}
    for field, value in fields.items():
        column = TASK_COLUMNS_BY_FIELD.get(field.decode())
        if column is not None:
            row[column] = value
    return row_to_snapshot(row)


INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack stores
snapshots = st.builds(
    TaskSnapshot,
    task_id=st.text("abc0123456789-_", min_size=1, max_size=24),
    name=st.sampled_from(["noop", "resize", "é-name", "名前"]),
    status=st.sampled_from([s for s in TaskStatus if s is not TaskStatus.WAITING]),
    status_version=st.integers(0, 2**53 - 1),
    created_at=st.just(T0),
    updated_at=st.integers(0, 10**9).map(lambda us: T0 + timedelta(microseconds=us)),
    bucket=st.integers(0, 2**31 - 1),
    key=st.none() | st.text(min_size=1, max_size=8),
    pipeline_run_id=st.none() | st.just("run-1"),
    params=st.none() | st.dictionaries(st.text(max_size=4), INTS | st.text(max_size=4)),
    result=st.none() | INTS | st.lists(st.booleans(), max_size=3),
    heartbeat_at=st.none() | st.just(T0),
    lease_owner=st.none() | st.just("host-1"),
    lease_until=st.none() | st.just(T0 + timedelta(seconds=30)),
    attempt=st.integers(1, 10),
    not_before=st.none() | st.just(T0 + timedelta(seconds=1)),
    priority=st.integers(-100, 100),
)


@settings(max_examples=300, deadline=None)
@given(snapshots)
def test_the_fast_decoder_gives_exactly_the_snapshot_stored(snapshot: TaskSnapshot) -> None:
    fields = stored(snapshot)
    assert fast_snapshot(snapshot.task_id, fields) == snapshot
    assert strict(snapshot.task_id, fields) == snapshot


BASE = TaskSnapshot("t1", "noop", TaskStatus.RUNNING, 2, T0, T0, bucket=3, attempt=1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (b"v", b"007"), (b"v", b"+7"), (b"v", b" 7"), (b"v", b"-1"), (b"v", b"7.0"),
        (b"b", b"2147483648"), (b"at", b""), (b"c", b"99999999999999999"), (b"u", b"x"),
        (b"s", b"RUNNING"), (b"s", b"done"), (b"n", b""), (b"n", b"\xff\xfe"),
        (b"a", b"\xc1"), (b"lo", b"\xff"), (b"k", b""), (b"hb", b"01"),
    ],
)  # fmt: skip
def test_anything_the_strict_decoder_refuses_the_fast_one_leaves_to_it(
    field: bytes, value: bytes
) -> None:
    fields = {**stored(BASE), field: value}
    assert fast_snapshot("t1", fields) is None
    with pytest.raises((CorruptRecord, ValueError, TypeError)):
        strict("t1", fields)


@pytest.mark.parametrize("missing", [b"n", b"s", b"v", b"c", b"u", b"b", b"at"])
def test_a_missing_required_field_is_left_to_the_strict_decoder(missing: bytes) -> None:
    fields = stored(BASE)
    del fields[missing]
    assert fast_snapshot("t1", fields) is None


@pytest.mark.parametrize(
    "snapshot",
    [
        TaskSnapshot("t1", "noop", TaskStatus.PENDING, 1, T0, T0, tags=frozenset({"io"})),
        TaskSnapshot("t1", "noop", TaskStatus.RUNNING, 2, T0, T0, progress=Progress(1, 2, "x")),
        TaskSnapshot("t1", "noop", TaskStatus.FAILED, 3, T0, T0, failure=Failure("E", "m", "tb")),
    ],
)
def test_tags_progress_and_failure_go_the_strict_way_and_still_decode(
    snapshot: TaskSnapshot,
) -> None:
    fields = stored(snapshot)
    assert fast_snapshot("t1", fields) is None
    assert strict("t1", fields) == snapshot


def test_unknown_extra_fields_go_the_strict_way_which_ignores_them() -> None:
    fields = {**stored(BASE), b"zz": b"written by another client"}
    assert fast_snapshot("t1", fields) is None
    assert strict("t1", fields) == BASE


def test_a_field_name_that_is_not_utf8_is_left_to_the_strict_decoder() -> None:
    fields = {**stored(BASE), b"\xff\xfe": b"x"}
    assert fast_snapshot("t1", fields) is None
