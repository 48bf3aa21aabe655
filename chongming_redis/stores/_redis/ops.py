"""The plans of the Redis store's operations, without I/O: what a plan may ask for (``Script``,
``Read``, ``Transaction``), how redis-py's errors become the store's (``errors``), and the
producer's operations, which ``RedisTaskStore`` (redis-py) and ``AsyncRedisTaskStore``
(``redis.asyncio``) both drive. The worker's operations are ``_redis.worker_ops``, the reads of
dashboards and feed readers ``_redis.dashboard_ops``: plans of the same kind.

Each operation is a *plan*: a generator that checks its arguments, yields the requests it
needs (a ``Script`` call, a plain ``Read``, or reads in one ``Transaction``), is sent each
reply, and returns the decoded answer. A store drives a plan with its own I/O::

    plan = get_task(keys, "t1")     # nothing has run yet
    request = plan.send(None)       # the argument checks run here, before any I/O
    plan.send(reply)                # StopIteration: the snapshot (or CorruptRecord)

What a driver adds is the same in both stores (``_redis.driver``): before every request it
checks that the store is open, and once at the end of a plan that made no request (a ``query``
with ``limit=0``), so an argument error comes before ``StoreClosed``; a ``Script`` reply goes
through ``_redis.replies.check`` (its code becomes the exception of ``_redis.replies.REPLIES``);
redis-py's exceptions become the store's through ``errors``; a ``Read`` calls the redis-py
method it names (the same name on both clients, so the same reply parsing).
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import redis

from chongming_redis.errors import CorruptRecord, StoreError, StoreUnavailable
from chongming_redis.model import Command, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores import _checks as check
from chongming_redis.stores._redis import replies
from chongming_redis.stores._redis.keys import COMMAND_FIELDS, Keys
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.rows import (
    decode_command,
    decode_entry,
    decode_task,
    encode_entry,
    hash_changes,
    pairs,
    task_args,
    write_token,
)
from chongming_redis.stores.codec import command_to_row, decode_dt, encode_dt, snapshot_to_row
from chongming_redis.validation import check_identifier, check_int

T = TypeVar("T")

#: Matches returned per ``query`` script call, and entries examined when filters remain.
QUERY_PAGE = 500
QUERY_BUDGET = 1000
#: Items per ``commit_tasks`` script call.
COMMIT_BATCH = 100

_STATUS_FIELDS = [status.value for status in TaskStatus]


@dataclass(frozen=True)
class Script:
    """One call of the script ``name`` (``EVALSHA``, or ``EVALSHA_RO`` for a read-only one);
    ``about`` names what its exceptions report (the fields of ``_redis.replies.Call``)."""

    name: str
    keys: list[str]
    args: list[Any]
    about: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Read:
    """One plain command: the redis-py method ``method`` called with ``args``; ``key`` is the
    key a ``WRONGTYPE`` error names as corrupt."""

    key: str
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Transaction:
    """Plain commands in one ``MULTI``/``EXEC`` (one round trip, one consistent moment); the
    reply is theirs in order, a refused command's as its exception, in its place. ``key``
    names the transaction's slot."""

    key: str
    reads: tuple[Read, ...]


Request = Script | Read | Transaction
#: An operation: yields requests, is sent their replies, returns ``T``.
Plan = Generator[Request, Any, T]


def script(name: str, keys: Sequence[str], args: Sequence[Any], **about: Any) -> Script:
    return Script(name, list(keys), list(args), about)


