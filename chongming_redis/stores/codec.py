"""Records <-> flat rows of primitives, the one serialisation every store reuses.

A row is a one-level ``dict`` from column name to ``str``, ``int``, ``float``, ``bytes`` or
``None``: a relational row as it is, a document as a sub-object, a Redis hash as fields.

* Datetimes are integer microseconds since the Unix epoch, UTC (exact to the microsecond, and
  exact as a Lua double or sorted-set score until 2255).
* Enums are stored by ``.value``.
* Tags are a JSON array of the sorted tags (``["io","urgent"]``), so exact matching is
  possible in any backend (a quoted element never matches a substring).
* ``params`` and ``result`` are msgpack (``MAX_PAYLOAD_BYTES`` each, checked on encode); this
  module is the only place they are encoded.
* ``Progress`` and ``Failure`` are flattened into ``progress_*`` / ``failure_*`` columns.

Decoding is strict: a missing required column, a non-canonical integer, an unknown status or
undecodable bytes raise ``RowError`` naming the column; stores turn that into ``CorruptRecord``
naming the key. Decoders accept ``bytes``/``str`` where a backend hands back text (Redis does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgpack

from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.validation import EPOCH, MAX_EPOCH_US, check_dt, check_identifier

Primitive = str | int | float | bytes | None
Row = dict[str, Primitive]

MAX_PAYLOAD_BYTES = 1024 * 1024

_T = TypeVar("_T")

SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "task_id",
    "name",
    "status",
    "status_version",
    "created_at",
    "updated_at",
    "tags",
    "bucket",
    "key",
    "pipeline_run_id",
    "params",
    "result",
    "progress_current",
    "progress_total",
    "progress_message",
    "failure_type",
    "failure_message",
    "failure_traceback",
    "heartbeat_at",
    "lease_owner",
    "lease_until",
    "attempt",
    "not_before",
)
LEASE_COLUMNS: tuple[str, ...] = ("lease_owner", "lease_until")
TRANSITION_COLUMNS: tuple[str, ...] = (
    "task_id",
    "version",
    "from_status",
    "to_status",
    "at",
    "reason",
)
COMMAND_COLUMNS: tuple[str, ...] = (
    "command_id",
    "task_id",
    "kind",
    "created_at",
    "issued_by",
    "payload",
    "lease_until",
    "finished_at",
    "outcome",
)

_CANONICAL_INT = re.compile(r"^(0|-?[1-9][0-9]*)$")


class RowError(ValueError):
    """A row does not decode; ``column`` names the culprit (``None``: the row as a whole)."""

    def __init__(self, column: str | None, detail: str) -> None:
        self.column = column
        self.detail = detail
        super().__init__(detail if column is None else f"column {column!r}: {detail}")


# -- scalars ---------------------------------------------------------------------------------


def encode_dt(value: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch, UTC."""
    return _micros(check_dt(value, "datetime"))


def _micros(utc: datetime) -> int:
    """``encode_dt`` without the checks, for a datetime a record already validated."""
    delta = utc - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def decode_dt(value: int | str | bytes) -> datetime:
    """The inverse of ``encode_dt``; accepts the integer or its canonical decimal text."""
    micros = _int_value(value)
    if micros < 0 or micros > MAX_EPOCH_US:
        raise ValueError(f"timestamp {micros} is outside the storable range")
    return EPOCH + timedelta(microseconds=micros)


def encode_tags(tags: frozenset[str]) -> str:
    """Tags as a JSON array, sorted, so equal sets encode equally."""
    for tag in tags:
        check_identifier(tag, "tag")
    return _tags_json(tags)


def _tags_json(tags: frozenset[str]) -> str:
    return json.dumps(sorted(tags), ensure_ascii=False, separators=(",", ":"))


def decode_tags(value: str | bytes) -> frozenset[str]:
    text = value.decode("utf-8") if isinstance(value, bytes) else value
    items = json.loads(text)
    if not isinstance(items, list) or not all(isinstance(t, str) and t for t in items):
        raise ValueError("tags must be a JSON array of non-empty strings")
    return frozenset(items)


def encode_payload(value: Any, what: str = "payload") -> bytes | None:
    """``params``/``result``/``payload`` as msgpack; ``None`` stays ``None``."""
    if value is None:
        return None
    try:
        data = msgpack.packb(value, use_bin_type=True, datetime=False)
    except TypeError as exc:
        raise TypeError(f"{what} is not serialisable (msgpack): {exc}") from None
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"{what} is not serialisable (msgpack): {exc}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"{what} is {len(data)} bytes encoded; at most {MAX_PAYLOAD_BYTES} are allowed"
        )
    return bytes(data)


def decode_payload(value: bytes | str) -> Any:
    if not isinstance(value, bytes):
        raise ValueError("payload must be bytes")
    return msgpack.unpackb(value, raw=False, strict_map_key=False)


# -- snapshots -------------------------------------------------------------------------------


