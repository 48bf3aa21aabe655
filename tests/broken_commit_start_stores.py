"""Broken ``CommitStartStore`` stores: each a small subclass of ``InMemoryTaskStore`` whose
``commit_and_start`` breaks one rule of ``stores/commit_start.py``; ``CAUGHT_BY`` names the
``ExtensionsContract`` test (``testing/extensions/commit_start.py``) that must fail on it.
``test_extensions_teeth.py`` merges ``BROKEN``, ``CAUGHT_BY`` and ``SOUND`` and declares
``EXTENSION``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores.commit_start import CommitItem
from chongming_redis.stores.memory import InMemoryTaskStore

EXTENSION = "CommitStartStore"
Reply = tuple[list[StoreError | None], list[TaskSnapshot] | StoreError]


class _TwoCalls(InMemoryTaskStore):
    """Sound as written: the commit, then the start capped by the items it moved out of
    RUNNING, as two calls under the store's lock (the reference's rule, spelled out)."""

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
    ) -> Reply:
        start: dict[str, Any] = {"owner": owner, "now": now, "lease_until": lease_until,
                                 "buckets": buckets, "names": names}  # fmt: skip
        return self._both(items, limit, start)

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        return super().commit_and_start(items, limit=limit, **start)


class StartsAsManyAsTheLimit(_TwoCalls):
    """Starts up to the limit, however many slots the commit freed: the worker's slots are
    oversubscribed in the store."""

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        results = self.commit_tasks(list(items))
        return results, self.start_tasks(limit=limit, **start)


class CountsEveryItemAsFreed(_TwoCalls):
    """Counts every item written (or not) as a freed slot, not only those that left RUNNING."""

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        results = self.commit_tasks(list(items))
        freed = min(limit, len(items))
        return results, self.start_tasks(limit=freed, **start) if freed else []


class IgnoresTheLimit(_TwoCalls):
    """Starts one task per freed slot even past the caller's limit (a worker that asked for
    fewer, its window smaller than the slots it freed, gets more)."""

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        return super()._both(items, 100, start)


class StartsBeforeTheCommit(_TwoCalls):
    """Starts first, then commits: the start does not see what the commit wrote (and, for a
    moment, the store holds more RUNNING tasks than the worker's slots)."""

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        started = self.start_tasks(limit=min(limit, len(items)), **start) if items else []
        return self.commit_tasks(list(items)), started


class CommitsBeforeCheckingTheStart(_TwoCalls):
    """Writes the commit before it checks the start's arguments: a refused call leaves the
    commit written."""

    def _both(self, items: Sequence[CommitItem], limit: int, start: dict[str, Any]) -> Reply:
        results = self.commit_tasks(list(items))
        return results, self.start_tasks(limit=limit, **start)[:1]


CAUGHT_BY: dict[str, str] = {
    "StartsAsManyAsTheLimit": "test_a_commit_and_start_ends_the_tasks_then_starts_as_many_in_start_order",
    "CountsEveryItemAsFreed": "test_only_items_that_leave_running_free_a_start",
    "IgnoresTheLimit": "test_the_limit_caps_the_starts_below_what_the_commit_freed",
    "StartsBeforeTheCommit": "test_the_start_sees_what_the_commit_wrote",
    "CommitsBeforeCheckingTheStart": "test_bad_items_or_start_arguments_write_nothing",
}

SOUND: dict[str, type[InMemoryTaskStore]] = {"_TwoCalls": _TwoCalls}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type) and issubclass(cls, _TwoCalls) and not name.startswith("_")
}