@contextmanager
def errors(key: str | None = None) -> Iterator[None]:
    """Turn redis-py's exceptions (sync and asyncio alike) into the store's, naming the
    cause; a ``WRONGTYPE`` on ``key`` is a corrupt record."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis is unreachable: {exc}") from exc
    except (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
            redis.exceptions.AskError, redis.exceptions.SlotNotCoveredError) as exc:  # fmt: skip
        # A cluster that is down, failing over or still migrating the namespace's slot after
        # MIGRATION_WAIT (``_redis.cluster``; ASK/MOVED: a durable write sent to the slot's
        # master itself): the command was refused (or, its barrier refused, its outcome is
        # unknown); a retry is safe.
        raise StoreUnavailable(f"Redis Cluster cannot serve the namespace now: {exc}") from exc
    except redis.exceptions.RedisClusterException as exc:
        raise StoreError(f"Redis Cluster error: {exc}") from exc
    except redis.exceptions.OutOfMemoryError as exc:
        # Write scripts carry a '#!lua' shebang, so Redis refuses them whole, before any
        # write, when it is over maxmemory (no half-applied script).
        raise StoreError(f"Redis refused the write, out of memory: {exc}") from exc
    except redis.exceptions.NoPermissionError as exc:
        raise StoreError(f"Redis refused the command (ACL): {exc}") from exc
    except redis.exceptions.ResponseError as exc:
        message = str(exc)
        if message.startswith("WRONGTYPE") and key is not None:
            raise CorruptRecord(key, None, message) from exc
        raise StoreError(f"Redis error: {message}") from exc
    except redis.exceptions.RedisError as exc:
        raise StoreError(f"Redis error: {exc}") from exc


# -- tasks -------------------------------------------------------------------------------------


def get_task(keys: Keys, task_id: str) -> Plan[TaskSnapshot | None]:
    check_identifier(task_id, "task_id")
    key = keys.task(task_id)
    fields: dict[bytes, bytes] = yield Read(key, "hgetall", (key,))
    return None if not fields else decode_task(keys, task_id, fields)


def query(
    keys: Keys,
    query: TaskQuery | None,
    *,
    page_size: int = QUERY_PAGE,
    page_budget: int = QUERY_BUDGET,
    after: tuple[datetime, str] | None = None,
) -> Plan[list[TaskSnapshot]]:
    """``query`` script calls, one page of at most ``page_size`` matches each (examining at
    most ``page_budget`` index entries when filters remain), until the limit or the end.
    ``after`` (``PagedQueryStore.query_page``) is where the first call starts: the script's
    cursor is "the last entry examined", and it resumes strictly after it in the walking
    direction (ties on ``created_at`` by task id in byte order), so any position works as a
    cursor, a pruned task's too."""
    q, position = check.check_query(query), check.check_after(after)
    if q.limit == 0 or q.statuses == frozenset() or q.buckets == frozenset():
        return []
    # query.lua picks the index to walk itself, from the filters and the counters (one round
    # trip); the cursor means the same whichever it walks, so calls may walk different ones.
    filters = [
        " ".join(sorted(s.value for s in q.statuses or ())),
        " ".join(str(b) for b in sorted(q.buckets or ())),
        q.name or "",
        q.name_prefix or "",
        q.tag or "",
        q.pipeline_run_id or "",
    ]
    results: list[TaskSnapshot] = []
    cursor = ("", "") if position is None else (str(encode_dt(position[0])), position[1])
    remaining = math.inf if q.limit is None else q.limit
    while remaining > 0:
        want = int(min(remaining, page_size))
        # The script examines only `want` entries when its sources imply every filter.
        args = ["desc" if q.newest_first else "asc", want, max(want, page_budget), *cursor,
                *filters]  # fmt: skip
        reply = yield script("query", [keys.root, keys.counts], args)
        exhausted, cursor = reply[1] == 1, (text(reply[2]), text(reply[3]))
        page = [
            decode_task(keys, text(reply[i]), pairs(reply[i + 1])) for i in range(5, len(reply), 2)
        ]
        results.extend(page)
        remaining -= len(page)
        if exhausted:
            break
    return results


def counts(keys: Keys) -> Plan[dict[TaskStatus, int]]:
    key = keys.counts
    # The seven status fields only: the hash also holds a counter per (status, bucket).
    raw = yield Read(key, "hmget", (key, _STATUS_FIELDS))
    result = dict.fromkeys(TaskStatus, 0)
    for status, value in zip(TaskStatus, raw):
        if value is None:
            continue
        try:
            result[status] = int(value)
        except ValueError:
            detail = f"counter {value!r} does not decode"
            raise CorruptRecord(key, status.value, detail) from None
    return result


def history(keys: Keys, task_id: str, since_version: int = 0) -> Plan[list[Transition]]:
    check_identifier(task_id, "task_id")
    check_int(since_version, "since_version")
    key = keys.history(task_id)
    members: list[bytes] = yield Read(key, "zrangebyscore", (key, f"({since_version}", "+inf"))
    return [decode_entry(task_id, key, m) for m in members]


#: One ``commit_tasks`` item: the snapshot, its expected version (``None``: create), its entries.
CommitItem = tuple[TaskSnapshot, int | None, Sequence[Transition]]


