"""Checkers of the task limits (issue 26, ``chongming_redis.limits``) over a stress run's
records (docs/reliability.md): never more attempts of one concurrency ref holding a slot at
once than its ``max`` (``limit_overruns``), no holder entry left naming a task that holds no
slot once the run is quiet (``stale_holders``), and never more starts of one rate ref in a
window than its token bucket allows (``rate_overruns``). Plain data in, :class:`Violation`
out, as the other checkers (``stress/checkers.py``); ``stress/test_limit_checks.py`` trips
each on hand-made records.

**When an attempt certainly held its slot.** The store keeps ``{ns}:lh:<ref>``, the tasks
``RUNNING``/``PAUSED`` naming ``<ref>``, in the script of every write that moves a task, and a
start admits a task only while that set is below ``max``. An attempt is in the set from the
landing of its start to the landing of the first write that moves it out of
``RUNNING``/``PAUSED`` (its end, a hand-back, or the ``LOST`` a reconciler writes once its
killed holder's lease ran out: until then its entry stays and its slot is taken). So at the
landing of each start fewer than ``max`` such attempts were open, and never more than ``max``
are open at once **in the server's order of the writes**. The times we have are not that
order, and the bound uses only what each time proves:

* a history entry's ``at`` is its writer's clock (which follows the server's within
  ``CLOCKS``), read when the move was *decided*, before the write landed: the end of an
  attempt landed at or after ``end.at - tolerance``; but a start may land long after its
  ``at`` (the starter read ``now``, then a SIGSTOP, a delayed or dropped reply and its retry
  held the call back for seconds), so a start's ``at`` bounds nothing from above, and
  intervals from it would make a correct store trip the check;
* the limited types record the server's ``TIME`` when their function begins
  (``app.began_key``: ``<task>|<attempt>|<s>|<us>``), which is after the start landed.

An attempt is counted as holding from its function's begin to ``end.at - tolerance`` (to the
end of the records if it never left ``RUNNING``/``PAUSED``): inside the interval it really held
the slot, so a correct store never shows more than ``max`` at once; an attempt whose function
never began (killed in between) or whose end is a history gap is left out (``unjudged``).
Ties count the end first (a slot freed and taken at one instant is not two at once).

**Rate windows.** A rate ref's bucket counts on ``min(now, server TIME)`` and never moves its
clock back, so the clock a start spent its token at lies between ``start.at - tolerance`` and
the server's time at its landing (before its function began). In any window ``[a, b]`` of that
clock at most ``burst + rate * (b - a) / per`` tokens are spent; the check counts the starts
*certainly* in ``[a, b]`` (``at - tolerance >= a`` and began ``<= b``) and reports more than
that ``+ 1`` (the float's boundary).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from chongming_redis.limits import Concurrency, RateLimit, from_json, ref_limit_id
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress.checkers import START, Violation, new_highs

HOLDING = (TaskStatus.RUNNING, TaskStatus.PAUSED)
#: How far a writer's clock may be from the server's (``policy_checks.CLOCKS``).
CLOCKS = 0.5


@dataclass(frozen=True)
class Definitions:
    """The limits the run's app declares, by limit id (``App.limit_definitions``)."""

    concurrency: dict[str, Concurrency] = field(default_factory=dict)
    rates: dict[str, RateLimit] = field(default_factory=dict)

    @classmethod
    def parse(cls, definitions: Mapping[str, str]) -> Definitions:
        found = cls()
        for limit_id, text in definitions.items():
            limit = from_json(text)
            if isinstance(limit, Concurrency):
                found.concurrency[limit_id] = limit
            else:
                found.rates[limit_id] = limit
        return found


#: A run: ``(task, attempt, owner)`` (an attempt handed back runs again under another start).
Run = tuple[str, int, str]


