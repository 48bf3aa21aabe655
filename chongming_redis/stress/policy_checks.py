"""Checkers of the task policies (issue 25) over a stress run's records (docs/reliability.md):
attempts within the frozen retry policy, no attempt running far past its timeout, no finished
task removed before its retention ran out, at most one unfinished task per unique id, and the
unique records and unique submits agreeing with the tasks. Plain data in, :class:`Violation`
out, as the other checkers (``stress/checkers.py``), so each is unit-tested on hand-made
histories (``stress/test_policy_checks.py``).

Times are seconds since the epoch. A history entry's ``at`` is its writer's clock (each
process follows the server's: ``runtime/clock.py``) taken when the move was decided, at or
before the write landed; the driver's ``sent_at``/``acked_at`` bracket its own calls. Every
checker only reports what those times prove, with ``tolerance`` for the clocks' differences.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.stress.checkers import HAND_BACK, START, Violation

#: ``retry 2/3 after failed (Flaky), in 0.200s`` (``TaskWriter._next_attempt``); a retry by
#: hand (``retry 2 by <who>``) has no ``/M``.
RETRY_LABEL = re.compile(r"^retry (?P<n>\d+)/(?P<m>\d+) after (?P<why>.+?), in ")
#: A retry by hand (``submission.retried``): an attempt past the policy's, which nobody judges.
BY_HAND = re.compile(r"^retry \d+ by ")
HOLDING = (TaskStatus.RUNNING, TaskStatus.PAUSED)
#: How far (seconds) two processes' readings of the server's clock may differ under the run's
#: faults: a worker measures its offset from a ``TIME`` round trip, and a reply the proxy
#: delays (20-90 ms) skews that measurement until its next resync (30 s later); 0.085 s was
#: seen between a start and the creation entry before it.
CLOCKS = 0.5


def _hms(seconds: float | None) -> str:
    """A time of the run for a violation's detail (UTC, to the millisecond)."""
    if seconds is None:
        return "?"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _is_start(entry: Transition) -> bool:
    return entry.from_status is TaskStatus.PENDING and entry.to_status is TaskStatus.RUNNING


# -- attempts ---------------------------------------------------------------------------------


def check_attempts(
    histories: Mapping[str, Sequence[Transition]],
    policies: Mapping[str, RetryPolicy | None],
    default_max_attempts: int,
) -> list[Violation]:
    """``attempts_exceeded``: a task started more often than its frozen policy's
    ``max_attempts`` (``policies[task]``; ``None``: the workers' default policy, whose
    ``max_attempts`` the harness passes them), not counting the runs its workers handed back
    (a graceful shutdown gives the same attempt back: it runs again) nor the retries by hand
    (``retry N by <who>``: one more attempt, which no policy judges); a start whose attempt
    number is past ``max_attempts`` (plus the retries by hand before it): an attempt counted
    two ways; or a retry whose label (``retry N/M``) names another policy's ``M`` or an ``N``
    past it. Tasks not in ``policies`` (no snapshot known) are not judged."""
    found = []
    for task_id, history in histories.items():
        if task_id not in policies:
            continue
        policy = policies[task_id]
        allowed = policy.max_attempts if policy is not None else default_max_attempts
        starts = sum(1 for e in history if _is_start(e))
        handed = sum(1 for e in history if (e.reason or "").startswith(HAND_BACK))
        by_hand = sum(1 for e in history if BY_HAND.match(e.reason or ""))
        if starts - handed - by_hand > allowed:
            found.append(Violation("attempts_exceeded", task_id,
                                   f"{starts} starts ({handed} handed back) with max_attempts "
                                   f"{allowed}"))  # fmt: skip
        found += _numbers_past(task_id, history, allowed)
        for entry in history:
            match = RETRY_LABEL.match(entry.reason or "")
            if match is None:
                continue
            n, m = int(match["n"]), int(match["m"])
            if m != allowed or n > m:
                found.append(Violation("attempts_exceeded", task_id,
                                       f"v{entry.version} {entry.reason!r}: its own policy "
                                       f"allows {allowed} attempts"))  # fmt: skip
    return found


