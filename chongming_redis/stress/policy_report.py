"""The task policies' part of a stress run's report: the inputs of ``policy_checks`` gathered
from Redis after the run, the feed watch and the driver's log, the checkers run, and the counts
that show the policies were really exercised (retries by cause, timeouts, expiries, unique
submits). ``report.collect`` calls :func:`removed` first (the tasks its other checkers must
read from the watch) and :func:`check` last."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Tombstone, Transition
from chongming_redis.stress import policy_checks
from chongming_redis.stress.checkers import Violation
from chongming_redis.stress.feed_watch import FeedWatch
from chongming_redis.stress.stress_store import StressStore


def stall_windows(records: Sequence[Mapping[str, Any]], wall0: float) -> list[tuple[float, float]]:
    """The wall-clock windows of the run's ``lease_holder_pause`` faults (``at`` to ``t``, from
    the driver's log): on SQLite a worker stopped inside a write transaction holds the
    database's one write lock for that long, and every other writer waits."""
    return [(wall0 + r["at"], wall0 + r["t"]) for r in records
            if r.get("op") == "fault" and r.get("kind") == "lease_holder_pause"]  # fmt: skip


@dataclass
class PolicyRun:
    """What the harness knows of the run that the policy checkers need: the workers' policy
    settings (as the harness passes them: ``--max-attempts``, ``--task-lease``, hence the
    reconcile interval, and ``timeout_grace``), the feed watch, the driver's log and when the
    workers were stopped (server time)."""

    default_max_attempts: int
    timeout_grace: float
    reconcile_interval: float
    task_lease: float
    watch: FeedWatch | None = None
    driver_log: Sequence[Mapping[str, Any]] = ()
    workers_stopped_at: float | None = None
    #: Wall-clock windows the store's writers may have been stalled in (``stall_windows``).
    stalls: Sequence[tuple[float, float]] = ()

    @property
    def timeout_slack(self) -> float:
        """How long past its ``timeout`` an attempt may stay held: ``timeout_grace`` (its
        worker ends a silent one then), one reconcile interval (a reconcile of another worker
        ends one whose holder cannot: killed, SIGSTOPped, cut off) and one task lease (a
        ``PAUSED`` attempt is not ended by that reconcile: it goes ``LOST`` once the lease of
        its SIGSTOPped holder has run out). docs/reliability.md."""
        return self.timeout_grace + self.reconcile_interval + self.task_lease

    def bounds(self) -> dict[str, float]:
        return {"timeout_grace": self.timeout_grace,
                "reconcile_interval": self.reconcile_interval, "task_lease": self.task_lease,
                "timeout_slack": self.timeout_slack,
                "tolerance": policy_checks.CLOCKS}  # fmt: skip


@dataclass
class Removed:
    """Tasks gone at the end with a feed tombstone, and what the watch kept of them."""

    tombstones: dict[str, Tombstone] = field(default_factory=dict)
    snapshots: dict[str, TaskSnapshot] = field(default_factory=dict)  # their final snapshots
    histories: dict[str, list[Transition]] = field(default_factory=dict)

    @property
    def unverifiable(self) -> set[str]:
        """Removed tasks whose history nobody kept: checks that need it skip them."""
        return set(self.tombstones) - set(self.histories)


def removed(
    finals: Mapping[str, TaskSnapshot | None],
    tombstones: Mapping[str, Tombstone],
    watch: FeedWatch | None,
) -> Removed:
    """The tasks of ``finals`` gone at the end whose removal the feed shows."""
    gone = Removed()
    for task_id, snap in finals.items():
        tomb = tombstones.get(task_id)
        if snap is not None or tomb is None:
            continue
        gone.tombstones[task_id] = tomb
        seen = watch.tasks.get(task_id) if watch is not None else None
        if seen is not None and seen.last.status.is_terminal:
            gone.snapshots[task_id] = seen.last
            if seen.history is not None:
                gone.histories[task_id] = seen.history
    return gone