def commit_tasks(keys: Keys, items: Sequence[CommitItem]) -> Plan[list[StoreError | None]]:
    """``commit_tasks`` script calls of ``COMMIT_BATCH`` items each; every item is checked
    before the first. Per item ``None`` or the conflict it met (``BatchingStore``), or the
    ``UniqueTaken`` it met (``TaskPoliciesStore``)."""
    checked = check.check_commit_items(items)
    results: list[StoreError | None] = []
    for start in range(0, len(checked), COMMIT_BATCH):
        batch = checked[start : start + COMMIT_BATCH]
        reply = yield script("commit_tasks", [keys.root, keys.counts], commit_args(batch))
        results += commit_results(batch, reply)
    return results


def commit_args(batch: Sequence[CommitItem]) -> list[Any]:
    """``commit_tasks``' arguments for ``batch`` (checked items, at most ``COMMIT_BATCH``)."""
    args: list[Any] = [len(batch)]
    for snapshot, expect, transitions in batch:
        row = snapshot_to_row(snapshot)
        if expect is None:
            args += task_args(row, "", with_lease=True, counted=True)
        else:
            args += task_args(row, expect, counted=True)
        args.append(len(transitions))
        for transition in transitions:
            args += [transition.version, encode_entry(transition)]
    return args


def commit_results(batch: Sequence[CommitItem], reply: Sequence[Any]) -> list[StoreError | None]:
    """Per item of ``batch``, ``None`` or the error its code in ``commit_tasks``' reply says."""
    results: list[StoreError | None] = []
    for i, (snapshot, expect, _) in enumerate(batch):
        item = replies.Call("commit_tasks", task_id=snapshot.task_id, expected=expect or 0,
                            unique=snapshot.unique or "",
                            status=snapshot.status.value)  # fmt: skip
        results.append(replies.item_error(item, reply[1 + 2 * i], reply[2 + 2 * i]))
    return results


# -- commands and namespace facts --------------------------------------------------------------


def submit_command(keys: Keys, command: Command) -> Plan[None]:
    row = command_to_row(check.check_command(command))
    writes, _ = hash_changes(row, COMMAND_FIELDS)
    args = [
        command.command_id,
        write_token(),
        row["created_at"],
        "" if row["lease_until"] is None else row["lease_until"],
        "0" if row["finished_at"] is None else "1",
        *writes,
    ]
    script_keys = [keys.command(command.command_id), keys.command_queue, keys.command_leases,
                   keys.task_commands(command.task_id)]  # fmt: skip
    yield script("submit_command", script_keys, args, command_id=command.command_id)


def get_command(keys: Keys, command_id: str) -> Plan[Command | None]:
    check_identifier(command_id, "command_id")
    key = keys.command(command_id)
    fields: dict[bytes, bytes] = yield Read(key, "hgetall", (key,))
    return None if not fields else decode_command(keys, command_id, fields)


def recorded_num_buckets(keys: Keys) -> Plan[int | None]:
    key = keys.meta
    raw = yield Read(key, "hget", (key, "num_buckets"))
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise CorruptRecord(key, "num_buckets", f"{raw!r} is not a count") from None


def limit_definitions(
    keys: Keys,
) -> Plan[tuple[dict[str, str], dict[str, tuple[str, ...]]]]:
    """``LimitsStore.limit_definitions``: ``(limit id -> definition JSON, task type -> its
    limit ids)`` as the workers recorded them (two reads; the sync and the async store's)."""
    defs = yield Read(keys.limits, "hgetall", (keys.limits,))
    types = yield Read(keys.limit_types, "hgetall", (keys.limit_types,))
    try:
        by_type = {text(k): tuple(json.loads(text(v))) for k, v in types.items()}
    except ValueError as exc:
        raise CorruptRecord(keys.limit_types, None, f"a type's ids are not JSON: {exc}") from None
    return {text(k): text(v) for k, v in defs.items()}, by_type


def task_types(keys: Keys) -> Plan[frozenset[str]]:
    members = yield Read(keys.types, "smembers", (keys.types,))
    try:
        return frozenset(m.decode("utf-8") for m in members)
    except UnicodeDecodeError as exc:
        raise CorruptRecord(keys.types, None, f"a member is not UTF-8: {exc}") from None


def server_time(keys: Keys) -> Plan[datetime]:
    seconds, micros = yield Read(keys.root, "time", ())
    return decode_dt(int(seconds) * 1_000_000 + int(micros))
