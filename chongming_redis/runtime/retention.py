"""Retention: finished tasks past their ``retention`` are removed by the workers, in bounded
steps, on every reconcile tick (``TaskPoliciesStore.expire_finished``: each step removes at
most ``EXPIRE_BATCH`` tasks, earliest expiry first, with their history, leaving feed
tombstones). Every worker sweeps; the store's step is atomic, so two sweeping at once remove
each task once. A store without the extension keeps finished tasks until ``prune``."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from chongming_redis.errors import StoreError
from chongming_redis.runtime.store_adapter import StoreAdapter

log = logging.getLogger("chongming_redis.runtime")

#: Tasks removed per store call.
EXPIRE_BATCH = 100
#: How long one tick may keep sweeping while every call comes back full (seconds).
SWEEP_BUDGET = 0.5


def expire_finished(adapter: StoreAdapter, now: datetime) -> int:
    """Remove what expired by ``now``, batch after batch while each comes back full, for at
    most ``SWEEP_BUDGET`` seconds; returns how many tasks were removed (0 without the
    extension or on a store error, which the next tick retries)."""
    store = adapter.policies
    if store is None:
        return 0
    removed, ends = 0, time.monotonic() + SWEEP_BUDGET
    while True:
        try:
            batch = store.expire_finished(now=now, limit=EXPIRE_BATCH)
        except StoreError as exc:
            log.warning("%s: retention sweep failed: %s", adapter.owner, exc)
            return removed
        removed += len(batch)
        if len(batch) < EXPIRE_BATCH or time.monotonic() >= ends:
            return removed