def _numbers_past(task_id: str, history: Sequence[Transition], allowed: int) -> list[Violation]:
    """A start numbered past ``allowed`` attempts (a retry by hand allows one more)."""
    found, by_hand = [], 0
    for entry in history:
        by_hand += bool(BY_HAND.match(entry.reason or ""))
        match = START.match(entry.reason or "")
        if match is not None and int(match["attempt"]) > allowed + by_hand:
            hand = f" and {by_hand} retries by hand" if by_hand else ""
            found.append(Violation("attempts_exceeded", task_id,
                                   f"v{entry.version} {entry.reason!r}: max_attempts "
                                   f"{allowed}{hand}"))  # fmt: skip
    return found


def retries_by_cause(histories: Mapping[str, Sequence[Transition]]) -> dict[str, int]:
    """How many policy retries each cause had (``failed (Flaky)``, ``lost``, ``timed out``)."""
    counts: dict[str, int] = defaultdict(int)
    for entry in itertools.chain.from_iterable(histories.values()):
        match = RETRY_LABEL.match(entry.reason or "")
        if match is not None:
            counts[match["why"]] += 1
    return dict(sorted(counts.items()))


# -- timeouts ---------------------------------------------------------------------------------


def attempt_spans(
    history: Sequence[Transition], until: float | None = None
) -> list[tuple[int, float, float | None, Transition | None]]:
    """``(attempt, start, end, end entry)`` of each started attempt: from its start entry to
    the first entry that leaves ``RUNNING``/``PAUSED`` (a pause does not stop a timeout's
    clock); an attempt that never left ends at ``until`` (``None``: unknown)."""
    spans = []
    for i, entry in enumerate(history):
        match = START.match(entry.reason or "") if _is_start(entry) else None
        if match is None:
            continue
        end = next((e for e in history[i + 1 :] if e.to_status not in HOLDING), None)
        stop = end.at.timestamp() if end is not None else until
        spans.append((int(match["attempt"]), entry.at.timestamp(), stop, end))
    return spans


def check_timeouts(
    histories: Mapping[str, Sequence[Transition]],
    timeouts: Mapping[str, float | None],
    slack: float,
    *,
    until: float | None = None,
    tolerance: float = CLOCKS,
    stalls: Sequence[tuple[float, float]] = (),
) -> list[Violation]:
    """``timeout_overrun``: an attempt of a task with a ``timeout`` (``timeouts[task]``)
    held ``RUNNING`` (or ``PAUSED``) longer than ``timeout + slack`` (the harness's bound:
    ``timeout_grace + reconcile_interval + task_lease``, docs/reliability.md), plus the part
    of its span that overlaps a ``stalls`` window (wall-clock times the store's writers could
    not write: on SQLite a worker SIGSTOPped inside a write transaction holds the one write
    lock, so no end can be written until it goes on). An attempt still held at the end of its
    history counts until ``until`` (when the workers were stopped), if given."""
    found = []
    for task_id, history in histories.items():
        timeout = timeouts.get(task_id)
        if timeout is None:
            continue
        for attempt, start, stop, end in attempt_spans(history, until):
            if stop is None:
                continue
            stalled = sum(max(0.0, min(stop, b) - max(start, a)) for a, b in stalls)
            bound = timeout + slack + stalled
            if stop - start <= bound + tolerance:
                continue
            how = f"until {end.to_status}" if end is not None else "and was never ended"
            waited = f" + {stalled:.2f}s stalled" if stalled else ""
            found.append(Violation("timeout_overrun", task_id,
                                   f"attempt {attempt} held {stop - start:.2f}s {how}: past "
                                   f"its timeout {timeout:g}s + {slack:g}s{waited}"))  # fmt: skip
    return found


# -- retention --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """A task the change feed shows removed (a tombstone)."""

    task_id: str
    removed_at: float  # the tombstone's stamp (the remover's clock)
    #: by when it was certainly removed: the server time of the feed read that first showed
    #: the tombstone (``None``: never watched)
    seen_by: float | None
    #: ``updated_at + retention`` of its last snapshot seen before it was removed (``None``:
    #: none seen): its expiry when that snapshot was final, else a lower bound of it (the task
    #: finished later)
    expires: float | None
    final: bool = True  # ``expires`` is from a final snapshot (exact)


