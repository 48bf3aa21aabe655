"""Task types that wait with nobody to run them: due ``PENDING`` tasks older than a threshold.

With work conservation (``Runner.start_available``) a due task waits at most about one start
interval while any live worker that runs its type has a free slot; one that has waited for a
minute means no live worker runs its type (or every one is full). ``chongming-redis stats``
prints them and a worker logs a warning for the types it does not run itself, instead of
letting them wait in silence. Reads one query of the oldest ``PENDING`` tasks (bounded)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.stores.protocol import TaskStore

#: How long a due task waits before its type is reported.
log = logging.getLogger("chongming_redis.runtime")

STRANDED_AFTER = timedelta(seconds=60)
#: The oldest PENDING tasks one look reads.
LOOK_LIMIT = 1000


@dataclass(frozen=True)
class Stranded:
    """A task type with due ``PENDING`` tasks that waited past the threshold: how many of the
    tasks looked at, and how long the oldest has been due."""

    name: str
    waiting: int
    longest: timedelta


def stranded_types(
    store: TaskStore,
    now: datetime,
    *,
    after: timedelta = STRANDED_AFTER,
    ignore: Collection[str] = (),
    limit: int = LOOK_LIMIT,
) -> list[Stranded]:
    """The types (not in ``ignore``) of due ``PENDING`` tasks due for longer than ``after``,
    among the ``limit`` oldest ``PENDING`` tasks; longest waiting first."""
    query = TaskQuery(statuses=frozenset({TaskStatus.PENDING}), limit=limit)
    found: dict[str, list[timedelta]] = {}
    for task in store.query(query):
        if task.name in ignore:
            continue
        due = task.created_at if task.not_before is None else max(task.created_at, task.not_before)
        if now - due > after:
            found.setdefault(task.name, []).append(now - due)
    report = [Stranded(name, len(waits), max(waits)) for name, waits in found.items()]
    return sorted(report, key=lambda s: (-s.longest, s.name))


def describe(stranded: Stranded) -> str:
    """One line: ``7 pending tasks of type 'send' have been due for up to 95 s: ...``."""
    return (f"{stranded.waiting} pending task(s) of type {stranded.name!r} have been due for up "
            f"to {stranded.longest.total_seconds():.0f} s: no live worker seems to run this "
            "type (or every one is full)")  # fmt: skip


class StrandedWarnings:
    """A worker's warning, once a minute, for each task type it does not run whose due tasks
    have waited past ``STRANDED_AFTER`` (the reconcile tick calls ``tick``)."""

    def __init__(self, store: TaskStore, owner: str, runs: Collection[str]) -> None:
        self.store, self.owner, self.runs = store, owner, runs
        self._look_at = 0.0  # monotonic: the next look

    def tick(self, now: datetime) -> None:
        if time.monotonic() < self._look_at:
            return
        self._look_at = time.monotonic() + STRANDED_AFTER.total_seconds()
        for one in stranded_types(self.store, now, ignore=self.runs):
            log.warning("%s: %s", self.owner, describe(one))
