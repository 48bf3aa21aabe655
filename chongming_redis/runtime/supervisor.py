"""``supervise``: the supervisor thread. Every tick it renews the leases of held tasks (every
third of the lease), writes coalesced progress and heartbeats, and flushes transitions buffered
while the store was away. It never runs task code, so a busy task cannot starve it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.runtime.held import Held
from chongming_redis.runtime.loops import OUTAGE
from chongming_redis.runtime.writer import TaskWriter

log = logging.getLogger("chongming_redis.runtime")


def supervise(
    writer: TaskWriter,
    running: threading.Event,
    end_overdue: Callable[[Held], None],
    release: Callable[[Held], None] = lambda held: None,
) -> None:
    """``end_overdue``: ends a held task whose function runs past its timeout + grace
    (``Runner.end_overdue``); ``release``: lets the slot of a finished task go once its
    buffered end is written (``Runner.release_written``)."""
    config, events = writer.config, writer.events
    tick = min(config.progress_interval, config.task_lease / 4)
    while running.is_set():
        time.sleep(tick)
        renewed = 0
        for held in writer.held.all():
            try:
                if writer.overdue(held):
                    end_overdue(held)
                    continue
                renewed += supervise_one(writer, held, release)
            except StoreUnavailable as exc:  # logged once per outage, then summarised
                events.store_error("supervise")
                OUTAGE.failed(f"supervise {held.task_id}", exc)
            except Exception as exc:  # keep supervising the others
                if isinstance(exc, StoreError):
                    events.store_error("supervise")
                log.warning("%s: supervising %s: %s", writer.owner, held.task_id, exc)
        if renewed:  # one call per tick, not per task
            events.leases_renewed(renewed)


def supervise_one(
    writer: TaskWriter, held: Held, release: Callable[[Held], None] = lambda held: None
) -> bool:
    """One held task's turn in the tick; True when its lease was renewed."""
    if held.queued:
        return False  # the committer writes it
    if held.pending:
        written = writer.flush(held)
        if held.done and not held.pending:  # its end written, or dropped for a conflict
            if written:
                writer.held.forget(held)
            release(held)  # the slot it kept while its end was buffered
            return False
    if held.done:
        return False
    if time.monotonic() - held.lease_renewed_at >= writer.config.task_lease / 3:
        return writer.renew_lease(held)
    if held.ctx.progress_dirty or held.ctx.beats != held.heartbeat_written:
        writer.touch(held, lease=False)
    return False