def snapshot_to_row(snapshot: TaskSnapshot) -> Row:
    """Every column of ``SNAPSHOT_COLUMNS``; absent values are ``None``."""
    progress, failure = snapshot.progress, snapshot.failure
    return {
        "task_id": snapshot.task_id,
        "name": snapshot.name,
        "status": snapshot.status.value,
        "status_version": snapshot.status_version,
        "created_at": _micros(snapshot.created_at),
        "updated_at": _micros(snapshot.updated_at),
        "tags": _tags_json(snapshot.tags),
        "bucket": snapshot.bucket,
        "key": snapshot.key,
        "pipeline_run_id": snapshot.pipeline_run_id,
        "params": encode_payload(snapshot.params, "params"),
        "result": encode_payload(snapshot.result, "result"),
        **progress_to_columns(progress),
        "failure_type": None if failure is None else failure.error_type,
        "failure_message": None if failure is None else failure.message,
        "failure_traceback": None if failure is None else failure.traceback,
        "heartbeat_at": _opt_dt(snapshot.heartbeat_at),
        "lease_owner": snapshot.lease_owner,
        "lease_until": _opt_dt(snapshot.lease_until),
        "attempt": snapshot.attempt,
        "not_before": _opt_dt(snapshot.not_before),
    }


def progress_to_columns(progress: Progress | None) -> Row:
    if progress is None:
        return {"progress_current": None, "progress_total": None, "progress_message": None}
    return {
        "progress_current": progress.current,
        "progress_total": progress.total,
        "progress_message": progress.message,
    }


def touch_columns(
    progress: Progress | None,
    heartbeat_at: datetime | None,
    lease_owner: str | None,
    lease_until: datetime | None,
) -> Row:
    """The columns a ``touch`` writes: only those of the arguments given (``None`` = leave
    alone); a given ``Progress`` writes all three ``progress_*`` columns."""
    columns: Row = {}
    if progress is not None:
        columns.update(progress_to_columns(progress))
    if heartbeat_at is not None:
        columns["heartbeat_at"] = encode_dt(heartbeat_at)
    if lease_owner is not None:
        columns["lease_owner"] = lease_owner
    if lease_until is not None:
        columns["lease_until"] = encode_dt(lease_until)
    return columns


def row_to_snapshot(row: Mapping[str, Primitive]) -> TaskSnapshot:
    """The inverse of ``snapshot_to_row``. Missing optional columns mean ``None``."""
    return _decode(row, _snapshot_from)


def _snapshot_from(r: _Reader) -> TaskSnapshot:
    current = r.number("progress_current")
    failure_type = r.text("failure_type")
    return TaskSnapshot(
        task_id=r.text_required("task_id"),
        name=r.text_required("name"),
        status=r.status("status"),
        status_version=r.int_required("status_version"),
        created_at=r.dt_required("created_at"),
        updated_at=r.dt_required("updated_at"),
        tags=r.tags("tags"),
        bucket=r.int_required("bucket"),
        key=r.text("key"),
        pipeline_run_id=r.text("pipeline_run_id"),
        params=r.payload("params"),
        result=r.payload("result"),
        progress=None
        if current is None
        else Progress(current, r.number("progress_total"), r.text("progress_message")),
        failure=None
        if failure_type is None
        else Failure(failure_type, r.text_required("failure_message"), r.text("failure_traceback")),
        heartbeat_at=r.dt("heartbeat_at"),
        lease_owner=r.text("lease_owner"),
        lease_until=r.dt("lease_until"),
        attempt=r.int_required("attempt"),
        not_before=r.dt("not_before"),
    )


# -- transitions -----------------------------------------------------------------------------


def transition_to_row(transition: Transition) -> Row:
    return {
        "task_id": transition.task_id,
        "version": transition.version,
        "from_status": None if transition.from_status is None else transition.from_status.value,
        "to_status": transition.to_status.value,
        "at": _micros(transition.at),
        "reason": transition.reason,
    }


def row_to_transition(row: Mapping[str, Primitive]) -> Transition:
    return _decode(row, _transition_from)


def _transition_from(r: _Reader) -> Transition:
    return Transition(
        task_id=r.text_required("task_id"),
        version=r.int_required("version"),
        from_status=None if r.raw("from_status") is None else r.status("from_status"),
        to_status=r.status("to_status"),
        at=r.dt_required("at"),
        reason=r.text("reason"),
    )


# -- commands --------------------------------------------------------------------------------


def command_to_row(command: Command) -> Row:
    return {
        "command_id": command.command_id,
        "task_id": command.task_id,
        "kind": command.kind.value,
        "created_at": _micros(command.created_at),
        "issued_by": command.issued_by,
        "payload": encode_payload(command.payload, "payload"),
        "lease_until": _opt_dt(command.lease_until),
        "finished_at": _opt_dt(command.finished_at),
        "outcome": command.outcome,
    }


def row_to_command(row: Mapping[str, Primitive]) -> Command:
    return _decode(row, _command_from)


