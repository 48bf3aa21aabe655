"""How ``RedisTaskStore`` lays rows out in Redis: history entries (msgpack, one-letter
statuses), hash field changes, the index a query walks, write tokens."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

import msgpack

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.codec import (
    Row,
    RowError,
    decode_payload,
    row_to_transition,
    transition_to_row,
)
from chongming_redis.validation import EPOCH, MAX_EPOCH_US

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


#: Task columns not written when they hold the value a reader assumes for a missing field, so
#: the common case costs no hash field: no tags (``[]``) is most tasks. Lua reads a missing
#: ``g`` as ``'[]'`` (lib/task_view, lib/task_args), the codec a missing tags column as none.
_DEFAULTS_LEFT_OUT = {"tags": "[]"}


def task_hash_changes(columns: Row, fields: dict[str, str]) -> tuple[list[Any], list[str]]:
    """``hash_changes`` of a task hash: a column at its ``_DEFAULTS_LEFT_OUT`` value is deleted
    (a save from tags to none removes the field), never written."""
    left_out = {c: None for c, default in _DEFAULTS_LEFT_OUT.items() if columns.get(c) == default}
    return hash_changes({**columns, **left_out}, fields)


def field_of(column: str | None, fields: dict[str, str]) -> str | None:
    return None if column is None else fields.get(column, column)


def token() -> str:
    """The name of a retry memo (``{ns}:sr:<token>``, ``{ns}:cr:<token>``): unique among every
    call of the namespace whose memo lives, so 72 random bits."""
    return secrets.token_urlsafe(9)


def write_token() -> str:
    """The token of one create/save/submit, kept in the record's ``w`` field: it only has to
    differ between the writes of one record (a retry repeats it), so 48 random bits in 8
    characters, 4 bytes less per record than ``token()``."""
    return secrets.token_urlsafe(6)


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


# -- the common task hash, decoded fast ----------------------------------------------------------

_STATUSES = {status.value.encode(): status for status in TaskStatus}
#: Fields whose presence sends a hash to the strict decoder (progress, failure): rare in the
#: rows the runtime reads back hot (started tasks).
_RARE_FIELDS = (b"pc", b"pt", b"pm", b"ft", b"fm", b"fb")


def _uint(value: bytes) -> int:
    """A canonical non-negative decimal, or ``ValueError`` (the strict decoder then names it)."""
    if not value.isdigit() or (value[0] == 48 and len(value) > 1):  # no sign, space, 0-prefix
        raise ValueError("not canonical")
    return int(value)


def _when(value: bytes | None) -> datetime | None:
    if value is None:
        return None
    micros = _uint(value)
    if micros > MAX_EPOCH_US:
        raise ValueError("out of range")
    return EPOCH + timedelta(microseconds=micros)


def _required_when(value: bytes) -> datetime:
    when = _when(value)
    assert when is not None
    return when


def fast_snapshot(task_id: str, f: dict[bytes, bytes]) -> TaskSnapshot | None:
    """The snapshot of a task hash in the common shape (no tags, progress or failure), decoded
    without the strict row reader's per-column bookkeeping; ``None`` for anything else or
    anything odd, which the caller then decodes strictly (and reports precisely, if corrupt).
    It accepts exactly what the strict decoder accepts for these fields: canonical integers,
    UTF-8 text, known statuses, msgpack payloads; the model re-checks the rest."""
    try:
        tags = f.get(b"g")
        if (tags is not None and tags != b"[]") or any(k in f for k in _RARE_FIELDS):
            return None
        params, result, key = f.get(b"a"), f.get(b"r"), f.get(b"k")
        pipeline, owner = f.get(b"p"), f.get(b"lo")
        return TaskSnapshot(
            task_id=task_id,
            name=f[b"n"].decode(),
            status=_STATUSES[f[b"s"]],
            status_version=_uint(f[b"v"]),
            created_at=_required_when(f[b"c"]),
            updated_at=_required_when(f[b"u"]),
            bucket=_uint(f[b"b"]),
            key=None if key is None else key.decode(),
            pipeline_run_id=None if pipeline is None else pipeline.decode(),
            params=None if params is None else decode_payload(params),
            result=None if result is None else decode_payload(result),
            heartbeat_at=_when(f.get(b"hb")),
            lease_owner=None if owner is None else owner.decode(),
            lease_until=_when(f.get(b"lu")),
            attempt=_uint(f[b"at"]),
            not_before=_when(f.get(b"nb")),
        )
    except Exception:  # KeyError, UnicodeDecodeError, ValueError, msgpack's own types, ...
        return None
