"""Checkers over the ground truth of a stress run, in plain Python (docs/reliability.md).

Inputs are plain data, so each checker can be unit-tested on hand-made histories:

* task histories: ``{task_id: [Transition, ...]}`` as the store returns them (written by the
  scripts atomically with every save/start: the server-side linearization per task);
* final snapshots: ``{task_id: TaskSnapshot | None}``;
* execution records: ``"<task>|<attempt>|<owner>|<nonce>"`` strings from the app's lists;
* the driver's client log: acknowledged submits and control calls;
* (the command lease audit has its own module: ``stress/lease_audit.py``).

Every checker returns a list of :class:`Violation`; a clean run has none.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition

START = re.compile(r"^started by (?P<owner>.+) \(attempt (?P<attempt>\d+)\)$")
#: The reasons of a hand-back (``TaskWriter.hand_back``): the run ends, its attempt does not —
#: the next start runs the same attempt again.
HAND_BACK = "handed back"
COMPLETIONS = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED})


@dataclass(frozen=True)
class Violation:
    kind: str  # duplicate_starts, duplicate_completions, double_claims, cas_chain, ...
    task_id: str
    detail: str


def new_highs(events: Iterable[tuple[float, int, str]]) -> Iterator[tuple[float, int, str]]:
    """Sweep ``(time, +1 or -1, task)`` events in time order (an end before a start at the
    same instant); yield ``(time, count, task)`` each time the count of what overlaps reaches a
    new high (the slot and limit checks: never more at once than a bound)."""
    count, worst = 0, 0
    for at, step, task in sorted(events):
        count += step
        if count > worst:
            worst = count
            yield at, count, task


def starts_per_attempt(history: Sequence[Transition]) -> Counter[int]:
    """PENDING -> RUNNING entries ``started by <owner> (attempt N)``, counted per N."""
    counts: Counter[int] = Counter()
    for entry in history:
        if entry.from_status is TaskStatus.PENDING and entry.to_status is TaskStatus.RUNNING:
            match = START.match(entry.reason or "")
            counts[int(match["attempt"]) if match else -1] += 1
    return counts


def hand_backs_per_attempt(history: Sequence[Transition]) -> Counter[int]:
    """Hand-backs (``handed back ...``), counted per attempt: the attempt of the start before
    each (a hand-back keeps the attempt, so the next start may run it again)."""
    counts: Counter[int] = Counter()
    attempt = -1
    for entry in history:
        match = START.match(entry.reason or "")
        if match is not None:
            attempt = int(match["attempt"])
        elif (entry.reason or "").startswith(HAND_BACK):
            counts[attempt] += 1
    return counts


def starts_per_run(history: Sequence[Transition]) -> Counter[tuple[int, str]]:
    """Start entries per run: ``(attempt, owner) -> starts``."""
    counts: Counter[tuple[int, str]] = Counter()
    for entry in history:
        match = START.match(entry.reason or "")
        if match is not None and entry.from_status is TaskStatus.PENDING:
            counts[(int(match["attempt"]), match["owner"])] += 1
    return counts


def check_starts(histories: Mapping[str, Sequence[Transition]]) -> list[Violation]:
    """At most one start per task attempt, and one more for each time it was handed back."""
    found = []
    for task_id, history in histories.items():
        handed = hand_backs_per_attempt(history)
        for attempt, n in sorted(starts_per_attempt(history).items()):
            if n > 1 + handed[attempt]:
                found.append(Violation("duplicate_starts", task_id,
                                       f"attempt {attempt} started {n} times, handed back "
                                       f"{handed[attempt]}"))  # fmt: skip
    return found


def check_completions(histories: Mapping[str, Sequence[Transition]]) -> list[Violation]:
    """At most one completion (SUCCEEDED/FAILED/STOPPED) per started attempt, and a task
    succeeds at most once."""
    found = []
    for task_id, history in histories.items():
        per_attempt: Counter[int] = Counter()
        attempt = 0
        successes = 0
        for entry in history:
            match = START.match(entry.reason or "")
            if entry.to_status is TaskStatus.RUNNING and match:
                attempt = int(match["attempt"])
            if entry.to_status in COMPLETIONS and entry.from_status in (
                TaskStatus.RUNNING,
                TaskStatus.PAUSED,
            ):
                per_attempt[attempt] += 1
            if entry.to_status is TaskStatus.SUCCEEDED:
                successes += 1
        for a, n in sorted(per_attempt.items()):
            if n > 1:
                found.append(
                    Violation("duplicate_completions", task_id, f"attempt {a} completed {n} times")
                )
        if successes > 1:
            found.append(
                Violation("duplicate_completions", task_id, f"succeeded {successes} times")
            )
    return found


def check_cas_chain(
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None] | None = None,
) -> list[Violation]:
    """Per task, the successful compare-and-sets form one chain: version 1 is the creation,
    versions strictly increase, no two successes from the same expected version (a fork shows
    as a repeated version or an entry whose ``from`` is not the previous ``to``), and the final
    snapshot's version equals the last history entry's."""
    found = []
    for task_id, history in histories.items():
        if not history:
            found.append(Violation("cas_chain", task_id, "no history"))
            continue
        entries = sorted(history, key=lambda e: e.version)
        if entries[0].version != 1:  # the creation entry (a second call of submit) is missing
            found.append(Violation("history_gaps", task_id, "no creation entry (v1)"))
        elif entries[0].from_status is not None:
            found.append(Violation("cas_chain", task_id, "v1 is not a creation"))
        versions = Counter(e.version for e in entries)
        for version, n in sorted(versions.items()):
            if n > 1:
                found.append(
                    Violation(
                        "cas_chain",
                        task_id,
                        f"{n} successes produced version {version} "
                        f"(from the same expected version {version - 1})",
                    )
                )
        for prev, entry in itertools.pairwise(entries):
            if entry.version == prev.version:
                continue
            if entry.version != prev.version + 1:
                # A missing entry: a transition whose history append (a separate call on the
                # submit/reconcile/retry paths) did not land. Not a double success.
                found.append(
                    Violation(
                        "history_gaps",
                        task_id,
                        f"no entry between v{prev.version} and v{entry.version}",
                    )
                )
            elif entry.from_status is not prev.to_status:
                found.append(
                    Violation(
                        "cas_chain",
                        task_id,
                        f"v{entry.version} moves from {entry.from_status} but v{prev.version} "
                        f"left it {prev.to_status}",
                    )
                )
        final = (finals or {}).get(task_id)
        last = entries[-1].version
        if final is not None and final.status_version < last:  # history ahead of the state
            found.append(
                Violation(
                    "cas_chain",
                    task_id,
                    f"snapshot v{final.status_version} but history ends at "
                    f"v{last}: an entry without its transition",
                )
            )
        elif final is not None and final.status_version > last:
            found.append(
                Violation(
                    "history_gaps",
                    task_id,
                    f"snapshot v{final.status_version}, history ends at v{last}",
                )
            )
        elif (
            final is not None and versions[last] == 1 and final.status is not entries[-1].to_status
        ):
            found.append(
                Violation(
                    "cas_chain",
                    task_id,
                    f"snapshot {final.status} but history ends in {entries[-1].to_status}",
                )
            )
    return found


def parse_records(records: Iterable[str | bytes]) -> dict[tuple[str, int, str], set[str]]:
    """``(task, attempt, owner) -> {nonce}``: each run's distinct executions (a retried push
    of the same record counts once). A run is one worker's start of an attempt: an attempt
    handed back runs again, under another start."""
    executions: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    for raw in records:
        text = raw.decode() if isinstance(raw, bytes) else raw
        task_id, attempt, owner, nonce = text.rsplit("|", 3)
        executions[(task_id, int(attempt), owner)].add(nonce)
    return executions


def check_executions(
    runs: Iterable[str | bytes],
    effects: Iterable[str | bytes],
    histories: Mapping[str, Sequence[Transition]] | None = None,
    unknown: Container[str] = (),
) -> list[Violation]:
    """Per run (a worker's start of an attempt: ``parse_records``): ``double_claims``, a run
    that began in more than one execution, or began where the history has no such start, or
    an attempt that began on more workers than one plus its hand-backs (``check_starts``' rule
    judged on the app's own records: two workers both running one attempt);
    ``duplicate_executions``, the fenced side effect of one run happened more than once, or
    for a run the history never started. The tasks in ``unknown`` (their history is gone:
    removed by their retention before anyone read it) are judged on the counts alone."""
    found = []
    began = parse_records(runs)
    found += _attempts_on_many_workers(began, histories, unknown)
    started = _RunsStarted(histories, unknown)
    for (task_id, attempt, owner), execs in sorted(began.items()):
        if len(execs) > 1:
            found.append(Violation("double_claims", task_id,
                                   f"attempt {attempt} on {owner} began {len(execs)} times: "
                                   f"{sorted(execs)}"))  # fmt: skip
        if started.never(task_id, attempt, owner):
            found.append(Violation("double_claims", task_id,
                                   f"attempt {attempt} began on {owner}, which the history "
                                   f"never started"))  # fmt: skip
    for (task_id, attempt, owner), execs in sorted(parse_records(effects).items()):
        if len(execs) > 1:
            found.append(Violation("duplicate_executions", task_id,
                                   f"attempt {attempt} on {owner}: fenced effect "
                                   f"{len(execs)} times"))  # fmt: skip
        if started.never(task_id, attempt, owner):
            found.append(Violation("duplicate_executions", task_id,
                                   f"effect of attempt {attempt} on {owner}, which the "
                                   f"history never started"))  # fmt: skip
    return found


def _attempts_on_many_workers(
    began: Mapping[tuple[str, int, str], set[str]],
    histories: Mapping[str, Sequence[Transition]] | None,
    unknown: Container[str],
) -> list[Violation]:
    workers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for task_id, attempt, owner in began:
        workers[(task_id, attempt)].add(owner)
    found, handed_by_task = [], {}
    for (task_id, attempt), owners in sorted(workers.items()):
        if histories is None or task_id in unknown:
            continue
        if task_id not in handed_by_task:
            handed_by_task[task_id] = hand_backs_per_attempt(histories.get(task_id, []))
        handed = handed_by_task[task_id][attempt]
        if len(owners) > 1 + handed:
            found.append(Violation("double_claims", task_id,
                                   f"attempt {attempt} began on {len(owners)} workers, handed "
                                   f"back {handed}: {sorted(owners)}"))  # fmt: skip
    return found


class _RunsStarted:
    """Whether the history started a run, each task's starts counted once (not per record)."""

    def __init__(self, histories: Mapping[str, Sequence[Transition]] | None,
                 unknown: Container[str]) -> None:  # fmt: skip
        self._histories, self._unknown = histories, unknown
        self._runs: dict[str, Counter[tuple[int, str]]] = {}

    def never(self, task_id: str, attempt: int, owner: str) -> bool:
        if self._histories is None or task_id in self._unknown:
            return False
        if task_id not in self._runs:
            self._runs[task_id] = starts_per_run(self._histories.get(task_id, []))
        return self._runs[task_id][(attempt, owner)] == 0


def check_durability(
    acknowledged: Iterable[str], present: Mapping[str, object | None], kind: str = "task"
) -> list[Violation]:
    """Every acknowledged write is there after the restarts."""
    return [
        Violation("acked_writes_lost", key, f"acknowledged {kind} missing after restarts")
        for key in acknowledged
        if present.get(key) is None
    ]


def check_commands(
    commands: Mapping[str, Mapping[str, str]],
    queued: Iterable[str] = (),
    leased: Iterable[str] = (),
) -> list[Violation]:
    """Raw command hashes (``id t k c lu f o``): an outcome is written only with
    ``finished_at``; a finished command is in neither the queue (``cq``) nor the lease index
    (``cl``), so it can never be claimed (and so completed) again."""
    found = []
    live = set(queued) | set(leased)
    for cid, fields in commands.items():
        if not fields:
            continue
        finished, outcome = fields.get("f"), fields.get("o")
        if outcome and not finished:
            found.append(Violation("command_state", cid, "outcome without finished_at"))
        if finished and cid in live:
            found.append(Violation("command_state", cid, "finished but still claimable"))
    return found


def count(violations: Iterable[Violation]) -> Counter[str]:
    return Counter(v.kind for v in violations)