def parse_began(records: Iterable[str | bytes]) -> dict[Run, float]:
    """``(task, attempt, owner) -> the earliest server time its function began`` from the
    app's ``<task>|<attempt>|<owner>|<s>|<us>`` records (a retried push repeats one; a later
    one is a looser bound)."""
    began: dict[Run, float] = {}
    for raw in records:
        text = raw.decode() if isinstance(raw, bytes) else raw
        task_id, attempt, owner, seconds, micros = text.rsplit("|", 4)
        at = int(seconds) + int(micros) / 1e6
        key = (task_id, int(attempt), owner)
        began[key] = min(at, began.get(key, math.inf))
    return began


@dataclass(frozen=True)
class Start:
    """One started attempt of a task with limits, with what its records prove."""

    task_id: str
    attempt: int
    at: float  # the start entry's time (its starter's now)
    began: float | None  # the server time its function began, None when it never did
    #: the time its end was decided (``None``: still holding at the end of its history;
    #: ``-inf``: unknown, a history gap)
    ended: float | None


def starts(history: Sequence[Transition], began: Mapping[Run, float]) -> list[Start]:
    """Each started attempt of one history: from its start entry to the first entry that
    leaves ``RUNNING``/``PAUSED`` (a paused task keeps its slot), read in version order; a
    version missing before that entry makes its end unknown."""
    entries = sorted(history, key=lambda e: e.version)
    found = []
    for i, entry in enumerate(entries):
        match = START.match(entry.reason or "")
        if entry.from_status is not TaskStatus.PENDING or entry.to_status is not TaskStatus.RUNNING:
            continue
        attempt, owner = (int(match["attempt"]), match["owner"]) if match else (-1, "")
        ended: float | None = None
        previous = entry.version
        for later in entries[i + 1 :]:
            if later.version != previous + 1:
                ended = -math.inf
                break
            previous = later.version
            if later.to_status not in HOLDING:
                ended = later.at.timestamp()
                break
        found.append(Start(entry.task_id, attempt, entry.at.timestamp(),
                           began.get((entry.task_id, attempt, owner)), ended))  # fmt: skip
    return found


@dataclass
class LimitResult:
    violations: list[Violation] = field(default_factory=list)
    #: per limit id, the most attempts of one of its refs certainly holding at once
    peaks: dict[str, int] = field(default_factory=dict)
    #: attempts left out: no begin recorded, or an end lost in a history gap
    unjudged: int = 0
    #: per rate limit id, the most starts certainly in one window over the window's bound
    rate_peaks: dict[str, float] = field(default_factory=dict)


def _refs_by_kind(
    finals: Mapping[str, TaskSnapshot | None], ids: Iterable[str]
) -> dict[str, list[str]]:
    """``ref -> its tasks`` for the refs of the limit ``ids``, from the tasks' frozen refs."""
    wanted, tasks = set(ids), defaultdict(list)
    for task_id, snap in finals.items():
        for ref in snap.limits if snap is not None else ():
            if ref_limit_id(ref) in wanted:
                tasks[ref].append(task_id)
    return tasks


def check_concurrency(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    began: Mapping[Run, float],
    definitions: Definitions,
    tolerance: float = CLOCKS,
    result: LimitResult | None = None,
) -> LimitResult:
    """``limit_overruns``: more attempts of one concurrency ref certainly holding a slot at
    one instant than its ``max`` (see the module's docstring for "certainly")."""
    result = result if result is not None else LimitResult()
    for ref, tasks in sorted(_refs_by_kind(finals, definitions.concurrency).items()):
        limit_id = ref_limit_id(ref)
        most = definitions.concurrency[limit_id].max
        events: list[tuple[float, int, str]] = []
        for task_id in tasks:
            for s in starts(histories.get(task_id, ()), began):
                if s.began is None or s.ended == -math.inf:
                    result.unjudged += 1
                    continue
                until = math.inf if s.ended is None else s.ended - tolerance
                if until > s.began:
                    events += [(s.began, 1, task_id), (until, -1, task_id)]
        worst = 0
        for at, holding, task_id in new_highs(events):
            worst = holding
            if holding > most:
                result.violations.append(Violation(
                    "limit_overruns", task_id,
                    f"{holding} tasks of {ref} held a slot at once with max {most} "
                    f"(at {at:.3f})"))  # fmt: skip
        result.peaks[limit_id] = max(result.peaks.get(limit_id, 0), worst)
    return result


