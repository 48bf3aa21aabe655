"""``CommitStartStore``: a group commit and the starts into the slots it frees, in one step.

A worker's slot may take its next task only once its last task's end is written (a task is
``RUNNING`` only while a slot runs it). With ``commit_tasks`` then ``start_tasks``, a slot waits
for two round trips between two tasks; a store with ``commit_and_start`` does both in one
atomic call, so it waits for one. The runtime uses it where the store has it
(``runtime/store_adapter.StoreAdapter.commit_and_start``; else the two calls, in order)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot, Transition

#: ``BatchingStore.commit_tasks``' item (``stores/extensions.CommitItem``, which imports this).
CommitItem = tuple[TaskSnapshot, int | None, Sequence[Transition]]
#: The methods ``extensions_of`` looks for.
COMMIT_START_METHODS = ("commit_and_start",)


@runtime_checkable
class CommitStartStore(Protocol):
    def commit_and_start(
        self,
        items: Sequence[CommitItem],
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> tuple[list[StoreError | None], list[TaskSnapshot] | StoreError]:
        """``commit_tasks(items)``, then ``start_tasks(owner=..., ...)`` with its ``limit``
        capped at the number of items the commit moved out of ``RUNNING`` (written now, or
        by the call this one retries), in one atomic step: nothing another client does comes
        between them, and the store never holds more ``RUNNING`` tasks than before the call.
        Returns the commit's per-item results (as ``commit_tasks``) and the started tasks (as
        ``start_tasks``), or the ``StoreError`` the start met in their place (the commit
        stands, nothing was started). An error of the commit's (bad items, a corrupt record)
        raises for the whole call, and then nothing is written or started. The arguments are
        checked as those two methods check theirs."""
        ...
