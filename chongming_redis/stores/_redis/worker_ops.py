"""The worker's Redis operations, without I/O: the writes of the ``TaskStore`` protocol
(``create``, ``save``, ``append``, ``touch``, the command leases, ``prune``) and the bucket
pool's (``pool_tick``, ``start_tasks``). Plans of ``_redis.ops``'s kind (see its docstring),
driven by ``RedisTaskStore`` alone: ``AsyncRedisTaskStore`` serves producers, which never write
through these.

Retries: each write carries a token its script recognises, or is idempotent by nature (the
store's module docstring lists which is which).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chongming_redis.errors import CorruptRecord, StoreError
from chongming_redis.model import Command, Progress, TaskSnapshot, Transition
from chongming_redis.stores import _checks as check
from chongming_redis.stores._redis import replies
from chongming_redis.stores._redis.keys import TASK_FIELDS, Keys
from chongming_redis.stores._redis.ops import (
    COMMIT_BATCH,
    CommitItem,
    Plan,
    Read,
    Script,
    commit_args,
    commit_results,
    commit_tasks,
    script,
)
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.rows import (
    decode_command,
    decode_task,
    encode_entry,
    hash_changes,
    pairs,
    task_args,
    token,
)
from chongming_redis.stores.codec import encode_dt, snapshot_to_row, touch_columns
from chongming_redis.validation import check_int

#: Tasks ``prune`` drops per script call (each call stays well under a millisecond per task).
PRUNE_BATCH = 100
#: Tasks ``expire_finished`` removes per script call (as ``PRUNE_BATCH``, the same work a task).
EXPIRE_BATCH = 100

#: What a ``touch`` changes, in ``TaskStore.touch``'s order: progress, heartbeat_at,
#: lease_owner, lease_until (``None``: left as it is).
TouchChanges = tuple[Progress | None, datetime | None, str | None, datetime | None]


@dataclass(frozen=True)
class Audit:
    """What a command lease change writes to the audit stream ``{ns}:audit``: ``flag`` "1"
    when the store audits, else "0" (the script then writes nothing), and the ``owner`` named
    in the entry (``RedisTaskStore.audit_owner``)."""

    flag: str
    owner: str


# -- task snapshots and their history ----------------------------------------------------------


def create(keys: Keys, snapshot: TaskSnapshot) -> Plan[None]:
    row = snapshot_to_row(check.check_snapshot(snapshot))
    args = task_args(row, "", with_lease=True)
    yield script("create", [keys.task(snapshot.task_id), keys.root], args,
                 task_id=snapshot.task_id, unique=snapshot.unique or "")  # fmt: skip


def save(keys: Keys, snapshot: TaskSnapshot, expect_version: int) -> Plan[None]:
    row = snapshot_to_row(check.check_save(snapshot, expect_version))
    args = task_args(row, expect_version)
    yield script("save", [keys.task(snapshot.task_id), keys.root], args,
                 task_id=snapshot.task_id, expected=expect_version,
                 unique=snapshot.unique or "", status=snapshot.status.value)  # fmt: skip


def append(keys: Keys, transition: Transition) -> Plan[None]:
    entry = encode_entry(check.check_transition(transition))
    yield script("append", [keys.history(transition.task_id)], [transition.version, entry])


def touch(keys: Keys, task_id: str, changes: TouchChanges) -> Plan[bool]:
    """``touch``: whether it applied (``TaskStore.touch`` returns nothing). One that changes
    nothing sends nothing (the driver still checks that the store is open)."""
    return (yield from _touch(keys, task_id, "", changes))


def touch_fenced(
    keys: Keys, task_id: str, expect_version: int, changes: TouchChanges
) -> Plan[bool]:
    """``touch`` while the task's ``status_version`` is ``expect_version``: whether it
    applied."""
    check_int(expect_version, "expect_version")
    return (yield from _touch(keys, task_id, expect_version, changes))


def _touch(keys: Keys, task_id: str, fence: int | str, changes: TouchChanges) -> Plan[bool]:
    """``fence``: the ``status_version`` to expect, or "" (``touch.lua``: no fence)."""
    check.check_touch(task_id, *changes)
    columns = touch_columns(*changes)
    if not columns and fence == "":
        return True
    writes, deletes = hash_changes(columns, TASK_FIELDS)
    reply = yield script("touch", [keys.task(task_id)], [fence, len(deletes), *deletes, *writes])
    return replies.applied(replies.Call("touch"), reply)


def prune(keys: Keys, keep_terminal: int, batch: int = PRUNE_BATCH) -> Plan[int]:
    """``prune`` script calls of at most ``batch`` tasks each, until none is left to drop."""
    keep = check.check_keep_terminal(keep_terminal)
    dropped = 0
    while True:
        reply = yield script("prune", [keys.root, keys.counts], [keep, batch])
        done, still_to_drop = int(reply[1]), int(reply[2])
        dropped += done
        if still_to_drop <= 0 or done == 0:
            return dropped


def expire_finished(
    keys: Keys, now: datetime, limit: int, batch: int = EXPIRE_BATCH
) -> Plan[list[str]]:
    """``expire_finished`` script calls of at most ``batch`` tasks each, earliest expiry first,
    until ``limit`` are removed or a call removes fewer than it was allowed (none left expired
    by ``now``). Each call is atomic; together they are the earliest ``limit`` expiries. A call
    redis-py sends again (its reply lost) removes the next expired ones: the ids the lost reply
    named go unreported, the tasks are gone all the same (``prune`` counts the same way)."""
    moment, size = check.check_expire(now, limit)
    removed: list[str] = []
    while len(removed) < size:
        want = min(batch, size - len(removed))
        reply = yield script("expire_finished", [keys.root, keys.expiry], [encode_dt(moment), want])
        removed += [text(task_id) for task_id in reply[1:]]
        if len(reply) - 1 < want:
            break
    return removed


# -- control commands --------------------------------------------------------------------------


def claim_commands(
    keys: Keys, now: datetime, lease_seconds: float, limit: int, audit: Audit
) -> Plan[list[Command]]:
    until = encode_dt(check.check_claim(now, lease_seconds, limit))
    memo_ms = max(1000, math.ceil(lease_seconds * 1000))
    memo = keys.claim_memo(token())
    script_keys = [keys.command_queue, keys.command_leases, memo, keys.root, keys.audit]
    args = [encode_dt(now), until, limit, memo_ms, audit.flag, audit.owner]
    reply = yield script("claim_commands", script_keys, args)
    ids = [text(reply[i]) for i in range(1, len(reply), 2)]
    try:
        return [decode_command(keys, ids[j], pairs(reply[2 + 2 * j])) for j in range(len(ids))]
    except CorruptRecord:
        # The script checks every field it can; a payload is msgpack, which Lua cannot
        # check on every server. Undo the batch so that nothing stays leased, then report.
        for command_id in ids:
            yield _release(keys, command_id, now, audit)
        yield Read(memo, "delete", (memo,))
        raise


def complete_command(
    keys: Keys, command_id: str, now: datetime, outcome: str | None, audit: Audit
) -> Plan[None]:
    check.check_complete(command_id, now, outcome)
    args = [command_id, encode_dt(now), "0" if outcome is None else "1", outcome or "",
            audit.flag, audit.owner]  # fmt: skip
    yield _command_script(keys, "complete_command", command_id, args)


def release_command(keys: Keys, command_id: str, now: datetime, audit: Audit) -> Plan[None]:
    check.check_release(command_id, now)
    yield _release(keys, command_id, now, audit)


def _release(keys: Keys, command_id: str, now: datetime, audit: Audit) -> Script:
    """The ``release_command`` call, its arguments unchecked: ``claim_commands`` undoes a
    batch whose ids came from the server."""
    args = [command_id, audit.flag, encode_dt(now), audit.owner]
    return _command_script(keys, "release_command", command_id, args)


def _command_script(keys: Keys, name: str, command_id: str, args: list[object]) -> Script:
    script_keys = [keys.command(command_id), keys.command_queue, keys.command_leases, keys.audit]
    return script(name, script_keys, args, command_id=command_id)


# -- the bucket pool and batched starts --------------------------------------------------------


def pool_tick(
    keys: Keys,
    namespace: str,
    worker: str,
    now: datetime,
    lease_seconds: float,
    num_buckets: int,
    wanted: Sequence[int],
    leaving: bool,
) -> Plan[tuple[list[int], list[str]]]:
    """``namespace``: the store's, as its refusal of another ``num_buckets`` names it."""
    script_keys = [keys.workers, keys.bucket_owner, keys.bucket_until, keys.meta,
                   keys.worker_beats]  # fmt: skip
    now_ms = encode_dt(now) // 1000
    args = [worker, now_ms, max(1, round(lease_seconds * 1000)), num_buckets,
            "1" if leaving else "0", len(wanted), *wanted]  # fmt: skip
    reply = yield script("pool_tick", script_keys, args, namespace=namespace,
                         num_buckets=num_buckets)  # fmt: skip
    return [int(b) for b in reply[1]], [text(w) for w in reply[2]]


