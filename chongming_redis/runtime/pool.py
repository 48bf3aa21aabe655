"""Bucket ownership across worker processes and machines.

Each worker registers with a heartbeat and holds leases on its share of the buckets, all in
the store (a ``BucketPoolStore``; on Redis, ``lua/pool_tick.lua``). The share is decided by
rendezvous hashing over the live workers and the current owners: every worker computes the
same assignment from the same state, shares stay within one of each other, and a worker joining
or leaving moves only the buckets it gains or loses (about ``1/n`` of them). A bucket whose
owner died is free once its lease expires, so buckets move within at most two worker leases.

Ownership decides who *starts* a bucket's ``PENDING`` tasks; it is not the fence. The start is a
compare-and-set ``PENDING -> RUNNING``, so two workers that both believe they own a bucket
still never both start a task. A worker that loses a bucket lets its running tasks finish under
their own task leases.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Protocol

from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.runtime.events import NO_EVENTS, WorkerEvents
from chongming_redis.runtime.loops import OUTAGE

if TYPE_CHECKING:
    from chongming_redis.stores.extensions import BucketPoolStore


class Clock(Protocol):
    def now(self) -> datetime: ...


log = logging.getLogger("chongming_redis.pool")


def rendezvous(
    workers: Iterable[str], num_buckets: int, current: Mapping[int, str] | None = None
) -> dict[str, frozenset[int]]:
    """Rendezvous hashing with bounded load, sticky to the ``current`` owners.

    Each worker gets a quota: ``num_buckets // n``, plus one for the ``num_buckets % n`` workers
    that rank first by a hash of their name, so shares stay within one of each other. A worker
    keeps the buckets it holds in ``current`` up to its quota (those of highest hash first);
    every other bucket (free, held by a worker that is not live, or shed) goes, in bucket order,
    to the worker with the highest hash of ``(worker, bucket)`` that still has room.

    A join never raises an existing worker's quota and a leave never lowers one, so from a
    settled assignment a join moves only the buckets the newcomer gains and a leave only the
    leaver's. (Plain bounded-load rendezvous, recomputed from the member list alone, moves
    buckets between the other workers too: capacity shifts cascade through the greedy order.)
    """
    members = sorted(set(workers))
    if not members:
        return {}
    base, extra = divmod(num_buckets, len(members))
    ranked = sorted(members, key=_rank, reverse=True)
    quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(ranked)}
    held: dict[str, list[int]] = {w: [] for w in members}
    for bucket, owner in (current or {}).items():
        if owner in held and 0 <= bucket < num_buckets:
            held[owner].append(bucket)
    share = {
        w: set(sorted(held[w], key=partial(_weight, w), reverse=True)[: quota[w]]) for w in members
    }
    kept = set().union(*share.values())
    for bucket in range(num_buckets):
        if bucket in kept:
            continue
        for worker in sorted(members, key=lambda w: _weight(w, bucket), reverse=True):
            if len(share[worker]) < quota[worker]:
                share[worker].add(bucket)
                break
    return {w: frozenset(b) for w, b in share.items()}


def _ranges(buckets: list[int]) -> str:
    """``0-15, 32, 40-47`` for a log line (a sorted list)."""
    runs: list[list[int]] = []
    for bucket in buckets:
        if runs and bucket == runs[-1][1] + 1:
            runs[-1][1] = bucket
        else:
            runs.append([bucket, bucket])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _rank(worker: str) -> bytes:
    return hashlib.blake2b(f"{worker}\x00quota".encode(), digest_size=8).digest()


def _weight(worker: str, bucket: int) -> bytes:
    return hashlib.blake2b(f"{worker}\x00{bucket}".encode(), digest_size=8).digest()


class BucketPool:
    """One worker's membership of the pool. It knows the store's pool calls, the worker's
    name, the deployment's bucket count and the clock, and tells the controller which buckets
    are its through ``on_change`` — nothing else of the controller."""

    def __init__(
        self,
        store: BucketPoolStore,
        *,
        owner: str,
        num_buckets: int,
        clock: Clock,
        on_change: Callable[[frozenset[int]], None],
        worker_lease: float = 5.0,
        announce: Callable[[], None] | None = None,
        events: WorkerEvents = NO_EVENTS,
    ) -> None:
        """``announce``: tell the other workers of the pool to tick now (a nudge); called
        after a tick that changed this worker's buckets, and on joining and leaving. Without
        it (or when a nudge is lost) they notice at their next tick, ``worker_lease / 3``.
        ``events`` hears of the bucket count, the heartbeat's failures and the reconnect."""
        self.store = store
        self.owner = owner
        self.num_buckets = num_buckets
        self.clock = clock
        self.on_change = on_change
        self.worker_lease = worker_lease
        self.held: frozenset[int] = frozenset()
        self.live: list[str] = []
        self.moves = 0
        self.announce = announce or (lambda: None)
        self.events = events
        #: Set by a nudge: the next tick happens now, not at the end of the interval.
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, *, leaving: bool = False) -> frozenset[int]:
        """Heartbeat, then renew / take / release bucket leases. Raises ``StoreError`` (not
        ``StoreUnavailable``) when the namespace runs with another ``num_buckets``."""
        num_buckets = self.num_buckets
        now = self.clock.now()
        wanted: list[int] = []
        if not leaving:
            # The current state, read fresh: a worker whose heartbeat expired is out now, not
            # one tick later, and the owners keep what they hold (minimal movement).
            workers, owners = self.store.pool_state()
            members = {w for w, until in workers.items() if until > now} | {self.owner}
            wanted = sorted(rendezvous(members, num_buckets, owners)[self.owner])
        held, live = self.store.pool_tick(
            worker=self.owner, now=now,
            lease_seconds=self.worker_lease, num_buckets=num_buckets,
            wanted=wanted, leaving=leaving,
        )  # fmt: skip
        self.live = live
        new = frozenset(held)
        if new != self.held:
            gained, lost = sorted(new - self.held), sorted(self.held - new)
            self.moves += len(gained) + len(lost)
            log.info("%s: buckets +[%s] -[%s] (now %d, %d live worker(s))",
                     self.owner, _ranges(gained), _ranges(lost), len(new), len(live))  # fmt: skip
            self.held = new
            self.events.buckets_owned(len(new))
            self.on_change(new)
            # The others decide their shares from ours: a release lets a newcomer take the
            # buckets now, a take lets the old owner see it is done. Quiet when nothing moved,
            # so the nudges stop once the pool has settled.
            self.announce()
        return new

    def start(self) -> None:
        self.tick()  # refuse to start on a num_buckets mismatch, before any task runs
        self.announce()  # a newcomer: the owners shed its share now, not a tick later
        self._thread = threading.Thread(target=self._loop, name=f"{self.owner}-pool", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.wake.wait(self.worker_lease / 3)
            self.wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except StoreUnavailable as exc:  # logged once per outage, then summarised
                self.events.store_error("pool")
                OUTAGE.failed(f"send the pool heartbeat of {self.owner}", exc)
            except StoreError as exc:
                self.events.store_error("pool")
                log.error("%s: pool: %s", self.owner, exc)
            else:
                # A tick always reaches the store: Redis is back.
                if OUTAGE.succeeded():
                    self.events.reconnected()

    def stop(self) -> None:
        """Leave the pool: release every bucket and unregister, so others take over at once."""
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.tick(leaving=True)
            self.announce()  # its buckets are free: the others take them now
        except StoreError as exc:
            log.warning("%s: could not leave the pool cleanly: %s", self.owner, exc)
