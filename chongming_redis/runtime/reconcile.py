"""``Reconciler``: marks ``RUNNING``/``PAUSED`` tasks whose supervisor lease expired ``LOST`` (a
compare-and-set: a holder that comes back loses its next write) and queues a new attempt where
the retry policy allows — ``PENDING``, or ``PAUSED`` for a task that was paused (a pause
survives its holder: it waits for a resume). A stalled heartbeat alone is only reported."""

from __future__ import annotations

from dataclasses import dataclass, field

from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.runtime.held import (
    HELD_STATUSES,
    advance,
    heartbeat_stalled,
    holder,
    lease_expired,
)
from chongming_redis.runtime.writer import TaskWriter


@dataclass
class ReconcileReport:
    lost: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, writer: TaskWriter) -> None:
        self.writer = writer

    def reconcile(self) -> ReconcileReport:
        writer, config = self.writer, self.writer.config
        report = ReconcileReport()
        now = writer.clock.now()
        for snapshot in writer.store.query(TaskQuery(statuses=frozenset(HELD_STATUSES))):
            ours = snapshot.task_id in writer.held  # we renew its lease
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
