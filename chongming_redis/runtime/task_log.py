"""The worker's line per task start and end (logger ``chongming_redis.runtime.tasks``):
``task <id> <name> started (attempt 1)``, ``task <id> <name> succeeded in 12.3 ms``, and
``failed``/``stopped``/``lost`` with the reason. Built only when the level is enabled.

``TaskLog`` also tells the controller's ``WorkerEvents`` (metrics): a task's start and end are
counted exactly where its lines are written, so the two always agree."""

from __future__ import annotations

import logging
import time

from chongming_redis.runtime.events import Ending, WorkerEvents
from chongming_redis.runtime.held import Held

task_log = logging.getLogger("chongming_redis.runtime.tasks")

#: The level of each ending's line: a failure is a WARNING, a loss an ERROR.
LEVELS: dict[Ending, int] = {
    "succeeded": logging.INFO,
    "stopped": logging.INFO,
    "failed": logging.WARNING,
    "lost": logging.ERROR,
}


class TaskLog:
    """One per runner: the start and end of each task, to the log and to ``events``."""

    def __init__(self, events: WorkerEvents) -> None:
        self.events = events

    def started(self, held: Held) -> None:
        snapshot = held.snapshot
        self.events.task_started(snapshot.name)
        if task_log.isEnabledFor(logging.INFO):
            _emit(logging.INFO, "task %s %s started (attempt %d)",
                  snapshot.task_id, snapshot.name, snapshot.attempt)  # fmt: skip

    def ended(self, held: Held, ending: Ending, started: float, detail: str | None = None) -> None:
        """``task <id> <name> succeeded in 12.3 ms`` (``: <detail>`` after a failure or loss);
        ``started``: ``time.monotonic()`` when it started. A run this process handed back
        (``held.handed_back``) is counted as ``lost`` (its result is discarded) but has had its
        line already (``handed_back``): the task is not lost, it waits for its next attempt."""
        seconds = time.monotonic() - started
        snapshot = held.snapshot
        self.events.task_ended(snapshot.name, ending, seconds)
        level = LEVELS[ending]
        if task_log.isEnabledFor(level) and not (ending == "lost" and held.handed_back):
            suffix = "" if detail is None else f": {detail}"
            _emit(level, "task %s %s %s in %.1f ms%s", snapshot.task_id, snapshot.name, ending,
                  seconds * 1000, suffix)  # fmt: skip


def handed_back(held: Held, why: str) -> None:
    """``task <id> <name> handed back at shutdown: attempt 2 runs again (pending)`` (INFO),
    written when the hand-back is (the process may exit before the task's thread notices it).
    A hand-back keeps the attempt (``TaskWriter.hand_back``)."""
    snapshot = held.snapshot
    if task_log.isEnabledFor(logging.INFO):
        _emit(logging.INFO, "task %s %s handed back %s: attempt %d runs again (%s)",
              snapshot.task_id, snapshot.name, why, snapshot.attempt,
              snapshot.status.value)  # fmt: skip


def _emit(level: int, message: str, *args: object) -> None:
    """``task_log.log`` without its walk up the stack to find the caller (``findCaller``:
    about 2 us of the 6 a record costs, twice per task; these lines always come from here)."""
    task_log.handle(task_log.makeRecord(task_log.name, level, __file__, 0, message, args, None))
