"""``Reconciler``: marks ``RUNNING``/``PAUSED`` tasks whose supervisor lease expired ``LOST`` (a
compare-and-set: a holder that comes back loses its next write) and queues a new attempt where
the retry policy allows — ``PENDING``, or ``PAUSED`` for a task that was paused (a pause
survives its holder: it waits for a resume). A stalled heartbeat alone is only reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.policy import TaskTimeout
from chongming_redis.runtime.endings import overdue_in_store, timed_out_failure
from chongming_redis.runtime.held import (
    HELD_STATUSES,
    advance,
    heartbeat_stalled,
    holder,
    lease_expired,
)
from chongming_redis.runtime.submission import fill_policies
from chongming_redis.runtime.writer import TaskWriter


@dataclass
class ReconcileReport:
    lost: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, writer: TaskWriter) -> None:
        self.writer = writer

    def reconcile(self) -> ReconcileReport:
        writer, config = self.writer, self.writer.config
        report = ReconcileReport()
        now = writer.clock.now()
        for stored in writer.store.query(TaskQuery(statuses=frozenset(HELD_STATUSES))):
            ours = stored.task_id in writer.held  # we renew its lease
            # A task its producer froze no policy into: its type's, as this worker knows it.
            snapshot = fill_policies(stored, writer.types.get(stored.name))
            overdue = not ours and overdue_in_store(snapshot, now, config.timeout_grace)
            if overdue and self._end_timed_out(snapshot, now, report):
                continue
            if snapshot.status is TaskStatus.PAUSED and holder(snapshot) is None:
                continue  # paused while nobody ran it: no lease can expire
            if ours or not lease_expired(snapshot, now, config.task_lease):
                if snapshot.status is TaskStatus.RUNNING and heartbeat_stalled(
                    snapshot, now, config.stall_after
                ):
                    report.stalled.append(snapshot.task_id)
                continue
            lost = advance(snapshot, TaskStatus.LOST, now)
            reason = (
                f"lease of {snapshot.lease_owner or 'nobody'} expired at {snapshot.lease_until}"
            )
            again = (
                TaskStatus.PAUSED if snapshot.status is TaskStatus.PAUSED else TaskStatus.PENDING
            )
            moved, retried = writer.end_and_retry(snapshot, lost, reason, "lost", again)
            if not moved:
                continue  # the holder (or another reconciler) moved it on first
            report.lost.append(snapshot.task_id)
            if retried:
                report.retried.append(snapshot.task_id)
        return report

    def _end_timed_out(
        self, snapshot: TaskSnapshot, now: datetime, report: ReconcileReport
    ) -> bool:
        """End a task still ``RUNNING`` past its deadline + grace that nobody here holds:
        ``FAILED``/``TaskTimeout`` by compare-and-set (its holder's next write is refused),
        then its next attempt if its policy retries timeouts. False on conflict."""
        writer = self.writer
        failure = timed_out_failure(snapshot, writer.owner)
        ended = advance(snapshot, TaskStatus.FAILED, now, failure=failure)
        grace = writer.config.timeout_grace
        reason = f"timed out: RUNNING past its deadline + {grace:g}s grace, ended by {writer.owner}"
        retry = writer.policy_of(snapshot).retries_type(TaskTimeout)
        moved, retried = writer.end_and_retry(snapshot, ended, reason, "timed out", retry=retry)
        if moved:
            writer.events.task_timed_out(snapshot.name)
            report.timed_out.append(snapshot.task_id)
            if retried:
                report.retried.append(snapshot.task_id)
        return moved