def start_tasks(
    keys: Keys,
    owner: str,
    now: datetime,
    lease_until: datetime,
    buckets: Sequence[int],
    limit: int,
    names: Sequence[str],
) -> Plan[list[TaskSnapshot]]:
    memo, args = start_args(owner, now, lease_until, buckets, limit, names)
    reply = yield script("start_tasks", [keys.root, keys.start_memo(memo)], args)
    return started_tasks(keys, reply)


def start_args(
    owner: str,
    now: datetime,
    lease_until: datetime,
    buckets: Sequence[int],
    limit: int,
    names: Sequence[str],
) -> tuple[str, list[object]]:
    """``start_tasks``' memo token and arguments (checked: ``ValueError``/``TypeError``)."""
    wanted, names = check.check_start(owner, now, lease_until, buckets, limit, names)
    memo = token()
    memo_ms = max(1000, math.ceil((lease_until - now).total_seconds() * 1000))
    args = [owner, encode_dt(now), encode_dt(lease_until), limit, memo, memo_ms,
            len(wanted), *wanted, len(names), *names]  # fmt: skip
    return memo, args


def started_tasks(keys: Keys, reply: Sequence[Any]) -> list[TaskSnapshot]:
    """The tasks a ``start_tasks`` reply (``'OK'``, then id and hash pairs) started."""
    return [decode_task(keys, text(reply[i]), pairs(reply[i + 1])) for i in range(1, len(reply), 2)]


