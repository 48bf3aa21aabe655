"""The Redis reads beyond the ``TaskStore`` protocol, without I/O: what a dashboard reads (the
counters per bucket, the pool, the workers' last beats, the commands of a task, the command
backlog) and the change feed. Plans of ``_redis.ops``'s kind (see its docstring), driven by
``RedisTaskStore``; each one script call or one round trip.
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
from chongming_redis.stores.codec import decode_dt

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
