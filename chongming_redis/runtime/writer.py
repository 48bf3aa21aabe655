"""``TaskWriter``: how every runtime write reaches the store.

State changes of held tasks (a new snapshot plus its history entry, buffered while the store is
away and written as one jump when it is back), the group commit of finished tasks, moves of
tasks nobody here holds (reconcile, control of unheld tasks, retries), fenced lease renewals and
progress, command completion, and the hand-back at shutdown. It speaks to the store through the
``StoreAdapter`` (the named extensions, resolved once), so batching stores get state and
history in one atomic step and plain stores the two-call fallback.

Conflicts are never retried: a ``ConcurrencyConflict`` means a second writer exists; the task is
let go, loudly. A lost reply is told apart from a real conflict by reading the task back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.errors import ConcurrencyConflict, StoreError, StoreUnavailable
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.runtime.app import TaskType
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.events import NO_EVENTS, WorkerEvents
from chongming_redis.runtime.held import Held, HeldTasks, advance, without_lease
from chongming_redis.runtime.store_adapter import Started, StoreAdapter
from chongming_redis.runtime.task_log import handed_back

log = logging.getLogger("chongming_redis.runtime")


class TaskWriter:
    def __init__(
        self,
        adapter: StoreAdapter,
        *,
        owner: str,
        clock: ServerClock,
        held: HeldTasks,
        config: ControllerConfig,
        retry: RetryPolicy,
        events: WorkerEvents = NO_EVENTS,
    ) -> None:
        self.adapter = adapter
        self.store = adapter.store
        self.owner = owner
        self.clock = clock
        self.held = held
        self.config = config
        self.retry = retry
        #: This worker's task types by name (the controller's app fills it): their retry
        #: policies apply to tasks submitted without one.
        self.types: dict[str, TaskType] = {}
        #: The controller's observer (metrics); the runner and the loops report through it.
        self.events = events

    # -- held tasks: state changes ---------------------------------------------------------

    def transition(
        self, held: Held, status: TaskStatus, reason: str | None,
        not_before_in: timedelta | None = None, **changes: Any,
    ) -> bool:  # fmt: skip
        """Move a held task on in memory; ``flush`` writes it. ``not_before_in``: a not_before
        that long after the transition's own time (a retry's backoff, from the instant its
        history entry records). False, and nothing moved, once the task has ended here
        (``end``, ``hand_back``): a pause or a resume that loses the race with the task's own
        end must not move a finished task on — the store could not fence it, the version is
        ours."""
        with held.write_lock:
            if held.ended:
                return False
            self._move(held, status, reason, not_before_in, changes)
            return True

    def end(
        self, held: Held, status: TaskStatus, reason: str | None, *,
        retry_after: str | None = None, **changes: Any,
    ) -> bool:  # fmt: skip
        """The task's last move in this process, claimed once: how it ended and, with
        ``retry_after`` (why), its next attempt where the retry policy allows (``PENDING``
        after the backoff, in the same write). False, and nothing moved, when something else
        ended it first (its hand-back at shutdown won the race with its function's return)."""
        with held.write_lock:
            if held.ended:
                return False
            held.ended = True
            self._move(held, status, reason, None, changes)
            attempt, policy = held.snapshot.attempt, self.policy_of(held.snapshot)
            if retry_after is not None and policy.allows(attempt):
                delay, why = self._next_attempt(policy, attempt, retry_after)
                self._move(held, TaskStatus.PENDING, why, delay,
                           {"attempt": attempt + 1, "progress": None})  # fmt: skip
                timed_out = held.snapshot.failure is not None and (
                    held.snapshot.failure.error_type == "TaskTimeout")  # fmt: skip
                self.events.task_retried(held.snapshot.name,
                                         "timeout" if timed_out else "failed")  # fmt: skip
            return True

    def _move(
        self, held: Held, status: TaskStatus, reason: str | None,
        not_before_in: timedelta | None, changes: dict[str, Any],
    ) -> None:  # fmt: skip
        """One transition of ``held`` in memory (under its ``write_lock``)."""
        old = held.snapshot
        now = self.clock.now()
        if not_before_in is not None:
            changes["not_before"] = now + not_before_in
        if "progress" not in changes and held.ctx.progress is not None:
            changes["progress"] = held.ctx.progress  # not the stale one of the last save
        new = advance(old, status, now, **changes)
        held.snapshot = new
        held.pending.append(
            Transition(old.task_id, new.status_version, old.status, status, now, reason)
        )

    def flush(self, held: Held) -> bool:
        """Write the latest snapshot (one save, whatever the number of buffered transitions:
        the version jumps) and then the buffered history. False while the store is away."""
        with held.write_lock:
            if held.conflicted:  # another writer moved it on: never written again
                return False
            if not held.pending and held.stored_version == held.snapshot.status_version:
                return True
            try:
                stale = held.stored_version != held.snapshot.status_version
                if stale and self.adapter.batching:
                    self._commit_resolving(held)  # save + history: one atomic step
                else:  # save, then history: a blip between them keeps the entries buffered
                    if stale:
                        self._save_resolving(held)
                    self.adapter.append_all(held.pending)
                held.pending.clear()
                return True
            except StoreUnavailable as exc:
                self.events.store_error("write")
                self.log_buffered(held, exc)
                return False
            except ConcurrencyConflict as exc:
                # Never retried: a second writer exists. Stop acting on the task, loudly.
                log.error("%s: CONFLICT on %s, another writer exists; stopping it here: %s",
                          self.owner, held.task_id, exc)  # fmt: skip
                held.ctx.lose(f"another writer moved it on ({exc})")
                held.conflicted = True
                held.pending.clear()
                self.held.forget(held)
                return False

    def flush_many(
        self, batch: list[Held], start: Mapping[str, Any] | None = None
    ) -> list[Started]:
        """Group commit: every task of ``batch`` in one ``commit_tasks`` call; with ``start``
        (``StoreAdapter.start``'s arguments), the starts into the slots the batch frees in
        the same call (``StoreAdapter.commit_and_start``). Returns the tasks started (none
        when the call failed: the starter's next pass starts them)."""
        for held in batch:  # only the committer ever holds more than one of these locks
            held.write_lock.acquire()
        try:
            # Judged under the locks: the supervisor may have flushed one meanwhile. A task
            # goes once per call (the store refuses it twice); a second holder of the same id
            # is left to the supervisor's next flush.
            dirty, ids = [], set()
            for h in batch:
                stale = h.stored_version != h.snapshot.status_version
                if stale and not h.conflicted and h.task_id not in ids:
                    ids.add(h.task_id)
                    dirty.append(h)
            items = [(h.snapshot, h.stored_version, list(h.pending)) for h in dirty]
            started: list[Started] | StoreError = []
            try:
                if items and start is not None:
                    results, started = self.adapter.commit_and_start(items, **start)
                else:
                    results = self.adapter.commit(items) if items else []
            except StoreError as exc:  # the supervisor flushes them one by one later
                self.events.store_error("write")
                for held in dirty:
                    self.log_buffered(held, exc)
                return []
            if isinstance(started, StoreError):  # the commit stands; the starter tries again
                log.debug("%s: the start after a commit failed: %s", self.owner, started)
                started = []
            for held, conflict in zip(dirty, results):
                if conflict is None or self._already_stored(held):
                    held.stored_version = held.snapshot.status_version
                    held.pending.clear()
                else:
                    log.error("%s: CONFLICT on %s, another writer exists: %s",
                              self.owner, held.task_id, conflict)  # fmt: skip
                    held.ctx.lose(f"another writer moved it on ({conflict})")
                    held.conflicted = True
                    held.pending.clear()
            return started
        finally:
            for held in batch:
                held.write_lock.release()

    def flush_all(self, deadline: float) -> None:
        """Write every buffered transition, until ``deadline`` (monotonic)."""
        while time.monotonic() < deadline:
            dirty = [h for h in self.held.all() if h.pending]
            if not dirty:
                return
            for held in dirty:
                if self.flush(held) and held.done:
                    self.held.forget(held)
            time.sleep(0.1)

    def hand_back(self, held: Held, policy: str, why: str = "at shutdown") -> None:
        """Give a task this process will not finish back: requeue it or stop it. A hand-back
        is not a try that went wrong, so it keeps the attempt: the next start runs the same
        attempt again (``--max-attempts`` counts only the attempts that ended, failed or were
        found ``LOST``). A paused task stays paused until someone resumes it. Its thread may
        still run; the version bump fences every write it tries. ``why`` ends
        the history entry's reason. It is the task's end here (``end``): a task that already
        ended (its function returned first), or was handed back already (a second signal
        racing the shutdown thread), is left as it is."""
        with held.write_lock:
            if held.ended:
                return
            held.ended = True
            held.handed_back = policy != "stop"
            if policy == "stop":
                self._move(held, TaskStatus.STOPPED, f"stopped {why}", None, {})
            elif held.snapshot.status is TaskStatus.PAUSED:
                self._move(held, TaskStatus.PAUSED, f"handed back paused {why}", None, {})
            else:  # the attempt runs again from nothing: not this run's progress
                self._move(held, TaskStatus.PENDING, f"handed back {why}", None,
                           {"progress": None})  # fmt: skip
        held.done = True
        if held.handed_back:
            handed_back(held, why)
        held.ctx.lose(f"handed back {why}")  # the task thread stops at its next checkpoint
        if self.flush(held) and held.snapshot.status is TaskStatus.PAUSED:
            # End our lease where the new attempt begins, so nobody takes it for held (and no
            # reconciler marks it LOST when our old lease would have run out).
            until = held.snapshot.updated_at
            self.adapter.touch_fenced(held.task_id, expect_version=held.stored_version,
                                      lease_owner=self.owner, lease_until=until)  # fmt: skip

    def log_buffered(self, held: Held, exc: Exception) -> None:
        log.warning("%s: store unreachable, %d transition(s) of %s buffered: %s",
                    self.owner, len(held.pending), held.task_id, exc)  # fmt: skip

    def _commit_resolving(self, held: Held) -> None:
        """``commit_tasks`` of one task (save and history together), telling a lost reply
        from a real conflict as ``_save_resolving`` does."""
        (conflict,) = self.adapter.commit(
            [(held.snapshot, held.stored_version, list(held.pending))]
        )
        if conflict is not None and not self._already_stored(held):
            raise conflict
        held.stored_version = held.snapshot.status_version

    def _save_resolving(self, held: Held) -> None:
        """``save`` that tells a lost reply from a real conflict: if the store already holds
        exactly our snapshot (our earlier attempt landed), that is success."""
        try:
            self.store.save(held.snapshot, expect_version=held.stored_version)
        except ConcurrencyConflict:
            if not self._already_stored(held):
                raise
        held.stored_version = held.snapshot.status_version

    def _already_stored(self, held: Held) -> bool:
        """Did an earlier attempt of ours land (its reply was lost)? Then the store holds
        exactly our snapshot."""
        current = self.store.get(held.task_id)
        return current is not None and without_lease(current) == without_lease(held.snapshot)

    # -- held tasks: leases, heartbeats, progress ------------------------------------------

    def renew_lease(self, held: Held) -> bool:
        started = time.monotonic()
        if not self.touch(held, lease=True):
            return False
        held.lease_renewed_at = started
        # Our own deadline ends before the store's: a margin for the round trip and skew.
        held.ctx.extend_lease(started + self.config.task_lease * 0.8)
        return True

    def touch(self, held: Held, *, lease: bool) -> bool:
        """Write progress, a heartbeat (if the task beat) and, with ``lease``, the lease —
        fenced on the version this process holds. False (and the task let go) when the
        version moved on without us."""
        ctx = held.ctx
        now = self.clock.now()
        args: dict[str, Any] = {}
        beats, progress = ctx.take_progress()
        if beats != held.heartbeat_written:  # the task's own signal: never the lease's
            args["heartbeat_at"] = now
        if progress is not None:
            args["progress"] = progress
        if lease:
            args["lease_owner"] = self.owner
            args["lease_until"] = now + timedelta(seconds=self.config.task_lease)
        with held.write_lock:
            if held.conflicted:  # another writer moved it on: nothing more is written here
                return False
            try:
                applied = self.adapter.touch_fenced(
                    held.task_id, expect_version=held.stored_version, **args
                )
            except StoreUnavailable:
                self.events.store_error("lease")
                ctx.progress_dirty = progress is not None or ctx.progress_dirty
                return False
            if applied:  # later saves write the whole row: carry what touch wrote
                touched = {k: v for k, v in args.items() if k in ("heartbeat_at", "progress")}
                if touched:
                    held.snapshot = held.snapshot.evolve(**touched)
        if not applied:
            held.ctx.lose("another writer moved it on (its version changed)")
            log.error("%s: lost task %s: its version moved on without us",
                      self.owner, held.task_id)  # fmt: skip
            self.held.forget(held)
            return False
        held.heartbeat_written = beats
        return True

    # -- tasks nobody here holds -----------------------------------------------------------

    def move(self, snapshot: TaskSnapshot, new: TaskSnapshot, reason: str) -> bool:
        """Compare-and-set a task nobody here holds, with its history entry: in one round trip
        (so the history has no gap) where the store batches. False on conflict."""
        transition = Transition(snapshot.task_id, new.status_version, snapshot.status,
                                new.status, new.updated_at, reason)  # fmt: skip
        item = (new, snapshot.status_version, [transition])
        (conflict,) = self.adapter.commit([item], best_effort_history=True)
        return conflict is None

    def end_and_retry(
        self, snapshot: TaskSnapshot, ended: TaskSnapshot, reason: str, why: str,
        again: TaskStatus = TaskStatus.PENDING, *, retry: bool = True,
    ) -> tuple[bool, bool]:  # fmt: skip
        """Move a task nobody here holds to ``ended`` (``LOST``) and, where the retry policy
        allows, on to its next attempt (``again``: ``PENDING``, or ``PAUSED`` for a task that
        was paused) — one compare-and-set with both history entries, so nobody ever reads the
        end without the retry that follows it (a waiting producer takes ``LOST`` as final).
        ``retry=False``: no next attempt whatever the policy allows (a timeout its policy does
        not retry). Returns ``(moved, retried)``; ``(False, False)`` on conflict."""
        transitions = [Transition(snapshot.task_id, ended.status_version, snapshot.status,
                                  ended.status, ended.updated_at, reason)]  # fmt: skip
        final, policy = ended, self.policy_of(snapshot)
        if retry and policy.allows(ended.attempt):
            delay, retry_reason = self._next_attempt(policy, ended.attempt, why)
            # the task's own retention, not the default a final move fills in: it is unfinished
            final = advance(ended, again, ended.updated_at, attempt=ended.attempt + 1,
                            not_before=ended.updated_at + delay, progress=None,
                            retention=snapshot.retention)  # fmt: skip
            transitions.append(Transition(snapshot.task_id, final.status_version, ended.status,
                                          again, final.updated_at, retry_reason))  # fmt: skip
        item = (final, snapshot.status_version, transitions)
        (conflict,) = self.adapter.commit([item], best_effort_history=True)
        retried = conflict is None and final is not ended
        if retried:
            self.events.task_retried(snapshot.name, "timeout" if why == "timed out" else "lost")
        return conflict is None, retried

    def overdue(self, held: Held) -> bool:
        """A held task past its timeout plus the grace that has not ended: its function runs
        without a checkpoint, or it never began (it waits for a slot, prefetched)."""
        return not held.ended and held.ctx.overdue(self.config.timeout_grace)

    def policy_of(self, snapshot: TaskSnapshot) -> RetryPolicy:
        """The task's own retry policy, frozen at submit (or by its holder); else its type's
        as this worker knows it (``types``); else the worker's default."""
        task_type = self.types.get(snapshot.name)
        return snapshot.retry or (task_type.retry if task_type else None) or self.retry

    @staticmethod
    def _next_attempt(policy: RetryPolicy, attempt: int, why: str) -> tuple[timedelta, str]:
        """The backoff before the attempt after ``attempt`` and its history reason: the
        attempt number, why, and in how long it is due (from the entry's own time)."""
        delay = policy.delay(attempt)
        label = f"{attempt + 1}/{policy.max_attempts}"
        return delay, f"retry {label} after {why}, in {delay.total_seconds():.3f}s"

    # -- commands --------------------------------------------------------------------------

    def complete(self, command_id: str, now: datetime, outcome: str) -> None:
        try:
            self.store.complete_command(command_id, now=now, outcome=outcome)
        except StoreError as exc:  # its lease expires and it is handled again
            self.events.store_error("complete_command")
            log.warning("%s: command %s not completed: %s", self.owner, command_id, exc)

    def release_stops(self, held: Held) -> None:
        """A task this process lost, or handed back before its end was written: the stop
        commands that waited for its end ("stopping") go back to the queue now. Kept, they
        stayed leased here, unanswered, until ``command_lease`` ran out, while the task's next
        holder ran it to its end; released, that holder stops it, or any worker answers
        "already-terminal" (docs/reliability.md, the 20-seed matrix)."""
        while held.stop_commands:  # popped one by one: the command thread may append one
            command_id = held.stop_commands.pop(0)
            try:
                self.store.release_command(command_id, now=self.clock.now())
            except StoreError as exc:  # its lease runs out and it is handled again then
                self.events.store_error("commands")
                log.warning("%s: command %s not released: %s", self.owner, command_id, exc)
