"""UNSAFE, the ``two-step-save`` negative control (``CHONGMING_STRESS_UNSAFE``; ``install``
runs in the worker processes only, from ``stress/app.py``): a Redis store whose
compare-and-set is done in two steps.

``save`` reads the task, compares its version with the one expected (``ConcurrencyConflict``
when they differ, as the real save), sleeps ``PAUSE`` — the window between a check and its
write — and then writes blindly, against whatever version is stored by then: two writers that
both read version ``v`` both succeed, the second overwriting the first (at a version past the
first's, as a save must go forward). The store also loses its batched calls
(``commit_tasks``, ``commit_and_start``, ``start_tasks``: scripts that compare and write in one
atomic step), so the workers' runtime moves every task with ``save``, its path for a store
without batching (``StoreAdapter.commit`` and ``start``): each start and each end of a task
is a two-step save. A worker's start loop and its group committer both start tasks, and the
faults hand tasks between workers, so two writers meet on one task within the window.

What must catch it: the linearizability check (two saves from one version both acknowledged
cannot be ordered), and the start checkers where both writers started the task.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores.redis import RedisTaskStore

#: Seconds between the check and the write.
PAUSE = 0.05
#: The atomic calls the control takes away (the runtime then uses ``save``).
BATCHED = ("commit_tasks", "commit_and_start", "start_tasks")


def two_step(atomic_save: Callable[..., None]) -> Callable[..., None]:
    """``save`` done as read, compare, pause, blind write, on top of ``atomic_save`` (the
    store's own save, used for the write against the version stored at that moment)."""

    def save(self: RedisTaskStore, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        current = self.get(snapshot.task_id)
        actual = None if current is None else current.status_version
        if actual != expect_version:
            raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)
        time.sleep(PAUSE)
        stored = self.get(snapshot.task_id)  # the blind write: whatever is there now
        if stored is None:  # removed meanwhile: nothing left to overwrite
            raise ConcurrencyConflict(snapshot.task_id, expect_version, None)
        version = max(snapshot.status_version, stored.status_version + 1)
        atomic_save(self, dataclasses.replace(snapshot, status_version=version),
                    expect_version=stored.status_version)  # fmt: skip

    return save


def install() -> None:
    """Make this process's Redis stores two-step savers without batched calls."""
    RedisTaskStore.save = two_step(RedisTaskStore.save)  # type: ignore[method-assign]
    for name in BATCHED:  # from the class that defines it (a mixin of the Redis store)
        for defining in RedisTaskStore.__mro__:
            if name in vars(defining):
                delattr(defining, name)