def commit_start(
    keys: Keys, items: Sequence[CommitItem], start: StartRequest
) -> Plan[tuple[list[StoreError | None], list[TaskSnapshot] | StoreError]]:
    """``commit_tasks`` of ``items``, then ``start_tasks`` of ``start`` capped at the tasks the
    commit moved out of ``RUNNING``: one ``commit_start`` script call for up to
    ``COMMIT_BATCH`` items (more: the commits, then the start, as separate calls). The start's
    ``CorruptRecord`` (or refusal) is returned in place of its tasks: the commit stands."""
    checked = check.check_commit_items(items)
    memo, args = start_args(start.owner, start.now, start.lease_until, start.buckets,
                            start.limit, start.names)  # fmt: skip
    if not checked:
        return [], []  # nothing ended: nothing starts
    if len(checked) > COMMIT_BATCH:
        results = yield from commit_tasks(keys, checked)
        started = yield from start_tasks(keys, start.owner, start.now, start.lease_until,
                                         start.buckets, start.limit, start.names)  # fmt: skip
        return results, started
    committing = commit_args(checked)
    reply = yield script("commit_start", [keys.root, keys.counts, keys.start_memo(memo)],
                         [len(committing), *committing, *args])  # fmt: skip
    commit_reply, start_reply = reply[1], reply[2]
    results = commit_results(checked, replies.check(replies.Call("commit_tasks"), commit_reply))
    try:
        started = started_tasks(keys, replies.check(replies.Call("start_tasks"), start_reply))
    except StoreError as exc:
        return results, exc
    return results, started