def _command_from(r: _Reader) -> Command:
    kind = r.text_required("kind")
    try:
        command_kind = CommandKind(kind)
    except ValueError:
        raise RowError("kind", f"unknown command kind {kind!r}") from None
    return Command(
        command_id=r.text_required("command_id"),
        task_id=r.text_required("task_id"),
        kind=command_kind,
        created_at=r.dt_required("created_at"),
        issued_by=r.text("issued_by"),
        payload=r.payload("payload"),
        lease_until=r.dt("lease_until"),
        finished_at=r.dt("finished_at"),
        outcome=r.text("outcome"),
    )


# -- decoding machinery ----------------------------------------------------------------------


def _opt_dt(value: datetime | None) -> int | None:
    """For datetimes of a validated record (aware, UTC, in range)."""
    return None if value is None else _micros(value)


def _int_value(value: object) -> int:
    if type(value) is int:
        return value
    # Fast path for what stores hand back: non-negative canonical decimal text.
    if type(value) is bytes and value.isdigit() and (value[0] != 48 or len(value) == 1):
        return int(value)
    if isinstance(value, bytes | str):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if _CANONICAL_INT.fullmatch(text):
            return int(text)
        raise ValueError(f"{text[:40]!r} is not a canonical integer")
    raise ValueError(f"expected an integer, got {type(value).__name__}")


def _decode(row: Mapping[str, Primitive], build: Callable[[_Reader], _T]) -> _T:
    if not isinstance(row, Mapping):
        raise RowError(None, f"a row must be a mapping, not {type(row).__name__}")
    reader = _Reader(row)
    try:
        return build(reader)
    except RowError:
        raise
    except (TypeError, ValueError) as exc:
        # The model refused a decoded value (e.g. a negative version stored by another client).
        # The records are built after every column was read, so the column read last is not the
        # culprit; the model's messages start with the field's name, which names the column.
        raise RowError(_column_of(str(exc), row), str(exc)) from None


_FIELD_COLUMNS = {
    "Progress.current": "progress_current",
    "Progress.total": "progress_total",
    "Progress.message": "progress_message",
    "Failure.error_type": "failure_type",
    "Failure.message": "failure_message",
    "Failure.traceback": "failure_traceback",
    "tag": "tags",
}


def _column_of(message: str, row: Mapping[str, Primitive]) -> str | None:
    field = message.split(" ", 1)[0]
    column = _FIELD_COLUMNS.get(field, field)
    return column if column in row else None


class _Reader:
    """Typed access to one row; every failure names its column."""

    def __init__(self, row: Mapping[str, Primitive]) -> None:
        self.row = row
        self.raw = row.get

    def _fail(self, column: str, detail: str) -> RowError:
        return RowError(column, detail)

    def text(self, column: str) -> str | None:
        value = self.raw(column)
        if value is None or type(value) is str:
            return value
        if type(value) is bytes:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise self._fail(column, "is not valid UTF-8") from None
        raise self._fail(column, f"expected text, got {type(value).__name__}")

    def text_required(self, column: str) -> str:
        value = self.text(column)
        if value is None:
            raise self._fail(column, "is missing")
        return value

    def int_opt(self, column: str) -> int | None:
        value = self.raw(column)
        if value is None:
            return None
        try:
            return _int_value(value)
        except ValueError as exc:
            raise self._fail(column, str(exc)) from None

    def int_required(self, column: str) -> int:
        value = self.int_opt(column)
        if value is None:
            raise self._fail(column, "is missing")
        return value

    def number(self, column: str) -> int | float | None:
        value = self.raw(column)
        if value is None or type(value) in (int, float):
            return value  # type: ignore[return-value]
        if isinstance(value, bytes | str):
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            if _CANONICAL_INT.fullmatch(text):
                return int(text)
            try:
                return float(text)
            except ValueError:
                raise self._fail(column, f"{text[:40]!r} is not a number") from None
        raise self._fail(column, f"expected a number, got {type(value).__name__}")

    def dt(self, column: str) -> datetime | None:
        value = self.raw(column)
        if value is None:
            return None
        try:
            return decode_dt(value)  # type: ignore[arg-type]
        except ValueError as exc:
            raise self._fail(column, str(exc)) from None

    def dt_required(self, column: str) -> datetime:
        value = self.dt(column)
        if value is None:
            raise self._fail(column, "is missing")
        return value

    def status(self, column: str) -> TaskStatus:
        value = self.text_required(column)
        try:
            return TaskStatus(value)
        except ValueError:
            raise self._fail(column, f"unknown status {value!r}") from None

    def tags(self, column: str) -> frozenset[str]:
        value = self.raw(column)
        if value is None:
            return frozenset()
        if not isinstance(value, bytes | str):
            raise self._fail(column, f"expected text, got {type(value).__name__}")
        try:
            return decode_tags(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._fail(column, str(exc)) from None

    def payload(self, column: str) -> Any:
        value = self.raw(column)
        if value is None:
            return None
        try:
            return decode_payload(value)  # type: ignore[arg-type]
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise self._fail(column, f"is not valid msgpack: {exc}") from None
