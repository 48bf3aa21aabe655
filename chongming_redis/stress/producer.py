"""The driver's submit, as a careful producer does it under faults.

A submit that ends in ``StoreError`` (Redis restarting longer than the store's own retries, a
reply lost) has an unknown outcome: the task may or may not exist. The producer tries again with
the same task id until it knows. ``TaskAlreadyExists`` after such an attempt means an earlier try
landed: the task is read back, and it counts as acknowledged only if it is there.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from chongming_redis.errors import StoreError, TaskAlreadyExists
from chongming_redis.runtime.controller import Controller

#: How long one task's submit keeps trying before it stays indeterminate.
PATIENCE_SECONDS = 30.0
PAUSE_SECONDS = 0.5


def start_options(driver: Controller, task_id: str) -> dict[str, Any]:
    """The start options of a task, from its id (the same on every retry of its submit):
    priorities from -5 to 5, and one task in eight delayed by 0.2-1.9 s, so the start order,
    the delayed queues and the "no start before not_before" check meet faults too."""
    h = zlib.crc32(task_id.encode())
    options: dict[str, Any] = {"priority": h % 11 - 5}
    if h % 8 == 0:
        options["not_before"] = driver.clock.now() + timedelta(seconds=0.2 + (h >> 3) % 18 / 10)
    return options


def submit_until_known(
    driver: Controller,
    task_id: str,
    params: dict[str, int],
    log: Callable[[dict[str, Any]], None],
    *,
    patience: float = PATIENCE_SECONDS,
) -> bool:
    """Submit ``step`` as ``task_id``; ``True`` once it is known to exist (acknowledged)."""
    deadline = time.monotonic() + patience
    unsure = False  # an earlier attempt may have created it
    while True:
        try:
            driver.submit("step", params, task_id=task_id, **start_options(driver, task_id))
        except TaskAlreadyExists as exc:
            if unsure and _exists(driver, task_id, deadline):
                log({"op": "submit", "id": task_id, "outcome": "ok", "after": "retry"})
                return True
            log({"op": "submit", "id": task_id, "outcome": "fail", "error": repr(exc)})
            return False
        except StoreError as exc:
            log({"op": "submit", "id": task_id, "outcome": "info", "error": str(exc)})
            if time.monotonic() + PAUSE_SECONDS > deadline:
                return False
            unsure = True
            time.sleep(PAUSE_SECONDS)
            continue
        except Exception as exc:  # a refused submit: nothing was written
            log({"op": "submit", "id": task_id, "outcome": "fail", "error": repr(exc)})
            return False
        log({"op": "submit", "id": task_id, "outcome": "ok"})
        return True


def _exists(driver: Controller, task_id: str, deadline: float) -> bool:
    """The task reads back (a read that fails is tried again until ``deadline``: the store that
    just said "already exists" may be restarting)."""
    while True:
        try:
            return driver.store.get(task_id) is not None
        except StoreError:
            if time.monotonic() + PAUSE_SECONDS > deadline:
                return False
            time.sleep(PAUSE_SECONDS)


def unacknowledged(records: list[dict[str, Any]], task_ids: set[str]) -> dict[str, Any]:
    """``{task id: its last submit log line}`` for the submits never acknowledged."""
    last = {r["id"]: r for r in records if r.get("op") == "submit" and r.get("id") in task_ids}
    return {task_id: last.get(task_id) for task_id in sorted(task_ids)}
