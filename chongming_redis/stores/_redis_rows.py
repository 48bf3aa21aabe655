"""How ``RedisTaskStore`` lays rows out in Redis: history entries (msgpack, one-letter
statuses), hash field changes, the index a query walks, write tokens."""

from __future__ import annotations

import secrets
from typing import Any

import msgpack

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import TaskQuery, Transition
from chongming_redis.stores.codec import Row, RowError, row_to_transition, transition_to_row

_ENTRY_COLUMNS = ("version", "from_status", "to_status", "at", "reason")


#: Statuses inside history entries are one letter: an entry of at most 64 bytes keeps a
#: task's history sorted set in Redis's compact listpack encoding (~1 KB less per task).
_STATUS_CODES = {
    "pending": "P", "running": "R", "paused": "Z", "succeeded": "S", "failed": "F",
    "stopped": "X", "lost": "L",
}  # fmt: skip
_STATUS_NAMES = {code: name for name, code in _STATUS_CODES.items()}


def encode_entry(transition: Transition) -> bytes:
    """A history entry as stored: msgpack ``[version, from, to, at_us, reason]``, statuses
    as ``_STATUS_CODES``."""
    row = transition_to_row(transition)
    values = [row[c] for c in _ENTRY_COLUMNS]
    values[1] = None if values[1] is None else _STATUS_CODES[str(values[1])]
    values[2] = _STATUS_CODES[str(values[2])]
    return bytes(msgpack.packb(values, use_bin_type=True))


def choose_source(q: TaskQuery) -> tuple[str, str]:
    """The index to walk: the most selective one the query names."""
    if q.pipeline_run_id is not None:
        return "p", q.pipeline_run_id
    if q.tag is not None:
        return "tag", q.tag
    return "ix", ""


def hash_changes(columns: Row, fields: dict[str, str]) -> tuple[list[Any], list[str]]:
    """Field/value pairs to write and field names to delete (columns that are ``None``)."""
    writes: list[Any] = []
    deletes: list[str] = []
    for column, value in columns.items():
        field = fields[column]
        if value is None:
            deletes.append(field)
        else:
            writes += [field, repr(value) if type(value) is float else value]
    return writes, deletes


def field_of(column: str | None, fields: dict[str, str]) -> str | None:
    return None if column is None else fields.get(column, column)


def token() -> str:
    return secrets.token_urlsafe(9)


def pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2]))


def decode_entry(task_id: str, key: str, member: bytes) -> Transition:
    """A stored history entry (``encode_entry``'s layout) of the task at ``key``."""
    try:
        values = msgpack.unpackb(member, raw=False)
        if not isinstance(values, list) or len(values) != len(_ENTRY_COLUMNS):
            raise RowError(None, "history entry is not a list of the expected length")
        for i in (1, 2):
            values[i] = _STATUS_NAMES.get(values[i], values[i])
        return row_to_transition({"task_id": task_id, **dict(zip(_ENTRY_COLUMNS, values))})
    except RowError as exc:
        raise CorruptRecord(key, exc.column, exc.detail) from None
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptRecord(key, None, f"history entry does not decode: {exc}") from None