def check(
    store: StressStore,
    known: Mapping[str, TaskSnapshot | None],
    histories: Mapping[str, Sequence[Transition]],
    tombstones: Mapping[str, Tombstone],
    run: PolicyRun,
) -> tuple[list[Violation], dict[str, Any]]:
    """Run the policy checkers; returns the violations and the report's counts. ``known``:
    the final snapshot of each task (the watch's for a removed one); ``tombstones``: every
    tombstone of the feed."""
    watch = run.watch
    present = {t: s for t, s in known.items() if s is not None}
    end = store.server_time().timestamp()
    found = policy_checks.check_attempts(
        histories, {t: s.retry for t, s in present.items()}, run.default_max_attempts
    )
    timeouts = {t: s.timeout for t, s in present.items()}
    found += policy_checks.check_timeouts(histories, timeouts, run.timeout_slack,
                                          until=run.workers_stopped_at,
                                          stalls=run.stalls)  # fmt: skip

    removals = []
    for task_id, tomb in tombstones.items():
        seen = watch.tasks.get(task_id) if watch is not None else None
        removals.append(policy_checks.removal_of(
            task_id, tomb.removed_at.timestamp(),
            watch.removed_by.get(task_id) if watch is not None else None,
            seen.last if seen is not None else None))  # fmt: skip
    found += policy_checks.check_removals(removals)

    submits = policy_checks.unique_submits(run.driver_log)
    acked_at = {s.task_id: s.acked_at for s in submits if s.created}
    uniques = {t: s.unique for t, s in present.items()}
    found += policy_checks.check_unique_overlaps(histories, uniques, acked_at)
    spans = {}
    for task_id, snap in present.items():
        seen = watch.tasks.get(task_id) if watch is not None else None
        final_by = seen.final_by if seen is not None else None
        if final_by is None and snap.status.is_terminal:
            final_by = end  # final by the end of the run, at the latest
        spans[task_id] = policy_checks.TaskSpan(snap.unique, snap.created_at.timestamp(),
                                                final_by)  # fmt: skip
    # a submit that returned a removed task the watch never saw cannot be judged
    judged = [s for s in submits if s.returned in spans or s.returned not in tombstones]
    found += policy_checks.check_unique_submits(judged, spans)
    unique_ids = {s.unique for s in submits} | {s.unique for s in present.values() if s.unique}
    holders = {u: store.unique_holder(u) for u in sorted(unique_ids)}
    found += policy_checks.check_unique_holders(holders, known)

    retries = policy_checks.retries_by_cause(histories)
    entries = list(itertools.chain.from_iterable(histories.values()))
    enforced = sum(1 for e in entries if (e.reason or "").startswith("timed out"))
    final_timeouts = sum(
        1
        for s in present.values()
        if s.status is TaskStatus.FAILED and s.failure and s.failure.error_type == "TaskTimeout"
    )
    retried_timeouts = sum(
        n for why, n in retries.items() if "TaskTimeout" in why or why == "timed out"
    )
    counts: dict[str, Any] = {
        "policy_bounds": run.bounds(),
        "default_max_attempts": run.default_max_attempts,
        "retries_by_cause": retries,
        # attempts that ended in a timeout: retried ones (their retry names the cause) and
        # final ones; "enforced": ended by a worker without a checkpoint (a silent thread,
        # or a holder that could not act)
        "timeouts": retried_timeouts + final_timeouts,
        "timeouts_enforced": enforced,
        "timeout_worst_overrun": _worst_overrun(histories, timeouts, run.workers_stopped_at),
        "expired": len(tombstones),
        "expired_unjudged": sum(1 for r in removals if r.expires is None),
        "expiry_lag_max": policy_checks.expiry_lag(removals),
        "unique_submits": len(submits),
        "unique_created": sum(1 for s in submits if s.created),
        "unique_returned_holder": sum(1 for s in submits if not s.created),
        "unique_ids": len(unique_ids),
        "unique_holders_at_end": sum(1 for h in holders.values() if h is not None),
        "feed_polls": watch.polls if watch is not None else 0,
        "feed_failed_polls": watch.failed_polls if watch is not None else 0,
    }
    return found, counts


def _worst_overrun(
    histories: Mapping[str, Sequence[Transition]],
    timeouts: Mapping[str, float | None],
    until: float | None,
) -> float | None:
    """The longest an attempt was held past its timeout (seconds; a measure to read against
    the bound), ``None`` without timed attempts."""
    worst = None
    for task_id, history in histories.items():
        timeout = timeouts.get(task_id)
        if timeout is None:
            continue
        for _, start, stop, _ in policy_checks.attempt_spans(history, until):
            if stop is not None:
                over = round(stop - start - timeout, 3)
                worst = over if worst is None else max(worst, over)
    return worst
