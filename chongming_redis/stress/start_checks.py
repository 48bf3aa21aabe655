"""Checkers of the start path over a stress run's histories (docs/reliability.md): no start
before its ``not_before``, never more tasks ``RUNNING`` on a worker than its slots, no due task
waiting while a worker has a free slot for longer than one start interval, and the start order
within the buckets one worker serves. Plain data in, :class:`Violation` out, as the other
checkers (``stress/checkers.py``)."""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress.checkers import START, Violation, new_highs

RETRY_DELAY = re.compile(r"^retry .*, in (?P<seconds>\d+(?:\.\d+)?)s$")
#: The reason of an end written because an attempt ran past its timeout without stopping at a
#: checkpoint (``runtime/timeouts.py``, ``runtime/reconcile.py``).
TIMED_OUT = "timed out"


def _is_start(entry: Transition) -> bool:
    return entry.from_status is TaskStatus.PENDING and entry.to_status is TaskStatus.RUNNING


def check_not_before(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    tolerance: float = 0.5,
) -> list[Violation]:
    """No start before its ``not_before`` (the times are the server's: the workers' clocks
    follow it, each through its own estimate of the server's TIME, which a reply the fault
    proxy delays skews until the next resync — the policy checks' ``CLOCKS`` tolerance, hence
    ``tolerance``: the retry entry and the start are two workers' estimates). A retry's is its
    entry's time plus the delay its reason gives (``in 1.500s``); a submitted delay is the
    final snapshot's ``not_before``, checked for a task started once."""
    found = []
    for task_id, history in histories.items():
        starts = [i for i, e in enumerate(history) if _is_start(e)]
        final = finals.get(task_id)
        for i in starts:
            due = None
            before = history[i - 1] if i > 0 else None
            match = RETRY_DELAY.match(before.reason or "") if before is not None else None
            if match is not None:
                due = before.at.timestamp() + float(match["seconds"])  # type: ignore[union-attr]
            elif submitted_delay_applies(history, final):
                due = final.not_before.timestamp()  # type: ignore[union-attr]
            if due is not None and history[i].at.timestamp() < due - tolerance:
                early = (
                    f"v{history[i].version} started {due - history[i].at.timestamp():.3f}s early"
                )
                found.append(Violation("early_starts", task_id, early))
    return found


def submitted_delay_applies(history: Sequence[Transition], final: TaskSnapshot | None) -> bool:
    """Whether the final snapshot's ``not_before`` is the submit's and governed the task's one
    start: started once and never sent back to ``PENDING`` after (a retry, a hand-back, a
    resume would have set or kept another one), nor retried into ``PAUSED`` (a paused task
    found ``LOST`` is retried paused, with a ``not_before`` of its own: CI met such a task,
    then stopped, judged against its retry's time)."""
    if final is None or final.not_before is None:
        return False
    starts = [i for i, e in enumerate(history) if _is_start(e)]
    if len(starts) != 1:
        return False
    after = history[starts[0] + 1 :]
    return not any(
        e.to_status is TaskStatus.PENDING or RETRY_DELAY.match(e.reason or "") for e in after
    )


def _held_spans(
    histories: Mapping[str, Sequence[Transition]],
) -> Iterator[tuple[str, str, float, Transition | None]]:
    """Each attempt's ``(owner, task, start, end entry)``: from its start entry to the entry
    that moved the task out of ``RUNNING``/``PAUSED`` (a paused task keeps its slot), ``None``
    when it never left."""
    holding = (TaskStatus.RUNNING, TaskStatus.PAUSED)
    for task_id, history in histories.items():
        for i, entry in enumerate(history):
            match = START.match(entry.reason or "") if _is_start(entry) else None
            if match is not None:
                end = next((e for e in history[i + 1 :] if e.to_status not in holding), None)
                yield match["owner"], task_id, entry.at.timestamp(), end