def removal_of(
    task_id: str,
    removed_at: float,
    seen_by: float | None,
    last: TaskSnapshot | None,
) -> Removal:
    """The :class:`Removal` of a tombstone, from the last snapshot seen of its task."""
    if last is None or last.retention is None:
        return Removal(task_id, removed_at, seen_by, None)
    expires = last.updated_at.timestamp() + last.retention
    return Removal(task_id, removed_at, seen_by, expires, last.status.is_terminal)


def check_removals(removals: Iterable[Removal], tolerance: float = CLOCKS) -> list[Violation]:
    """``removed_early``: a task removed before its expiry (``expires``): by the tombstone's
    own stamp, or by the feed read that first showed it (the server's time, whatever the
    remover's clock said). Removals with no snapshot seen are not judged."""
    found = []
    for r in removals:
        if r.expires is None:
            continue
        removed = min(r.removed_at, r.seen_by if r.seen_by is not None else math.inf)
        if removed < r.expires - tolerance:
            bound = "its expiry" if r.final else "the earliest expiry it could have"
            found.append(Violation("removed_early", r.task_id,
                                   f"removed {r.expires - removed:.2f}s before {bound} "
                                   f"(stamped {_hms(r.removed_at)}, seen by "
                                   f"{_hms(r.seen_by)})"))  # fmt: skip
    return found


def expiry_lag(removals: Iterable[Removal]) -> float | None:
    """The longest wait from an exact expiry to the removal's stamp (a liveness measure)."""
    lags = [r.removed_at - r.expires for r in removals if r.final and r.expires is not None]
    return round(max(lags), 3) if lags else None


# -- unique ids -------------------------------------------------------------------------------


def unfinished_intervals(history: Sequence[Transition]) -> list[tuple[float, float]]:
    """``[from, to)`` while the task was not final, by its history's times (``to`` is
    infinite while it still is). An end and the retry written with it (``LOST`` then
    ``PENDING`` at one instant) leave one interval."""
    intervals: list[tuple[float, float]] = []
    since: float | None = None
    for entry in sorted(history, key=lambda e: e.version):
        at = entry.at.timestamp()
        if not entry.to_status.is_terminal:
            if since is None:  # reopened at the instant it ended: the same interval
                since = intervals.pop()[0] if intervals and intervals[-1][1] == at else at
        elif since is not None:
            intervals.append((since, at))
            since = None
    if since is not None:
        intervals.append((since, math.inf))
    return intervals


def check_unique_overlaps(
    histories: Mapping[str, Sequence[Transition]],
    uniques: Mapping[str, str | None],
    acked_at: Mapping[str, float],
    tolerance: float = CLOCKS,
) -> list[Violation]:
    """``unique_duplicates``: two tasks of one unique id unfinished at once. Task B's create
    landed between its ``created_at`` and its submit's acknowledgement (``acked_at[B]``;
    ``created_at`` when unknown); task A certainly held the id from its own acknowledgement
    until its first end (an end's entry is written at or after its time). B is reported when
    its whole create window lies in A's: created after A's create was acknowledged, and
    acknowledged before A's first end (less ``tolerance``)."""
    by_unique: dict[str, list[str]] = defaultdict(list)
    for task_id, unique in uniques.items():
        if unique is not None and histories.get(task_id):
            by_unique[unique].append(task_id)
    found = []
    for unique, tasks in sorted(by_unique.items()):
        for a, b in itertools.permutations(sorted(tasks), 2):
            held = unfinished_intervals(histories[a])
            created_b = min(e.at.timestamp() for e in histories[b])
            if not held:
                continue
            since = max(held[0][0], acked_at.get(a, held[0][0]))
            landed_by = acked_at.get(b, created_b)
            if since < created_b and landed_by < held[0][1] - tolerance:
                end = "never" if math.isinf(held[0][1]) else f"{held[0][1] - landed_by:.2f}s later"
                found.append(Violation("unique_duplicates", b,
                                       f"created with unique {unique!r} while {a} held it "
                                       f"(held from {_hms(since)}, ended {end})"))  # fmt: skip
    return found


