"""The group committer: the thread that writes the ends of finished tasks in batches.

Where the store batches (``BatchingStore.commit_tasks``), ``Runner.finish`` queues a finished
task instead of writing it; this loop writes every task that finished since the last round
trip with one call (up to 100), then settles each (``Runner.settle``: its stop commands are
answered and its slot is free for the next start) and starts the next tasks into the freed
slots itself (``start_next``)."""

from __future__ import annotations

import logging
import queue
import threading
import time

from chongming_redis.errors import StoreError
from chongming_redis.runtime.held import Held
from chongming_redis.runtime.runner import Runner

log = logging.getLogger("chongming_redis.runtime")

#: Finished tasks per ``commit_tasks`` round trip.
COMMIT_BATCH = 100


def commit_finished(runner: Runner, running: threading.Event) -> None:
    """Run until ``running`` is cleared and nothing is left to write."""
    while running.is_set() or not runner.commits.empty():
        try:
            batch = [runner.commits.get(timeout=0.2)]
        except queue.Empty:
            continue
        # Group commit: while tasks that usually end within a round trip still run, their
        # ends join this call (the slots would otherwise come back a few at a time).
        linger_until = time.monotonic() + runner.linger()
        while len(batch) < COMMIT_BATCH:
            try:
                batch.append(runner.commits.get_nowait())
                continue
            except queue.Empty:
                pass
            left = linger_until - time.monotonic()
            if left <= 0 or not runner.running():
                break
            try:
                batch.append(runner.commits.get(timeout=left))
            except queue.Empty:
                break
        try:
            commit_and_start(runner, batch)
        except Exception:  # never the thread's end: slots would stay taken for good
            log.exception("%s: group commit failed", runner.writer.owner)
        for held in batch:
            held.queued = False  # if the write failed, the supervisor retries it
            try:
                runner.settle(held, wake=False)
            except Exception:  # as above: one task's settling never ends the thread
                log.exception("%s: settling %s failed", runner.writer.owner, held.task_id)
        start_next(runner)


def commit_and_start(runner: Runner, batch: list[Held]) -> None:
    """Write ``batch`` and start tasks into the slots it frees, in one call, while holding the
    one-start-call-at-a-time turn (``Runner.start_turn``: a shutdown's ``wait_for_start``
    then waits for this start too, so none lands after its hand-backs). When the starter's
    call holds the turn, the batch is committed alone and the starter fills the slots."""
    with runner.start_turn() as mine:
        sent_at = time.monotonic()
        started = runner.writer.flush_many(batch, runner.start_with_commit(len(batch)) if mine
                                           else None)  # fmt: skip
        # The batch's slots go to the tasks started with it before the batch lets them go
        # (settle), so the starter never counts them free in between.
        runner.took(time.monotonic() - sent_at)
        runner.take(started, sent_at)
    if not mine:
        runner.wake_starter.set()


def start_next(runner: Runner) -> None:
    """The slots a commit freed take their next tasks in this thread, at once: a handoff to
    the starter thread cost a wake-up per batch. A failure leaves it to the starter."""
    try:
        runner.start_available(wait=False)
    except StoreError as exc:  # the starter's loop retries it and logs the outage
        log.debug("%s: start after a commit failed: %s", runner.writer.owner, exc)
        runner.wake_starter.set()
    except Exception:  # never the committer's end
        log.exception("%s: start after a commit failed", runner.writer.owner)
        runner.wake_starter.set()