@dataclass(frozen=True)
class StartRequest:
    """What a ``start_tasks`` call asks for (its keyword arguments)."""

    owner: str
    now: datetime
    lease_until: datetime
    buckets: Sequence[int]
    limit: int
    names: Sequence[str]


#: Index entries per ``upgrade_start_order`` call.
UPGRADE_SLICE = 500
#: Walks of the pending index before the upgrade gives up (a task that leaves the index while
#: it walks shifts the slices: the count check at the end sees it and it walks again).
UPGRADE_ROUNDS = 3
#: The ``{ns}:meta`` field that says the start queues hold every PENDING task.
START_ORDER_FIELD = "so"


def upgrade_start_order(keys: Keys) -> Plan[int]:
    """Queue the PENDING tasks of a namespace written before the start queues
    (``lua/upgrade_start_order.lua``), once: a namespace whose ``{ns}:meta`` has ``so`` costs
    one ``HGET``. Walks ``nm:pending:<b>`` for every bucket with pending tasks (the ``counts``
    hash names them), slice by slice; the last call records ``so`` (a namespace without
    PENDING tasks: one call). Returns the index entries looked at."""
    done = yield Read(keys.meta, "hget", (keys.meta, START_ORDER_FIELD))
    if done is not None:
        return 0
    counts = yield Read(keys.counts, "hgetall", (keys.counts,))
    prefix = b"pending:"
    buckets = sorted(int(f[len(prefix) :]) for f in counts if f.startswith(prefix))
    queues: list[tuple[int, str]] = []
    for bucket in buckets:
        names = yield Read(keys.bucket_names("pending", bucket), "hkeys",
                           (keys.bucket_names("pending", bucket),))  # fmt: skip
        queues += [(bucket, name) for name in sorted(text(n) for n in names)]
    script_keys = [keys.root, keys.meta]
    checked = [part for bucket, name in queues for part in (bucket, name)]
    if not queues:
        yield script("upgrade_start_order", script_keys, ["", "", 0, 1, 1, 0])
        return 0
    looked = 0
    for _ in range(UPGRADE_ROUNDS):
        for i, (bucket, name) in enumerate(queues):
            last = 1 if i == len(queues) - 1 else 0
            offset = 0
            while True:
                reply = yield script("upgrade_start_order", script_keys,
                                     [bucket, name, offset, UPGRADE_SLICE, last,
                                      len(queues), *checked])  # fmt: skip
                read = int(reply[1])
                looked, offset = looked + read, offset + read
                if read < UPGRADE_SLICE:
                    break
        if int(reply[2]):
            return looked
    raise CorruptRecord(keys.meta, START_ORDER_FIELD,
                        "PENDING tasks keep changing under the start queue upgrade")  # fmt: skip


def record_task_types(keys: Keys, names: Collection[str]) -> Plan[None]:
    """``TaskTypesStore.record_task_types``: one ``SADD`` (a union with what is recorded). A
    worker's write, and the one plain command that writes (``_redis.durability.WRITING_READS``:
    under ``durability_replicas`` the sync store sends it with ``WAIT``)."""
    checked = check.check_task_type_names(names)
    if checked:
        yield Read(keys.types, "sadd", (keys.types, *sorted(checked)))


def release_dependents(keys: Keys, limit: int) -> Plan[int]:
    """One ``release_dependents`` script call (``lua/release_dependents.lua``)."""
    reply = yield script("release_dependents", [keys.root, keys.releases], [limit])
    return int(reply[1])


def release_backlog(keys: Keys) -> Plan[int]:
    return int((yield Read(keys.releases, "zcard", (keys.releases,))))