def check_rates(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    began: Mapping[Run, float],
    definitions: Definitions,
    tolerance: float = CLOCKS,
    result: LimitResult | None = None,
) -> LimitResult:
    """``rate_overruns``: more starts of one rate ref certainly within a window ``[a, b]``
    of its bucket's clock than ``burst + rate * (b - a) / per + 1``; one violation per ref,
    its worst window."""
    result = result if result is not None else LimitResult()
    for ref, tasks in sorted(_refs_by_kind(finals, definitions.rates).items()):
        limit_id = ref_limit_id(ref)
        limit = definitions.rates[limit_id]
        assert limit.burst is not None
        spans = []  # (earliest, latest) clock its token was spent at
        for task_id in tasks:
            for s in starts(histories.get(task_id, ()), began):
                if s.began is None:
                    result.unjudged += 1
                else:
                    spans.append((s.at - tolerance, s.began))
        spans.sort(reverse=True)
        latest: list[float] = []  # the latest clocks of the spans from the current a on
        worst: tuple[float, int, float, float] | None = None  # (excess, n, a, b)
        for a, b_own in spans:
            bisect.insort(latest, b_own)
            for n, b in enumerate(latest, start=1):
                if b < a:
                    continue
                excess = n - (limit.burst + limit.rate * (b - a) / limit.period)
                if worst is None or excess > worst[0]:
                    worst = (excess, n, a, b)
        if worst is None:
            continue
        excess, n, a, b = worst
        result.rate_peaks[limit_id] = max(result.rate_peaks.get(limit_id, -math.inf),
                                          round(excess, 3))  # fmt: skip
        if excess > 1:
            bound = limit.burst + limit.rate * (b - a) / limit.period
            result.violations.append(Violation(
                "rate_overruns", ref,
                f"{n} starts within {b - a:.3f}s (from {a:.3f}); the bucket allows "
                f"{bound:.2f} (+1)"))  # fmt: skip
    return result


def check_holders(
    holders: Mapping[str, Iterable[str]],
    tasks: Mapping[str, TaskSnapshot | None],
    definitions: Definitions | None = None,
) -> list[Violation]:
    """``stale_holders``, once nothing writes: a holder entry (``{ns}:lh:<ref>`` members)
    naming a task that is gone, not ``RUNNING``/``PAUSED``, or does not name ``<ref>``; and
    (for the concurrency refs of ``definitions``) a task ``RUNNING``/``PAUSED`` under a ref
    whose holders miss it (a slot it takes that the start would not count). ``tasks``: every
    task a holder names, and every task of the run."""
    found = []
    for ref, members in sorted(holders.items()):
        for task_id in sorted(members):
            snap = tasks.get(task_id)
            if snap is None:
                why = "is gone"
            elif snap.status not in HOLDING:
                why = f"is {snap.status.value}"
            elif ref not in snap.limits:
                why = f"names {list(snap.limits)}, not {ref}"
            else:
                continue
            found.append(Violation("stale_holders", task_id, f"holds a slot of {ref} but {why}"))
    concurrency = definitions.concurrency if definitions is not None else {}
    for task_id, snap in sorted(tasks.items()):
        if snap is None or snap.status not in HOLDING:
            continue
        for ref in snap.limits:
            if ref_limit_id(ref) in concurrency and task_id not in set(holders.get(ref, ())):
                found.append(Violation("stale_holders", task_id,
                                       f"{snap.status.value} under {ref}, missing from its "
                                       f"holders"))  # fmt: skip
    return found
