"""How ``RedisTaskStore`` lays rows out in Redis: history entries (msgpack, both statuses in
one byte), hash field changes, write tokens, a task's script arguments, and the task and command
hashes decoded into records (``lua/query.lua`` picks the index a query walks)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any, TypeVar

import msgpack

from chongming_redis.errors import CorruptRecord
from chongming_redis.limits import check_refs
from chongming_redis.model import Command, TaskSnapshot, TaskStatus, Transition
from chongming_redis.parents import check_parents
from chongming_redis.policy import RetryPolicy
from chongming_redis.stores._redis.keys import (
    COMMAND_COLUMNS_BY_FIELD,
    COMMAND_FIELDS,
    TASK_COLUMNS_BY_FIELD,
    TASK_FIELDS,
    Keys,
)
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._scalars import CANONICAL_INT
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    PARENT_COLUMNS,
    Primitive,
    Row,
    RowError,
    decode_dt,
    decode_payload,
    int_value,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
    transition_to_row,
)

R = TypeVar("R")

_ENTRY_COLUMNS = ("version", "from_status", "to_status", "at", "reason")

#: History entries are msgpack arrays, small enough (at most 64 bytes, as a rule) to keep a
#: task's history sorted set in Redis's compact listpack encoding (~1 KB less per task).
#:
#: Layout 2 (written now): ``[version, statuses, at_us]``, or ``[version, statuses, at_us,
#: reason]`` when there is a reason, with ``statuses = 8 * from + to`` in ``_STATUS_NUMBERS``
#: (``from`` 0: none), one byte for both. Layout 1 (written before; still read):
#: ``[version, from, to, at_us, reason]`` with one-letter statuses (``_STATUS_CODES``), nil for
#: no from status or reason. The array length tells them apart (3 or 4 against 5). Both are
#: built in Lua too (``lua/lib/msgpack_entry.lua``). An entry that names ``waiting`` (which has
#: no number in three bits) is written in layout 1.
_STATUS_NUMBERS = {
    "pending": 1, "running": 2, "paused": 3, "succeeded": 4, "failed": 5, "stopped": 6,
    "lost": 7,
}  # fmt: skip
_STATUS_BY_NUMBER = {number: name for name, number in _STATUS_NUMBERS.items()}
_STATUS_CODES = {
    "waiting": "W", "pending": "P", "running": "R", "paused": "Z", "succeeded": "S", "failed": "F",
    "stopped": "X", "lost": "L",
}  # fmt: skip
_STATUS_NAMES = {code: name for name, code in _STATUS_CODES.items()}


def encode_entry(transition: Transition) -> bytes:
    """A history entry as stored: layout 2, msgpack ``[version, 8 * from + to, at_us]`` plus
    the reason if there is one."""
    row = transition_to_row(transition)
    if "waiting" in (row["from_status"], row["to_status"]):
        return _layout_one(row)
    source = 0 if row["from_status"] is None else _STATUS_NUMBERS[str(row["from_status"])]
    values = [row["version"], 8 * source + _STATUS_NUMBERS[str(row["to_status"])], row["at"]]
    if row["reason"] is not None:
        values.append(row["reason"])
    return bytes(msgpack.packb(values, use_bin_type=True))


def _layout_one(row: Row) -> bytes:
    source = row["from_status"]
    values = [row["version"], None if source is None else _STATUS_CODES[str(source)],
              _STATUS_CODES[str(row["to_status"])], row["at"], row["reason"]]  # fmt: skip
    return bytes(msgpack.packb(values, use_bin_type=True))


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
#: ``g`` as ``'[]'`` (lib/task_view, lib/task_args), the codec a missing tags column as none;
#: priority 0 (most tasks) likewise: a missing ``pr`` is 0 in Lua and in the codec.
_DEFAULTS_LEFT_OUT: dict[str, object] = {"tags": "[]", "priority": 0}


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
    """A stored history entry (either layout, see ``_STATUS_NUMBERS``) of the task at ``key``."""
    try:
        values = msgpack.unpackb(member, raw=False)
        if not isinstance(values, list) or len(values) not in (3, 4, len(_ENTRY_COLUMNS)):
            raise RowError(None, "history entry is not a list of the expected length")
        if len(values) == len(_ENTRY_COLUMNS):  # layout 1
            for i in (1, 2):
                values[i] = _STATUS_NAMES.get(values[i], values[i])
            row = dict(zip(_ENTRY_COLUMNS, values))
        else:
            statuses = values[1]
            if type(statuses) is not int or not 0 <= statuses < 64 or statuses % 8 == 0:
                raise RowError("to_status", f"unknown statuses code {statuses!r}")
            row = {"version": values[0], "from_status": _STATUS_BY_NUMBER.get(statuses // 8),
                   "to_status": _STATUS_BY_NUMBER[statuses % 8], "at": values[2],
                   "reason": values[3] if len(values) == 4 else None}  # fmt: skip
        return row_to_transition({"task_id": task_id, **row})
    except RowError as exc:
        raise CorruptRecord(key, exc.column, exc.detail) from None
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptRecord(key, None, f"history entry does not decode: {exc}") from None


# -- the common task hash, decoded fast ----------------------------------------------------------

_STATUSES = {status.value.encode(): status for status in TaskStatus}
#: The field names the fast decoder knows (and the store's own w and fs): any other, even one
#: that is not UTF-8 (which the strict decoder refuses), goes the strict way.
_KNOWN_FIELDS = frozenset(
    f.encode() for f in ("n", "s", "v", "c", "u", "g", "b", "k", "p", "a", "r", "hb", "lo",
                         "lu", "at", "nb", "pr", "w", "ct", "fs", "rt", "to", "dl", "rn", "uq",
                         "lm", "dp", "df")
)  # fmt: skip


def _uint(value: bytes) -> int:
    """A canonical non-negative decimal, or ``ValueError`` (the strict decoder then names it)."""
    if not value.isdigit() or (value[0] == 48 and len(value) > 1):  # no sign, space, 0-prefix
        raise ValueError("not canonical")
    return int(value)


def _when(value: bytes | None) -> datetime | None:
    return None if value is None else decode_dt(value)


def _seconds(value: bytes | None) -> float | None:
    """A timeout/retention as the strict reader takes it (``Reader.number``): a canonical
    integer or a float's text; anything else raises (the strict decoder then names it)."""
    if value is None:
        return None
    number = value.decode("ascii")
    return float(int(number) if CANONICAL_INT.fullmatch(number) else float(number))


