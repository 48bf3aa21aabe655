"""The Redis reads beyond the ``TaskStore`` protocol, without I/O: what a dashboard reads (the
counters per bucket, the pool, the workers' last beats, the commands of a task, the command
backlog, the holder of a unique id, the retention backlog) and the change feed. Plans of
``_redis.ops``'s kind (see its docstring), driven by ``RedisTaskStore``; each one script call
or one round trip.
"""

from __future__ import annotations

from datetime import datetime

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import (
    ChangePage,
    Command,
    CommandBacklog,
    FeedStats,
    TaskSnapshot,
    TaskStatus,
    Tombstone,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._feed import check_page_limit, decode_tombstone, page_of, parse_cursor
from chongming_redis.stores._redis import ops
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.ops import Plan, Read, Transaction, script
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.rows import decode_command, decode_task, pairs
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.validation import check_dt, check_identifier

# -- the counters and the pool -----------------------------------------------------------------


def bucket_counts(keys: Keys) -> Plan[dict[int, dict[TaskStatus, int]]]:
    key = keys.counts
    raw: dict[bytes, bytes] = yield Read(key, "hgetall", (key,))
    result: dict[int, dict[TaskStatus, int]] = {}
    for field, value in raw.items():
        status, _, bucket = text(field).partition(":")
        if bucket:
            per = result.setdefault(int(bucket), dict.fromkeys(TaskStatus, 0))
            per[TaskStatus(status)] = int(value)
    return result


def pool_state(keys: Keys) -> Plan[tuple[dict[str, datetime], dict[int, str]]]:
    # ZRANGE's redis-py arguments by position: desc=False, withscores=True.
    workers: list[tuple[bytes, float]] = yield Read(
        keys.workers, "zrange", (keys.workers, 0, -1, False, True)
    )
    owners: dict[bytes, bytes] = yield Read(keys.bucket_owner, "hgetall", (keys.bucket_owner,))
    return (
        {text(w): decode_dt(int(score) * 1000) for w, score in workers},
        {int(b): text(w) for b, w in owners.items()},
    )


def worker_beats(keys: Keys) -> Plan[dict[str, datetime]]:
    key = keys.worker_beats
    raw: dict[bytes, bytes] = yield Read(key, "hgetall", (key,))
    beats: dict[str, datetime] = {}
    for worker, value in raw.items():
        try:
            beats[text(worker, key)] = decode_dt(int(value) * 1000)
        except ValueError:
            raise CorruptRecord(key, text(worker), f"{value!r} is not a time") from None
    return beats


# -- the commands ------------------------------------------------------------------------------


def task_commands(keys: Keys, task_id: str, limit: int) -> Plan[list[Command]]:
    newest = check.check_task_commands(task_id, limit)
    reply = yield script("task_commands", [keys.task_commands(task_id), keys.root], [newest])
    return [
        decode_command(keys, text(reply[i]), pairs(reply[i + 1])) for i in range(1, len(reply), 2)
    ]


def command_backlog(keys: Keys) -> Plan[CommandBacklog]:
    queue, leases = keys.command_queue, keys.command_leases
    # ZRANGE's redis-py arguments by position: desc=False, withscores=True.
    reads = (Read(queue, "zcard", (queue,)), Read(leases, "zcard", (leases,)),
             Read(queue, "zrange", (queue, 0, 0, False, True)))  # fmt: skip
    results = yield Transaction(queue, reads)
    for read, result in zip(reads, results):
        if isinstance(result, Exception):  # WRONGTYPE: a corrupt record naming its key
            with ops.errors(read.key):
                raise result
    unclaimed, leased, oldest = results
    try:
        first = decode_dt(int(oldest[0][1])) if oldest else None
    except ValueError as exc:
        raise CorruptRecord(queue, None, f"score: {exc}") from None
    return CommandBacklog(int(unclaimed), int(leased), first)


# -- the task policies ------------------------------------------------------------------------

_UNFINISHED = frozenset(s.value.encode() for s in TaskStatus if not s.is_terminal)
#: Reads of a unique id's record while the task it names keeps letting it go to another.
_HOLDER_READS = 3


def unique_holder(keys: Keys, unique: str) -> Plan[str | None]:
    """``GET {ns}:uq:<unique>``, then the task it names (``HMGET s uq``): the scripts keep the
    record naming exactly the unfinished holder, the task's own fields confirm it (a record
    another client left holds nothing, as the scripts judge it). When the named task no longer
    holds it, the record is read again: the id may have passed to another task between the two
    reads."""
    check_identifier(unique, "unique")
    record = keys.unique(unique)
    named = yield Read(record, "get", (record,))
    for _ in range(_HOLDER_READS):
        if named is None:
            return None
        holder = text(named, record)
        key = keys.task(holder)
        status, held = yield Read(key, "hmget", (key, "s", "uq"))
        if status in _UNFINISHED and held == unique.encode():
            return holder
        again = yield Read(record, "get", (record,))
        if again == named:
            return None
        named = again
    return None


def expiry_backlog(keys: Keys, now: datetime) -> Plan[tuple[int, datetime | None]]:
    """``ZCOUNT`` of ``{ns}:expiry`` up to ``now`` and its first entry after, in one
    ``MULTI``/``EXEC``."""
    cutoff = encode_dt(check_dt(now, "now"))
    key = keys.expiry
    # ZRANGEBYSCORE's redis-py arguments by position: start=0, num=1, withscores=True.
    reads = (Read(key, "zcount", (key, "-inf", cutoff)),
             Read(key, "zrangebyscore", (key, f"({cutoff}", "+inf", 0, 1, True)))  # fmt: skip
    results = yield Transaction(key, reads)
    for read, result in zip(reads, results):
        if isinstance(result, Exception):  # WRONGTYPE: a corrupt record naming its key
            with ops.errors(read.key):
                raise result
    due, kept = results
    try:
        return int(due), (decode_dt(int(kept[0][1])) if kept else None)
    except ValueError as exc:
        raise CorruptRecord(key, None, f"score: {exc}") from None


# -- the change feed ---------------------------------------------------------------------------


def changes(keys: Keys, after: str, limit: int) -> Plan[ChangePage]:
    position, size = parse_cursor(after), check_page_limit(limit)
    reply = yield script("changes", [keys.root, keys.feed], [position, size], after=position)
    items: list[TaskSnapshot | Tombstone] = []
    for i in range(2, len(reply), 3):
        value: bytes = reply[i + 1]
        if value[:1] == b"t":
            items.append(decode_task(keys, text(value[1:]), pairs(reply[i + 2])))
        else:
            chunk = keys.feed_chunk(int(reply[i]) // 128)
            items.append(decode_tombstone(value[1:], chunk))
    last = int(reply[len(reply) - 3]) if items else None
    return page_of(items, last, position)


def feed_stats(keys: Keys) -> Plan[FeedStats]:
    key = keys.feed
    head, tombs = yield Read(key, "hmget", (key, "head", "tombs"))
    tasks = sum((yield from ops.counts(keys)).values())
    tombstones = int(tombs or 0)
    return FeedStats(int(head or 0), tasks + tombstones, tombstones)