def running_intervals(
    histories: Mapping[str, Sequence[Transition]],
) -> dict[str, list[tuple[float, float, str]]]:
    """Per owner, ``(start, end, task)`` of each attempt it ran (``_held_spans``). Attempts that
    ended ``LOST`` (written by a reconciler when the holder was gone) or never ended are left
    out: their end is not when the holder let the slot go."""
    held: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for owner, task_id, start, end in _held_spans(histories):
        if end is not None and end.to_status is not TaskStatus.LOST:
            held[owner].append((start, end.at.timestamp(), task_id))
    return held


def check_slots(
    histories: Mapping[str, Sequence[Transition]], slots: int, tolerance: float = 0.005
) -> list[Violation]:
    """Never more tasks ``RUNNING`` (or ``PAUSED``) on one worker than it has slots, from the
    history's own times: an end within ``tolerance`` after a start counts as before it (the
    two come from one process's clock, which follows the server's in small steps)."""
    found = []
    for owner, intervals in running_intervals(histories).items():
        events = [(start, 1, task) for start, _, task in intervals]
        events += [(end - tolerance, -1, task) for _, end, task in intervals]
        for at, running, task in new_highs(events):
            if running > slots:
                found.append(Violation("slots_exceeded", task,
                                       f"{owner} had {running} tasks RUNNING with {slots} slots "
                                       f"at {at:.3f}"))  # fmt: skip
    return found


def due_since(history: Sequence[Transition], i: int, final: TaskSnapshot | None) -> float | None:
    """When the attempt started by ``history[i]`` became due: the entry that made it
    ``PENDING`` (a submit, a retry, a resume, a hand-back), or the not_before after it (a
    retry's delay, a submitted delay for a task started once); ``None`` when unknown."""
    if i == 0:
        return None
    before = history[i - 1]
    due = before.at.timestamp()
    match = RETRY_DELAY.match(before.reason or "")
    if match is not None:
        return due + float(match["seconds"])
    if final is not None and final.not_before is not None:
        if not submitted_delay_applies(history, final):
            return None
        return max(due, final.not_before.timestamp())
    return due


def check_work_conservation(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    slots: int,
    interval: float,
    quiet: Callable[[float, float], bool] = lambda since, until: True,
    slack: float = 0.5,
) -> list[Violation]:
    """No due task waits while a worker of the pool has a free slot, for longer than one
    start interval: a task due at ``d`` and started at ``s`` is a violation when some worker
    started a task at ``u`` with ``d + interval + slack <= u <= s - slack`` and still had a
    free slot after it (a start round with room left takes due work from every bucket: its
    own, then the others', ``Runner.start_available``). ``quiet(since, until)``: no fault in
    that window (a stopped worker or a dropped connection may hold a start back). A task with
    limits is not judged: its limit may hold it back by design (``limit_checks`` judge it),
    while the tasks beside it, held back by nothing, still are."""
    occupancy = _occupancy(histories)
    found = []
    for task_id, history in histories.items():
        final = finals.get(task_id)
        if final is not None and final.limits:
            continue
        for i, entry in enumerate(history):
            if not _is_start(entry):
                continue
            due = due_since(history, i, final)
            started = entry.at.timestamp()
            if due is None or started - due <= interval + 2 * slack or not quiet(due, started):
                continue
            for owner, starts in occupancy.items():
                idle = next((u for u, busy in starts
                             if due + interval + slack <= u <= started - slack and busy < slots),
                            None)  # fmt: skip
                if idle is not None:
                    detail = (f"due for {started - due:.2f}s while {owner} had a free slot "
                              f"after a start {idle - due:.2f}s in")  # fmt: skip
                    found.append(Violation("idle_slot_waits", task_id, detail))
                    break
    return found


def _occupancy(histories: Mapping[str, Sequence[Transition]]) -> dict[str, list[tuple[float, int]]]:
    """Per owner, each start time and how many tasks the owner held right after it (attempts
    that ended LOST or never ended count as held to the end: the safe side; so do attempts
    ended by a timeout without a checkpoint, ``TIMED_OUT``: their thread, which cannot be
    killed, keeps its slot until it returns, after the end entry)."""
    held: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for owner, _, start, end in _held_spans(histories):
        if (
            end is None
            or end.to_status is TaskStatus.LOST
            or (end.reason or "").startswith(TIMED_OUT)
        ):
            held[owner].append((start, float("inf")))
        else:
            held[owner].append((start, end.at.timestamp()))
    return {
        owner: [(start, sum(1 for s, e in spans if s <= start < e)) for start, _ in spans]
        for owner, spans in held.items()
    }


