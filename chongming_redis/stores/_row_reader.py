"""Strict decoding of one row (``stores/codec.py``'s decoders build their records with it): a
``Reader`` gives typed access to the columns, and every failure is a ``RowError`` naming the
column (stores turn it into ``CorruptRecord`` naming the key)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from chongming_redis.model import TaskStatus
from chongming_redis.stores._scalars import (
    CANONICAL_INT,
    decode_dt,
    decode_payload,
    decode_tags,
    int_value,
)

Primitive = str | int | float | bytes | None
T = TypeVar("T")


class RowError(ValueError):
    """A row does not decode; ``column`` names the culprit (``None``: the row as a whole)."""

    def __init__(self, column: str | None, detail: str) -> None:
        self.column = column
        self.detail = detail
        super().__init__(detail if column is None else f"column {column!r}: {detail}")


def decode(row: Mapping[str, Primitive], build: Callable[[Reader], T]) -> T:
    if not isinstance(row, Mapping):
        raise RowError(None, f"a row must be a mapping, not {type(row).__name__}")
    reader = Reader(row)
    try:
        return build(reader)
    except RowError:
        raise
    except (TypeError, ValueError) as exc:
        # The model refused a decoded value (e.g. a negative version stored by another client).
        # The records are built after every column was read, so the column read last is not the
        # culprit; the model's messages start with the field's name, which names the column.
        raise RowError(column_of(str(exc), row), str(exc)) from None


FIELD_COLUMNS = {
    "Progress.current": "progress_current",
    "Progress.total": "progress_total",
    "Progress.message": "progress_message",
    "Failure.error_type": "failure_type",
    "Failure.message": "failure_message",
    "Failure.traceback": "failure_traceback",
    "tag": "tags",
    "retry": "retry_policy",
    "timeout": "timeout_s",
    "retention": "retention_s",
    "unique": "unique_id",
}


def column_of(message: str, row: Mapping[str, Primitive]) -> str | None:
    field = message.split(" ", 1)[0]
    column = FIELD_COLUMNS.get(field, field)
    return column if column in row else None


class Reader:
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
            return int_value(value)
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
            if CANONICAL_INT.fullmatch(text):
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
