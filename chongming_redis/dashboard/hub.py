"""``FeedHub``: one follower of the store's change feed per dashboard, shared by every page.

A single task reads the feed from where it stands (one ``changes`` call per ``interval`` when
nothing moves) and hands each page to the subscribers: the live pages (server-sent events)
never read the feed themselves and never poll tasks one by one. The hub also counts finished
tasks per time bin (the overview's throughput): at start it reads back the last
``seed_positions`` feed positions, the tasks that changed most recently, so a fresh dashboard
shows the last minutes at once.

A subscriber that falls behind (its queue full) is marked ``overflowed`` instead of blocking the
hub; its page reloads what it shows. A feed that goes backwards (``InvalidCursor``: Redis
restored from an older backup) is followed again from its new head, and every page is told.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from anyio import to_thread

from chongming_redis.errors import CorruptRecord, InvalidCursor, StoreError
from chongming_redis.model import TaskSnapshot, Tombstone
from chongming_redis.stores.protocol import ChangeFeed

log = logging.getLogger("chongming_redis.dashboard")
Item = TaskSnapshot | Tombstone

PAGE = 256


@dataclass(eq=False)  # compared and hashed by identity: the hub keeps a set of them
class Subscription:
    queue: asyncio.Queue[Sequence[Item]] = field(default_factory=lambda: asyncio.Queue(maxsize=64))
    overflowed: bool = False
    #: Pages that end at or before this feed position are not handed to this subscriber: it
    #: read the store after that position was issued, so it already shows them.
    since: int = 0


class Throughput:
    """Finished tasks per ``bin_seconds`` over the last ``window`` seconds, by the
    ``updated_at`` of each terminal item the feed shows (a task counts once per finish)."""

    def __init__(self, *, window: float = 600.0, bin_seconds: float = 10.0) -> None:
        self.bin_seconds = bin_seconds
        self.bins = int(window // bin_seconds)
        self._counts: dict[int, int] = {}
        self._seen: dict[str, int] = {}  # task id -> version counted (a re-read item counts once)

    def add(self, item: Item) -> None:
        if isinstance(item, Tombstone) or not item.status.is_terminal:
            return
        if self._seen.get(item.task_id) == item.status_version:
            return
        self._seen[item.task_id] = item.status_version
        slot = math.floor(item.updated_at.timestamp() / self.bin_seconds)
        self._counts[slot] = self._counts.get(slot, 0) + 1
        if len(self._seen) > 200_000:  # bounded memory: forget the oldest half
            for key in list(self._seen)[:100_000]:
                del self._seen[key]

    def series(self, now: datetime) -> list[tuple[datetime, int]]:
        """``[(bin start, finished)]``, oldest first, the current bin last."""
        last = math.floor(now.timestamp() / self.bin_seconds)
        first = last - self.bins + 1
        for slot in [s for s in self._counts if s < first]:
            del self._counts[slot]
        return [
            (datetime.fromtimestamp(s * self.bin_seconds, timezone.utc), self._counts.get(s, 0))
            for s in range(first, last + 1)
        ]

    def per_second(self, now: datetime, seconds: float = 60.0) -> float:
        """Finished per second over the last ``seconds`` whole bins and the current bin so
        far (a burst that just ended shows at once, not a bin later)."""
        series = self.series(now)
        take = max(1, int(seconds // self.bin_seconds))
        recent = series[-take - 1 :]
        span = (len(recent) - 1) * self.bin_seconds + (now - series[-1][0]).total_seconds()
        return sum(n for _, n in recent) / span if span > 0 else 0.0


class FeedHub:
    def __init__(
        self,
        feed: ChangeFeed,
        *,
        interval: float = 0.25,
        seed_positions: int = 5000,
        throughput: Throughput | None = None,
    ) -> None:
        self.feed = feed
        self.interval = interval
        self.seed_positions = seed_positions
        self.throughput = throughput or Throughput()
        self.cursor: str | None = None
        self.error: str | None = None  # the last store error, while it lasts
        self.generation = 0  # bumped on every page of changes: "something moved"
        self._subscribers: set[Subscription] = set()
        self._limp = False  # reading one item at a time past a corrupt record

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    async def run(self) -> None:
        """Follow the feed until cancelled; store errors are kept in ``error`` and retried."""
        delay = self.interval
        while True:
            try:
                moved = await self.step()
                if self.error is not None:
                    log.warning("the change feed is readable again")
                self.error, delay = None, self.interval
            except StoreError as exc:
                if self.error is None:
                    log.warning("cannot read the change feed: %s", exc)
                self.error = str(exc) or type(exc).__name__
                delay = min(max(delay * 2, self.interval), 5.0)
                moved = False
            if not moved:
                await asyncio.sleep(delay)

    async def step(self) -> bool:
        """Read one page and hand it out; ``False`` when caught up."""
        if self.cursor is None:
            self.cursor = await self._start()
        cursor = self.cursor
        try:
            # Past a record that does not decode, one item at a time (below).
            page = await to_thread.run_sync(self.feed.changes, cursor, 1 if self._limp else PAGE)
        except CorruptRecord as exc:
            # One bad task must not stop every live page: step over positions one by one
            # until the bad item is behind (its position is not known), and let every page
            # re-read what it shows. The task itself stays visible as corrupt to `get`.
            log.warning("skipping change-feed position %d: %s", int(cursor) + 1, exc)
            self._limp, self.cursor = True, str(int(cursor) + 1)
            self._publish((), 0)
            return True
        except InvalidCursor:
            log.warning("the change feed went back behind position %s (a restore?): "
                        "following it from its new head", self.cursor)  # fmt: skip
            self.cursor = None
            self._publish((), 0)
            return True
        if not page.tasks:
            return False
        start, end = int(cursor), int(page.next_cursor)
        # A page that loaded between this page's first and last position already shows the
        # part up to its ``since``: it gets only what came after, read from there (before
        # the cursor moves: a failed read leaves the whole page to be read again).
        tails = {}
        for sub in [s for s in self._subscribers if start < s.since < end]:
            tail = await self._tail(sub.since, end)
            if tail is not None:
                tails[sub] = tail
        self._limp = False
        self.cursor = page.next_cursor
        for item in page.tasks:
            self.throughput.add(item)
        self._publish(page.tasks, end, tails)
        return True

    async def _tail(self, since: int, end: int) -> list[Item] | None:
        """The feed's items after position ``since``, read until at least position ``end``;
        ``None`` past a corrupt record (the subscriber gets the whole page, as before)."""
        items: list[Item] = []
        cursor = str(since)
        while int(cursor) < end:
            try:
                page = await to_thread.run_sync(self.feed.changes, cursor, PAGE)
            except CorruptRecord:
                return None
            if not page.tasks:
                break
            items.extend(page.tasks)
            cursor = page.next_cursor
        return items

    async def _start(self) -> str:
        """Seed the throughput from the most recent positions; follow on from the head."""
        stats = await to_thread.run_sync(self.feed.feed_stats)
        cursor = str(max(0, stats.head - self.seed_positions))
        while True:
            page = await to_thread.run_sync(self.feed.changes, cursor, PAGE)
            if not page.tasks:
                return cursor
            for item in page.tasks:
                self.throughput.add(item)
            cursor = page.next_cursor

    def _publish(
        self,
        items: Sequence[Item],
        last_position: int,
        tails: dict[Subscription, list[Item]] | None = None,
    ) -> None:
        """An empty batch means "reload everything you show"; ``tails``: a subscriber's own
        part of the batch (``step``)."""
        self.generation += 1
        for sub in self._subscribers:
            if items and last_position <= sub.since:
                continue
            batch = (tails or {}).get(sub, items)
            if items and not batch:
                continue  # its part of the batch is empty: nothing to say
            try:
                sub.queue.put_nowait(batch)
            except asyncio.QueueFull:
                sub.overflowed = True