# -- the start order ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Start:
    at: float  # the start entry's time (its starter's now)
    task_id: str
    priority: int
    ready: float | None  # the time the start order ranks it by (None: not known)
    due: float | None  # when it became due (``due_since``; None: not known)


def check_start_order(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    tolerance: float = 1.0,
    quiet: Callable[[float, float], bool] = lambda since, until: True,
) -> list[Violation]:
    """``start_order``: within one bucket, one worker starts due tasks in the start order —
    higher ``priority`` first, then the earlier ready time (``max(created_at, not_before)``,
    the score of ``lib/indexes.start_score``). A violation: worker O started X from bucket b
    while Y, due in b since before X's start and ahead of X in that order, waited, and O
    started Y later (O owned b at both starts, so Y was in the queues X's start read: the
    order is exact within the buckets one worker serves, approximate across workers, and only
    that is judged). An entry's time is its writer's ``now``, read before its call landed: a
    call that waited (for a restarting server, behind a stopped worker's lock, on a loaded
    machine) lands later, so ``tolerance`` (1 s: the clocks' error and a loaded machine's
    delays) applies to the times and to ready times compared at one priority, and a pair with
    a fault between Y's due time and X's start (``quiet``) is not judged. A ready time the
    history cannot give (after a hand-back or a resume of a retried task) is compared on
    priority alone. A task with limits is not judged as the one left waiting: its limit may
    hold it back by design."""
    groups: dict[tuple[str, int], list[_Start]] = defaultdict(list)
    for task_id, history in histories.items():
        final = finals.get(task_id)
        if final is None:
            continue
        for i, entry in enumerate(history):
            match = START.match(entry.reason or "") if _is_start(entry) else None
            if match is not None:
                start = _Start(entry.at.timestamp(), task_id, final.priority,
                               _ready(history, i, final), due_since(history, i, final))  # fmt: skip
                groups[(match["owner"], final.bucket)].append(start)
    found = []
    for (owner, bucket), group in groups.items():
        group.sort(key=lambda s: s.at)
        times = [s.at for s in group]
        for waited in group:
            final = finals.get(waited.task_id)
            if waited.due is None or (final is not None and final.limits):
                continue
            first = bisect.bisect_right(times, waited.due + tolerance)
            last = bisect.bisect_left(times, waited.at - tolerance)
            passed = next((x for x in group[first:last] if _ahead(waited, x, tolerance)
                           and quiet(waited.due, x.at)), None)  # fmt: skip
            if passed is not None:
                found.append(Violation("start_order", waited.task_id,
                                       f"priority {waited.priority}, due since "
                                       f"{waited.due:.3f}, started by {owner} at "
                                       f"{waited.at:.3f}; {passed.task_id} (priority "
                                       f"{passed.priority}) of bucket {bucket} was started "
                                       f"before it at {passed.at:.3f}"))  # fmt: skip
    return found


def _ahead(first: _Start, then: _Start, tolerance: float) -> bool:
    """Whether ``first`` comes before ``then`` in the start order, beyond the tolerance."""
    if first.priority != then.priority:
        return first.priority > then.priority
    if first.ready is None or then.ready is None:
        return False
    return first.ready < then.ready - tolerance


def _ready(history: Sequence[Transition], i: int, final: TaskSnapshot) -> float | None:
    """The ready time the start at ``history[i]`` was ranked by: its ``not_before`` when a
    retry's delay set it (the entry before the start), else its ``created_at`` while no
    ``not_before`` was ever set (no delayed retry before it, no submitted delay); else None."""
    before = history[i - 1] if i > 0 else None
    match = RETRY_DELAY.match(before.reason or "") if before is not None else None
    if match is not None and before is not None:
        return before.at.timestamp() + float(match["seconds"])
    delayed = any(RETRY_DELAY.match(e.reason or "") for e in history[:i])
    if delayed or final.not_before is not None:
        return None
    return final.created_at.timestamp()
