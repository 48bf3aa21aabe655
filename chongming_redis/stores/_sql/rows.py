"""Codec rows <-> SQL rows, for every SQL store (``_sql.schema`` describes the tables).

The codec (``stores/codec.py``) does the real work; this module only fixes the column order of
each table, stores progress numbers as text (so ``1.0`` comes back a ``float`` in any dialect),
and turns a row that does not decode into ``CorruptRecord`` naming its key (``tasks/<id>``,
``history/<id>/<version>``, ``commands/<id>``) and column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import Command, TaskSnapshot, Transition
from chongming_redis.stores._sql.schema import FINAL_STATUSES
from chongming_redis.stores.codec import (
    COMMAND_COLUMNS,
    LEASE_COLUMNS,
    PARENT_COLUMNS,
    SNAPSHOT_COLUMNS,
    TRANSITION_COLUMNS,
    Primitive,
    Row,
    RowError,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
)

T = TypeVar("T")

#: Columns whose numbers are stored as text (``repr`` of a float, ``str`` of an int).
NUMBER_COLUMNS = frozenset({"progress_current", "progress_total"})
#: What ``save`` writes: every column but the lease (``touch`` owns it; store guide §2.3) and
#: the parents (fixed at creation: ``DependenciesStore``).
SAVE_COLUMNS: tuple[str, ...] = tuple(
    c for c in SNAPSHOT_COLUMNS if c not in LEASE_COLUMNS and c not in PARENT_COLUMNS
)


def quoted(columns: Sequence[str]) -> str:
    """A column list for SQL, each name quoted (``key`` and ``at`` are keywords somewhere)."""
    return ", ".join(f'"{c}"' for c in columns)


TASK_SELECT = quoted(SNAPSHOT_COLUMNS)
HISTORY_SELECT = quoted(TRANSITION_COLUMNS)
COMMAND_SELECT = quoted(COMMAND_COLUMNS)


def number_text(value: Primitive) -> Primitive:
    """A progress number as text: ``str`` of an int, ``repr`` of a float (never ``1`` for
    ``1.0``); the codec reads a canonical integer back as ``int`` and anything else as ``float``."""
    if type(value) is float:
        return repr(value)
    if type(value) is int:
        return str(value)
    return value


def values_of(row: Row, columns: Sequence[str]) -> list[Primitive]:
    """The parameters of ``columns`` of a codec row, in order."""
    return [number_text(row[c]) if c in NUMBER_COLUMNS else row[c] for c in columns]


def text(value: Any) -> str:
    """A text column as ``str`` whatever the driver returned (``bytes`` from a ``bytea``)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _blobs(value: Any) -> Any:
    # psycopg may hand back a memoryview for binary columns; the codec wants bytes.
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


def _decode(
    key: str, columns: Sequence[str], values: Sequence[Any], build: Callable[[Row], T]
) -> T:
    row: Row = {c: _blobs(v) for c, v in zip(columns, values)}
    try:
        return build(row)
    except RowError as exc:
        raise CorruptRecord(key, exc.column, exc.detail) from None


def decode_task(values: Sequence[Any], key: str | None = None) -> TaskSnapshot:
    """A ``tasks`` row selected as ``TASK_SELECT``."""
    where = key or "tasks/" + text(values[0])
    return _decode(where, SNAPSHOT_COLUMNS, values, row_to_snapshot)


def decode_transition(values: Sequence[Any]) -> Transition:
    """A ``history`` row selected as ``HISTORY_SELECT``."""
    where = f"history/{text(values[0])}/{text(values[1])}"
    return _decode(where, TRANSITION_COLUMNS, values, row_to_transition)


def decode_command(values: Sequence[Any]) -> Command:
    """A ``commands`` row selected as ``COMMAND_SELECT``."""
    return _decode("commands/" + text(values[0]), COMMAND_COLUMNS, values, row_to_command)


def task_row(values: Sequence[Any]) -> Row:
    """A ``tasks`` row (``TASK_SELECT``) as a codec row, for a write that changes some columns
    and decodes the result."""
    return {c: _blobs(v) for c, v in zip(SNAPSHOT_COLUMNS, values)}


def claimed_unique(row: Row) -> str | None:
    """The unique id a task row holds once written: its ``unique_id`` while its status is
    unfinished, else ``None`` (a final task holds none: ``tasks_unique`` leaves it out)."""
    unique = row.get("unique_id")
    if unique is None or text(row["status"]) in FINAL_STATUSES:
        return None
    return text(unique)


def expires_at(row: Row) -> int | None:
    """The ``expires_at`` of a task row (µs): ``updated_at + retention`` once its status is
    final, else ``None``. Every statement that writes a row writes this with it, computed here
    exactly as the in-memory reference computes an expiry (``round`` of the µs)."""
    retention = row.get("retention_s")
    if retention is None or text(row["status"]) not in FINAL_STATUSES:
        return None
    return int(row["updated_at"]) + _micros(retention)  # type: ignore[arg-type]


def deadline_of(row: Row, started_at: int) -> Primitive:
    """The ``deadline`` a start writes: ``started_at + timeout`` when the task has a timeout,
    else the one it had (kept, as every other field a start does not own)."""
    timeout = row.get("timeout_s")
    return row.get("deadline") if timeout is None else started_at + _micros(timeout)


def _micros(seconds: Primitive) -> int:
    return round(float(seconds) * 1_000_000)  # type: ignore[arg-type]


def integer(value: Any, key: str, column: str) -> int:
    """An integer column that must hold an exact ``int`` (a version, a count, a time)."""
    if type(value) is int:
        return value
    raise CorruptRecord(key, column, f"expected an integer, got {value!r:.40}")