@lru_cache(maxsize=256)
def _retry_policy(value: bytes) -> RetryPolicy:
    """A stored retry policy. Cached: the tasks of one type share theirs (frozen, so one
    object may serve them all), and parsing the JSON would cost more than the rest."""
    return RetryPolicy.from_json(value.decode())


@lru_cache(maxsize=1024)
def _limit_refs(value: bytes) -> tuple[str, ...]:
    """A task's stored limit refs (a JSON list). Cached: the tasks of one key share them."""
    return check_refs(json.loads(value))


def _parents(value: bytes) -> tuple[str, ...]:
    return check_parents(json.loads(value))


def fast_snapshot(task_id: str, f: dict[bytes, bytes]) -> TaskSnapshot | None:
    """The snapshot of a task hash in the common shape (no tags, progress or failure), decoded
    without the strict row reader's per-column bookkeeping; ``None`` for anything else or
    anything odd, which the caller then decodes strictly (and reports precisely, if corrupt).
    It accepts exactly what the strict decoder accepts for these fields: canonical integers,
    UTF-8 text, known statuses, msgpack payloads; the model re-checks the rest."""
    try:
        tags = f.get(b"g")
        if (tags is not None and tags != b"[]") or not _KNOWN_FIELDS.issuperset(f):
            return None
        params, result, key = f.get(b"a"), f.get(b"r"), f.get(b"k")
        pipeline, owner = f.get(b"p"), f.get(b"lo")
        return TaskSnapshot(
            task_id=task_id,
            name=f[b"n"].decode(),
            status=_STATUSES[f[b"s"]],
            status_version=_uint(f[b"v"]),
            created_at=decode_dt(f[b"c"]),
            updated_at=decode_dt(f[b"u"]),
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
            priority=0 if (priority := f.get(b"pr")) is None else int_value(priority),
            retry=None if (retry := f.get(b"rt")) is None else _retry_policy(retry),
            timeout=_seconds(f.get(b"to")),
            deadline=_when(f.get(b"dl")),
            retention=_seconds(f.get(b"rn")),
            unique=None if (unique := f.get(b"uq")) is None else unique.decode(),
            limits=() if (refs := f.get(b"lm")) is None else _limit_refs(refs),
            parents=() if (parents := f.get(b"dp")) is None else _parents(parents),
            on_parent_failure="stop" if (policy := f.get(b"df")) is None else policy.decode(),
        )
    except Exception:  # KeyError, UnicodeDecodeError, ValueError, msgpack's own types, ...
        return None


# -- a task's script arguments; task and command hashes decoded ---------------------------------


def task_args(
    row: Row, expect: int | str, *, with_lease: bool = False, counted: bool = False
) -> list[Any]:
    """A task's arguments to create/save/commit_tasks: create writes the whole task, lease
    included; save never writes the lease. ``counted``: the pairs are preceded by their number
    (commit_tasks' layout). A create (``expect == ""``) sends no deletions: a new hash has
    nothing to delete."""
    # A save writes neither the lease nor the parents (fixed at creation).
    skip = ("task_id",) if with_lease else ("task_id", *LEASE_COLUMNS, *PARENT_COLUMNS)
    columns = {c: v for c, v in row.items() if c not in skip}
    writes, deletes = task_hash_changes(columns, TASK_FIELDS)
    if expect == "":
        deletes = []
    count = [len(writes) // 2] if counted else []
    return [row["task_id"], write_token(), expect, len(deletes), *deletes, *count, *writes]


def decode_task(keys: Keys, task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot:
    snapshot = fast_snapshot(task_id, fields)
    if snapshot is not None:
        return snapshot
    return _decode_hash(keys.task(task_id), fields, {"task_id": task_id}, TASK_FIELDS,
                        TASK_COLUMNS_BY_FIELD, row_to_snapshot)  # fmt: skip


def decode_command(keys: Keys, command_id: str, fields: dict[bytes, bytes]) -> Command:
    return _decode_hash(keys.command(command_id), fields, {}, COMMAND_FIELDS,
                        COMMAND_COLUMNS_BY_FIELD, row_to_command)  # fmt: skip


def _decode_hash(
    key: str,
    fields: dict[bytes, bytes],
    row: dict[str, Primitive],
    field_names: dict[str, str],
    columns_by_field: dict[str, str],
    decode: Callable[[dict[str, Primitive]], R],
) -> R:
    """The record of the hash at ``key``: ``row`` with the hash's fields added as columns
    (a field it does not know is left out), decoded; a column that does not decode is a
    ``CorruptRecord`` naming its field."""
    for field, value in fields.items():
        column = columns_by_field.get(text(field, key))
        if column is not None:
            row[column] = value
    try:
        return decode(row)
    except RowError as exc:
        raise CorruptRecord(key, field_of(exc.column, field_names), exc.detail) from None