@dataclass(frozen=True)
class UniqueSubmit:
    """An acknowledged unique submit, from the driver's log."""

    task_id: str  # the id it asked for
    unique: str
    returned: str  # the id it returned: ``task_id`` (created) or the holder's
    sent_at: float  # the driver's clock before its first try
    acked_at: float  # ... and when it returned

    @property
    def created(self) -> bool:
        return self.returned == self.task_id


def unique_submits(records: Iterable[Mapping[str, Any]]) -> list[UniqueSubmit]:
    """The acknowledged unique submits of a driver log (``producer.submit_until_known``)."""
    return [
        UniqueSubmit(r["id"], r["unique"], r["returned"], r["sent_at"], r["acked_at"])
        for r in records
        if r.get("op") == "submit" and r.get("outcome") == "ok" and r.get("unique")
    ]


@dataclass(frozen=True)
class TaskSpan:
    """What is known of a task a unique submit may name: its unique id, when it was created,
    and by when its write of a final status had certainly landed (the first read that showed
    it final; ``None``: never seen final)."""

    unique: str | None
    created_at: float
    final_by: float | None


def check_unique_submits(
    submits: Iterable[UniqueSubmit], tasks: Mapping[str, TaskSpan], tolerance: float = CLOCKS
) -> list[Violation]:
    """``unique_orphans`` (the submits): an acknowledged unique submit created its task (the
    id it asked for, holding the unique id) or returned a task that held the id then: one of
    that unique id, created before the submit returned, not certainly final before it was
    sent. A returned id nobody knows is reported too."""
    found = []
    for s in submits:
        task = tasks.get(s.returned)
        what = "created" if s.created else f"returned {s.returned}"
        if task is None:
            detail = f"unique {s.unique!r}: {what}, which no record shows"
            found.append(Violation("unique_orphans", s.task_id, detail))
        elif task.unique != s.unique:
            found.append(Violation("unique_orphans", s.task_id,
                                   f"unique {s.unique!r}: {what}, which holds "
                                   f"{task.unique!r}"))  # fmt: skip
        elif not s.created and task.created_at > s.acked_at + tolerance:
            found.append(Violation("unique_orphans", s.task_id,
                                   f"unique {s.unique!r}: returned {s.returned}, created "
                                   f"{task.created_at - s.acked_at:.2f}s after the submit "
                                   f"returned"))  # fmt: skip
        elif not s.created and task.final_by is not None and task.final_by < s.sent_at - tolerance:
            found.append(Violation("unique_orphans", s.task_id,
                                   f"unique {s.unique!r}: returned {s.returned}, final "
                                   f"{s.sent_at - task.final_by:.2f}s before the submit was "
                                   f"sent"))  # fmt: skip
    return found


def check_unique_holders(
    holders: Mapping[str, str | None], finals: Mapping[str, TaskSnapshot | None]
) -> list[Violation]:
    """``unique_orphans`` (the records, at the end): ``unique_holder(u)`` names an unfinished
    task whose ``unique`` is ``u``, and is ``None`` only when no task of ``u`` is unfinished
    (finished and removed tasks hold nothing)."""
    live: dict[str, list[str]] = defaultdict(list)
    for task_id, snap in finals.items():
        if snap is not None and snap.unique is not None and not snap.status.is_terminal:
            live[snap.unique].append(task_id)
    found = []
    for unique, holder in sorted(holders.items()):
        if holder is None:
            if live.get(unique):
                found.append(Violation("unique_orphans", unique,
                                       f"no record, but {sorted(live[unique])} unfinished "
                                       f"hold it"))  # fmt: skip
            continue
        snap = finals.get(holder)
        if snap is None or snap.unique != unique or snap.status.is_terminal:
            state = "gone" if snap is None else f"{snap.status} holding {snap.unique!r}"
            found.append(Violation("unique_orphans", unique,
                                   f"the record names {holder}, {state}"))  # fmt: skip
    return found
