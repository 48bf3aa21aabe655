"""The bucket pool and the namespace's records in SQL, for every SQL store: ``pool_tick`` /
``pool_state`` / ``worker_beats`` (``BucketPoolStore``, ``WorkerBeatsStore``), the recorded
``num_buckets`` (``RecordedBucketsStore``) and the task type names (``TaskTypesStore``).

``pool_tick`` is ``lua/pool_tick.lua`` as one transaction: the recorded ``num_buckets`` row is
read with the dialect's ``FOR UPDATE`` first, so ticks of one pool run one after the other and a
bucket never has two owners with a valid lease. Times are microseconds (Redis keeps
milliseconds); a worker whose expiry is ``<= now`` is dropped, as on Redis.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from datetime import datetime

from chongming_redis.errors import CorruptRecord, StoreError
from chongming_redis.stores._sql.rows import integer, text
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.validation import (
    check_bool,
    check_dt,
    check_identifier,
    check_int,
    check_positive_seconds,
)

NUM_BUCKETS = "num_buckets"
MAX_NUM_BUCKETS = 65536  # lua/pool_tick.lua's bound
#: A pool heartbeat lease is seconds to minutes; a day bounds a typo, not a use.
MAX_POOL_LEASE_SECONDS = 24 * 3600.0


def check_tick(
    worker: object,
    now: object,
    lease_seconds: object,
    num_buckets: object,
    wanted: object,
    leaving: object,
) -> tuple[int, int, list[int]]:
    """``pool_tick``'s arguments; returns ``(now µs, lease µs, wanted buckets)``."""
    check_identifier(worker, "worker")
    moment = encode_dt(check_dt(now, "now"))
    seconds = check_positive_seconds(lease_seconds, "lease_seconds",
                                     maximum=MAX_POOL_LEASE_SECONDS)  # fmt: skip
    check_int(num_buckets, "num_buckets", minimum=1, maximum=MAX_NUM_BUCKETS)
    check_bool(leaving, "leaving")
    if isinstance(wanted, str | bytes) or not isinstance(wanted, Collection):
        raise TypeError(f"wanted must be a sequence of buckets, not {type(wanted).__name__}")
    buckets = [check_int(b, "wanted bucket", maximum=2**31 - 1) for b in wanted]
    return moment, max(1, math.ceil(seconds * 1_000_000)), buckets


def tick(
    tx: Tx,
    *,
    worker: str,
    now: int,
    lease: int,
    num_buckets: int,
    wanted: Sequence[int],
    leaving: bool,
    namespace: str,
) -> tuple[list[int], list[str]]:
    """One worker's heartbeat and bucket leases (``BucketPoolStore.pool_tick``)."""
    # The first tick records num_buckets; every tick then locks that row (concurrent first
    # ticks meet on the insert). A mismatch raises: the caller rolls back, nothing is written.
    tx.run(
        "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        [NUM_BUCKETS, num_buckets],
    )
    recorded = _meta(tx, NUM_BUCKETS, lock=True)
    if recorded != num_buckets:
        raise StoreError(
            f"namespace {namespace!r} runs with num_buckets={recorded}, "
            f"this worker has {num_buckets}: every worker must use the same value"
        )
    until = now + lease
    tx.run("DELETE FROM pool_workers WHERE expires_at <= ?", [now])
    if leaving:
        tx.run("DELETE FROM pool_workers WHERE worker = ?", [worker])
    else:
        tx.run(
            "INSERT INTO pool_workers (worker, expires_at, beat_at) VALUES (?, ?, ?)"
            " ON CONFLICT (worker) DO UPDATE SET expires_at = excluded.expires_at,"
            " beat_at = excluded.beat_at",
            [worker, until, now],
        )
    want = set() if leaving else {b for b in wanted if b < num_buckets}
    held = _lease_buckets(tx, worker, want, now, until)
    live = tx.rows("SELECT worker FROM pool_workers ORDER BY expires_at, worker")
    return held, [text(w) for (w,) in live]


def _lease_buckets(tx: Tx, me: str, want: set[int], now: int, until: int) -> list[int]:
    """Renew or release this worker's buckets; take the wanted ones that are free or expired."""
    owners: dict[int, tuple[str | None, int]] = {
        integer(b, "pool_buckets", "bucket"): (text(w), integer(u, "pool_buckets", "lease_until"))
        for b, w, u in tx.rows("SELECT bucket, owner, lease_until FROM pool_buckets")
    }
    held = []
    for bucket, (owner, _) in owners.items():
        if owner == me and bucket not in want:
            tx.run("DELETE FROM pool_buckets WHERE bucket = ?", [bucket])
    for bucket in sorted(want):
        owner, expiry = owners.get(bucket, (None, 0))
        if owner == me or owner is None or expiry <= now:
            tx.run(
                "INSERT INTO pool_buckets (bucket, owner, lease_until) VALUES (?, ?, ?)"
                " ON CONFLICT (bucket) DO UPDATE SET owner = excluded.owner,"
                " lease_until = excluded.lease_until",
                [bucket, me, until],
            )
            held.append(bucket)
    return held


def state(tx: Tx) -> tuple[dict[str, datetime], dict[int, str]]:
    """``({worker: heartbeat expiry}, {bucket: owner})`` as the pool last wrote them."""
    workers = {
        text(w): _dt(e, "pool_workers/" + text(w), "expires_at")
        for w, e in tx.rows("SELECT worker, expires_at FROM pool_workers")
    }
    owners = {
        integer(b, "pool_buckets", "bucket"): text(w)
        for b, w in tx.rows("SELECT bucket, owner FROM pool_buckets")
    }
    return workers, owners


def beats(tx: Tx) -> dict[str, datetime]:
    """``{worker: the now of its last tick}`` for the live workers."""
    return {
        text(w): _dt(b, "pool_workers/" + text(w), "beat_at")
        for w, b in tx.rows("SELECT worker, beat_at FROM pool_workers")
    }


def recorded_num_buckets(tx: Tx) -> int | None:
    return _meta(tx, NUM_BUCKETS)


def record_types(tx: Tx, names: Collection[str]) -> None:
    for name in sorted(names):
        tx.run("INSERT INTO task_types (name) VALUES (?) ON CONFLICT (name) DO NOTHING", [name])


def types(tx: Tx) -> frozenset[str]:
    return frozenset(text(name) for (name,) in tx.rows("SELECT name FROM task_types"))


def _meta(tx: Tx, name: str, *, lock: bool = False) -> int | None:
    suffix = tx.dialect.for_update if lock else ""
    found = tx.rows(f"SELECT value FROM meta WHERE name = ?{suffix}", [name])
    return None if not found else integer(found[0][0], "meta/" + name, "value")


def _dt(value: object, key: str, column: str) -> datetime:
    try:
        return decode_dt(integer(value, key, column))
    except ValueError as exc:
        raise CorruptRecord(key, column, str(exc)) from None
