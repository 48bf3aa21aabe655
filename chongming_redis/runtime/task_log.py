"""The worker's line per task start and end (logger ``chongming_redis.runtime.tasks``):
``task <id> <name> started (attempt 1)``, ``task <id> <name> succeeded in 12.3 ms``, and
``failed``/``stopped``/``lost`` with the reason. Built only when the level is enabled."""

from __future__ import annotations

import logging
import time

from chongming_redis.runtime.held import Held

task_log = logging.getLogger("chongming_redis.runtime.tasks")


def log_started(held: Held) -> None:
    if task_log.isEnabledFor(logging.INFO):
        snapshot = held.snapshot
        _emit(logging.INFO, "task %s %s started (attempt %d)",
              snapshot.task_id, snapshot.name, snapshot.attempt)  # fmt: skip


def log_ended(held: Held, level: int, how: str, started: float, detail: str | None = None) -> None:
    """``task <id> <name> succeeded in 12.3 ms`` (``: <detail>`` after a failure or loss)."""
    if task_log.isEnabledFor(level):
        ms = (time.monotonic() - started) * 1000
        snapshot = held.snapshot
        suffix = "" if detail is None else f": {detail}"
        _emit(level, "task %s %s %s in %.1f ms%s", snapshot.task_id, snapshot.name, how, ms, suffix)


def _emit(level: int, message: str, *args: object) -> None:
    """``task_log.log`` without its walk up the stack to find the caller (``findCaller``:
    about 2 us of the 6 a record costs, twice per task; these lines always come from here)."""
    task_log.handle(task_log.makeRecord(task_log.name, level, __file__, 0, message, args, None))
