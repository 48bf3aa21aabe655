"""``FeedReader``: follows a store's change feed and cannot skip.

Each page is checked, then applied and its cursor persisted **in one transaction of the
consumer's own store** (``FeedConsumer.commit``): a crash before that commit re-reads the same
page; a crash after it re-reads nothing twice that matters, because applying is idempotent by
``(task_id, status_version)``. A page that is malformed, too large, non-advancing, going
backwards, or that conflicts with what the consumer already bound (a task id whose name or
bucket changed) is refused with ``PageRejected`` and the cursor does not move. Whether the first
full catch-up has completed (an empty page was read) is persisted separately: reading one page
is not "caught up".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from chongming_redis.errors import InvalidCursor
from chongming_redis.model import ChangePage, TaskSnapshot, Tombstone
from chongming_redis.stores._feed import parse_cursor
from chongming_redis.stores.protocol import ChangeFeed

Item = TaskSnapshot | Tombstone


class PageRejected(Exception):
    """A page the reader will not apply; the cursor did not move. Stop and look: the feed or
    the consumer's store is not what it should be."""


class BindingConflict(PageRejected):
    """A task id the consumer already bound came back with another name or bucket."""


@dataclass(frozen=True)
class Binding:
    """What a consumer knows of one task id: its identity and the latest version applied."""

    name: str
    bucket: int
    status: str
    status_version: int
    removed: bool = False


@dataclass(frozen=True)
class Change:
    """One item to apply, and the binding it leaves."""

    item: Item
    binding: Binding


class FeedConsumer(Protocol):
    """The consumer's own store: where the bindings, the cursor and the caught-up mark live."""

    def cursor(self) -> str:
        """The persisted cursor ("0" before the first commit)."""
        ...

    def caught_up(self) -> bool:
        """Whether a full catch-up (an empty page) was ever reached; persisted."""
        ...

    def bindings(self, task_ids: list[str]) -> dict[str, Binding]:
        """The bindings of the given ids that exist."""
        ...

    def commit(self, expect_cursor: str, changes: list[Change], next_cursor: str) -> None:
        """In one transaction: check the stored cursor is still ``expect_cursor`` (else raise
        ``PageRejected``: another reader moved it), write every change's binding, run the user's
        ``apply`` for each, and store ``next_cursor``. All or nothing."""
        ...

    def mark_caught_up(self) -> None: ...


class FeedReader:
    """Reads ``feed`` (a store with ``changes``) into ``consumer``, ``limit`` items a page."""

    def __init__(self, feed: ChangeFeed, consumer: FeedConsumer, *, limit: int = 256) -> None:
        if not 1 <= limit <= 256:
            raise ValueError(f"limit must be 1..256, not {limit}")
        self.feed = feed
        self.consumer = consumer
        self.limit = limit

    @property
    def caught_up(self) -> bool:
        return self.consumer.caught_up()

    def step(self) -> int:
        """Read and apply one page; returns how many items it held (0: caught up)."""
        cursor = self.consumer.cursor()
        page = self.feed.changes(after=cursor, limit=self.limit)
        check_page(page, cursor, self.limit)
        if not page.tasks:
            if not self.consumer.caught_up():
                self.consumer.mark_caught_up()
            return 0
        ids = [item.task_id for item in page.tasks]
        changes = plan(page.tasks, self.consumer.bindings(ids))
        self.consumer.commit(cursor, changes, page.next_cursor)
        return len(page.tasks)

    def catch_up(self) -> int:
        """Read until an empty page; returns how many items were read."""
        total = 0
        while (count := self.step()) > 0:
            total += count
        return total

    def follow(
        self, *, interval: float = 1.0, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[int]:
        """Catch up, then keep reading every ``interval`` seconds until ``stop()``; yields the
        number of items of every non-empty page, and ``0`` once each time it has caught up
        (the first empty page after items, or the first read of an empty feed), so a loop over
        it hears that it is up to date (``caught_up`` is then true)."""
        idle = False  # the last page was empty (and its 0 was yielded)
        while not stop():
            count = self.step()
            if count:
                idle = False
                yield count
                continue
            if not idle:
                idle = True
                yield 0
            time.sleep(interval)


def check_page(page: Any, cursor: str, limit: int) -> None:
    """Everything a page must be before anything of it is applied."""
    if not isinstance(page, ChangePage):
        raise PageRejected(f"not a ChangePage: {type(page).__name__}")
    try:
        parse_cursor(page.next_cursor)
    except (TypeError, InvalidCursor):
        raise PageRejected(f"next_cursor {page.next_cursor!r} is not canonical decimal") from None
    if len(page.tasks) > limit:
        raise PageRejected(f"page of {len(page.tasks)} items, asked for at most {limit}")
    before, after = int(cursor), int(page.next_cursor)
    if after < before:
        raise PageRejected(f"cursor goes backwards: {cursor} -> {page.next_cursor}")
    if page.tasks and after == before:
        raise PageRejected(f"a page of {len(page.tasks)} items does not advance {cursor}")
    if not page.tasks and after != before:
        raise PageRejected(f"an empty page moves the cursor {cursor} -> {page.next_cursor}")
    live: set[str] = set()
    for item in page.tasks:  # an id may recur only as tombstones of earlier incarnations
        if item.task_id in live:
            raise PageRejected(f"task {item.task_id!r} appears after its live item in one page")
        if isinstance(item, TaskSnapshot):
            live.add(item.task_id)


def plan(items: tuple[Item, ...], bound: dict[str, Binding]) -> list[Change]:
    """The changes a page makes to the bindings, refusing the page on any conflict."""
    changes: list[Change] = []
    view = dict(bound)  # as the page's earlier items leave it
    for item in items:
        old = view.get(item.task_id)
        if isinstance(item, Tombstone):
            if old is not None and not old.removed:
                _same_identity(old, item.name, item.bucket, item.task_id)
            if old is not None and old.removed:
                continue  # a tombstone already applied
            new = Binding(item.name, item.bucket, "removed",
                          old.status_version if old else 0, removed=True)  # fmt: skip
        else:
            if old is not None and not old.removed:
                _same_identity(old, item.name, item.bucket, item.task_id)
                if item.status_version <= old.status_version:
                    continue  # already applied: idempotent by (task_id, status_version)
            new = Binding(item.name, item.bucket, item.status.value, item.status_version)
        changes.append(Change(item, new))
        view[item.task_id] = new
    return changes


def _same_identity(old: Binding, name: str, bucket: int, task_id: str) -> None:
    if (old.name, old.bucket) != (name, bucket):
        raise BindingConflict(
            f"task {task_id!r} is bound to ({old.name!r}, bucket {old.bucket}) but the feed "
            f"says ({name!r}, bucket {bucket})"
        )
