"""Broken change feeds: each breaks one rule of ``ChangeFeed`` (``stores/protocol.py``).

Every class is a small subclass of ``InMemoryTaskStore`` (the reference) that keeps its
signatures and breaks exactly one rule of the ``ChangeFeed`` docstring, the way a backend
author plausibly would: most swap ``self._feed`` for a subclass of ``MemoryFeed`` (``_Feed``
does the swap), a few override the store method that calls it. ``CAUGHT_BY`` names the
``FeedContract`` test that pins the broken rule; ``test_feed_teeth.py`` requires that very test
to fail on the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from chongming_redis.errors import ConcurrencyConflict, InvalidCursor, StoreError, TaskAlreadyExists
from chongming_redis.model import ChangePage, FeedStats, TaskSnapshot, Tombstone, Transition
from chongming_redis.stores._feed import MemoryFeed, ahead, check_page_limit, page_of, parse_cursor
from chongming_redis.stores.codec import row_to_snapshot
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.validation import check_int

Current = Callable[[str], TaskSnapshot]
CommitItem = tuple[TaskSnapshot, int | None, Sequence[Transition]]


class _SkippingFeed(MemoryFeed):
    """A sound feed with a switch: while ``skip`` holds a task id, ``move`` leaves it alone."""

    def __init__(self) -> None:
        super().__init__()
        self.skip: set[str] = set()
        self.skip_all = False

    def move(self, task_id: str) -> None:
        if not self.skip_all and task_id not in self.skip:
            super().move(task_id)


class _Feed(InMemoryTaskStore):
    """The reference with ``feed`` (a ``MemoryFeed`` subclass) in place of its feed."""

    feed: Callable[[], MemoryFeed] = _SkippingFeed

    def __init__(self) -> None:
        super().__init__()
        self._feed = self.feed()

    @property
    def switch(self) -> _SkippingFeed:
        assert isinstance(self._feed, _SkippingFeed)
        return self._feed


# -- which writes move a task -----------------------------------------------------------------


class TouchMovesTheTask(InMemoryTaskStore):
    """touch gives the task a new position too (the feed bumps on every write to the record,
    heartbeats included), so every heartbeat floods the readers."""

    def _touch(self, task_id: str, fence: int | None, *args: Any) -> bool:
        applied = super()._touch(task_id, fence, *args)
        if applied:
            with self._open():
                self._feed.move(task_id)
        return applied


class _BurnsPositions(MemoryFeed):
    def burn(self) -> None:
        self.head += 1


class TouchIssuesAPosition(_Feed):
    """touch takes the next position of the sequence (an INCR at the top of every script)
    without moving the task: the head is no longer the last position a reader can reach."""

    feed = _BurnsPositions

    def _touch(self, task_id: str, fence: int | None, *args: Any) -> bool:
        with self._open():
            assert isinstance(self._feed, _BurnsPositions)
            self._feed.burn()
        return super()._touch(task_id, fence, *args)


class RefusedWriteIssuesAPosition(_Feed):
    """create and save take the next position before checking the version (INCR first, then
    the check): a refused write consumes a position."""

    feed = _BurnsPositions

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except TaskAlreadyExists:
            self._burn()
            raise

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict:
            self._burn()
            raise

    def _burn(self) -> None:
        with self._open():
            assert isinstance(self._feed, _BurnsPositions)
            self._feed.burn()


class RefusedCreateMovesTheTask(InMemoryTaskStore):
    """create writes the feed entry before the existence check, so a refused create of an
    existing id moves that task."""

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except TaskAlreadyExists:
            with self._open():
                self._feed.move(snapshot.task_id)
            raise


class RefusedSaveMovesTheTask(InMemoryTaskStore):
    """save writes the feed entry before the version check, so a conflicting save of an
    existing task moves it."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict:
            with self._open():
                if snapshot.task_id in self._tasks:
                    self._feed.move(snapshot.task_id)
            raise


class SaveMovesOnlyOnAStatusChange(_Feed):
    """save moves the task only when its status changes (the feed hooked on transitions), so a
    save of progress, result or tags is never seen."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        before = self.get(snapshot.task_id) if isinstance(snapshot, TaskSnapshot) else None
        if before is not None and before.status == snapshot.status:
            self.switch.skip.add(snapshot.task_id)
        try:
            super().save(snapshot, expect_version=expect_version)
        finally:
            self.switch.skip.clear()


class CommitCreatesDoNotMove(_Feed):
    """commit_tasks moves the tasks it saves but not the ones it creates (the batched script
    copied from save's), so a task created by the runtime is seen only once it changes."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        self.switch.skip = {i[0].task_id for i in items if isinstance(i, tuple) and i[1] is None}
        try:
            return super().commit_tasks(items)
        finally:
            self.switch.skip = set()


class CommitSavesDoNotMove(_Feed):
    """commit_tasks moves the tasks it creates but not the ones it saves."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        saved = [i[0].task_id for i in items if isinstance(i, tuple) and i[1] is not None]
        self.switch.skip = set(saved)
        try:
            return super().commit_tasks(items)
        finally:
            self.switch.skip = set()


class RefusedCommitItemMovesTheTask(InMemoryTaskStore):
    """commit_tasks moves every existing task it was handed, the refused items included."""

    def commit_tasks(self, items: Sequence[CommitItem]) -> list[StoreError | None]:
        results = super().commit_tasks(items)
        with self._open():
            for item, error in zip(items, results):
                if error is not None and item[0].task_id in self._tasks:
                    self._feed.move(item[0].task_id)
        return results


class StartTasksDoNotMove(_Feed):
    """start_tasks writes the status, lease and history but never the feed."""

    def start_tasks(
        self,
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> list[TaskSnapshot]:
        self.switch.skip_all = True
        try:
            return super().start_tasks(
                owner=owner, now=now, lease_until=lease_until, buckets=buckets, limit=limit,
                names=names,
            )  # fmt: skip
        finally:
            self.switch.skip_all = False


# -- where a changed task goes ----------------------------------------------------------------


class _KeepsFirstPosition(MemoryFeed):
    def move(self, task_id: str) -> None:
        if task_id not in self._position:  # "already in the feed"
            super().move(task_id)


class SaveKeepsTheFirstPosition(_Feed):
    """A task stays at the position of its creation: a reader that passed it never sees its
    updates."""

    feed = _KeepsFirstPosition


class _AppendOnly(MemoryFeed):
    def move(self, task_id: str) -> None:
        self.head += 1
        self._items[self.head] = task_id
        self._position[task_id] = self.head


class SaveAddsASecondItem(_Feed):
    """Every write appends an item and never drops the task's older one (a log, not a
    feed): the task comes back once per change."""

    feed = _AppendOnly


class _CountPositions(MemoryFeed):
    def move(self, task_id: str) -> None:
        self._drop(task_id)
        self.head = len(self._items) + 1  # ZCARD + 1 as the next position
        self._items[self.head] = task_id
        self._position[task_id] = self.head


class PositionsFromTheItemCount(_Feed):
    """The next position is the feed's size plus one (ZCARD + 1 instead of a counter): after
    an update positions are reused and items overwrite each other."""

    feed = _CountPositions


class HeadTrimmedAfterPrune(InMemoryTaskStore):
    """prune, after writing its tombstones, sets the sequence back to the highest live
    position (a cleanup of "unused" positions): the next writes reuse the tombstones'."""

    def prune(self, *, keep_terminal: int) -> int:
        pruned = super().prune(keep_terminal=keep_terminal)
        with self._open():
            live = [p for p, item in self._feed._items.items() if isinstance(item, str)]
            self._feed.head = max(live, default=0)
        return pruned


class _CachedFeed(MemoryFeed):
    def __init__(self, rows: dict[str, Any]) -> None:
        super().__init__()
        self.rows = rows
        self.cache: dict[str, TaskSnapshot] = {}

    def move(self, task_id: str) -> None:
        super().move(task_id)
        self.cache[task_id] = row_to_snapshot(self.rows[task_id])

    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        return super().page(after, limit, self.cache.__getitem__)


class PageHoldsTheStateAtTheWrite(InMemoryTaskStore):
    """The feed item holds a copy of the task taken when it moved, not its current state, so
    what touch wrote since (the lease, the heartbeat) is missing from the page."""

    def __init__(self) -> None:
        super().__init__()
        self._feed = _CachedFeed(self._tasks)


# -- reading pages ----------------------------------------------------------------------------


class _EmptyPageZero(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        found = super().page(after, limit, current)
        return found if found.tasks else ChangePage((), "0")


class EmptyPageReturnsZero(_Feed):
    """An empty page returns the cursor "0" instead of the cursor it was asked with: a reader
    that stores it starts over."""

    feed = _EmptyPageZero


class _NextIsHead(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        found = super().page(after, limit, current)
        return found if not found.tasks else ChangePage(found.tasks, str(self.head))


class NextCursorIsTheHead(_Feed):
    """next_cursor is the feed's head instead of the position of the last item returned:
    everything beyond ``limit`` is skipped."""

    feed = _NextIsHead


class _NextIsFirst(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after > self.head:
            raise ahead(after, self.head)
        positions = sorted(p for p in self._items if p > after)[:limit]
        items = [self._item(p, current) for p in positions]
        return page_of(items, positions[0] if positions else None, after)  # off by one item

    def _item(self, position: int, current: Current) -> TaskSnapshot | Tombstone:
        item = self._items[position]
        return current(item) if isinstance(item, str) else item


class NextCursorIsTheFirstItem(_Feed):
    """next_cursor is the position of the first item of the page: the rest come again."""

    feed = _NextIsFirst


class _NextIsAfter(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        return ChangePage(super().page(after, limit, current).tasks, str(after))


class NextCursorDoesNotAdvance(_Feed):
    """Every page, empty or not, returns the cursor it was asked with: a reader never gets
    past its first page."""

    feed = _NextIsAfter


class _TextOrder(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after > self.head:
            raise ahead(after, self.head)
        positions = sorted((p for p in self._items if p > after), key=str)[:limit]
        items: list[TaskSnapshot | Tombstone] = []
        for position in positions:
            item = self._items[position]
            items.append(current(item) if isinstance(item, str) else item)
        return page_of(items, positions[-1] if positions else None, after)


class PositionsSortedAsText(_Feed):
    """The page is sorted by position as text (keys compared as strings): "10" before "2"."""

    feed = _TextOrder


class _CreatedOrder(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        found = super().page(after, limit, current)

        def when(item: TaskSnapshot | Tombstone) -> datetime:
            return item.created_at if isinstance(item, TaskSnapshot) else item.removed_at

        return ChangePage(tuple(sorted(found.tasks, key=when)), found.next_cursor)


class PageOrderedByCreatedAt(_Feed):
    """Each page is ordered by the tasks' created_at instead of their positions."""

    feed = _CreatedOrder


class _LimitCountsTasks(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after > self.head:
            raise ahead(after, self.head)
        items: list[TaskSnapshot | Tombstone] = []
        last, tasks = None, 0
        for position in sorted(p for p in self._items if p > after):
            item = self._items[position]
            if isinstance(item, str):
                if tasks == limit:
                    break
                tasks += 1
            items.append(current(item) if isinstance(item, str) else item)
            last = position
        return page_of(items, last, after)


class LimitCountsOnlyTasks(_Feed):
    """``limit`` counts the tasks of a page, not its tombstones: a page after a large prune
    holds far more than ``limit`` items."""

    feed = _LimitCountsTasks


# -- cursors and limits -----------------------------------------------------------------------


class CursorParsedWithInt(InMemoryTaskStore):
    """The cursor is parsed with int(): "007", " 5", "+5", "1_0" and other digits pass."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        if type(after) is not str:
            raise TypeError("after must be a str cursor")
        try:
            position = int(after)
        except ValueError:
            raise InvalidCursor(after, "not a number") from None
        if position < 0:
            raise InvalidCursor(after, "negative")
        with self._open():
            return self._feed.page(
                position, check_page_limit(limit), lambda i: row_to_snapshot(self._tasks[i])
            )


class CursorCheckedWithIsdigit(InMemoryTaskStore):
    """The cursor is checked with str.isdigit(): leading zeros and non-ASCII digits pass."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        if type(after) is not str:
            raise TypeError("after must be a str cursor")
        if not after.isdigit():
            raise InvalidCursor(after, "not decimal")
        return super().changes(str(int(after)), limit)


class CursorAcceptsAnInt(InMemoryTaskStore):
    """changes(after=0) is taken as changes(after="0") instead of a TypeError."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        if type(after) is int:
            after = str(after)
        return super().changes(after, limit)


class _AheadIsEmpty(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after > self.head:
            return page_of([], None, after)
        return super().page(after, limit, current)


class AheadCursorReturnsAnEmptyPage(_Feed):
    """A cursor ahead of the head gets an empty page ("caught up") instead of InvalidCursor:
    after a restore the reader silently waits for positions it has already seen."""

    feed = _AheadIsEmpty


class _AheadRestarts(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        return super().page(0 if after > self.head else after, limit, current)


class AheadCursorRestartsFromZero(_Feed):
    """A cursor ahead of the head silently restarts the reader from "0"."""

    feed = _AheadRestarts


class _AheadOffByOne(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after == self.head + 1:
            return page_of([], None, after)
        return super().page(after, limit, current)


class AheadCheckOffByOne(_Feed):
    """The ahead-of-head check is ``after > head + 1``: the position just past the head is
    accepted as caught up."""

    feed = _AheadOffByOne


class _NoHeadYet(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if not self._items:
            raise InvalidCursor(str(after), "the feed does not exist yet")
        return super().page(after, limit, current)


class EmptyFeedRefusesTheFirstRead(_Feed):
    """A store nothing was ever written to has no feed (no head key yet) and refuses "0"
    instead of answering with the empty page that means caught up."""

    feed = _NoHeadYet


class _CaughtUpRefused(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after >= self.head:
            raise ahead(after, self.head)
        return super().page(after, limit, current)


class CaughtUpCursorRefused(_Feed):
    """The ahead-of-head check is ``after >= head``: a reader that is caught up gets
    InvalidCursor instead of an empty page."""

    feed = _CaughtUpRefused


class _AheadOfSize(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        if after > len(self._items):
            raise ahead(after, len(self._items))
        return super().page(after, limit, current)


class AheadCheckedAgainstTheSize(_Feed):
    """A cursor is compared with the feed's size instead of its head: once tasks moved,
    valid cursors near the head are refused."""

    feed = _AheadOfSize


class LimitClamped(InMemoryTaskStore):
    """A limit outside 1..256 is clamped into it instead of refused with ValueError."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        size = min(max(check_int(limit, "limit", minimum=-(2**53)), 1), 256)
        return super().changes(after, size)


class LimitUpToAThousand(InMemoryTaskStore):
    """limit is checked against 1..1000 (the batch size of start_tasks) instead of 1..256."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        position, size = parse_cursor(after), check_int(limit, "limit", minimum=1, maximum=1000)
        with self._open():
            return self._feed.page(position, size, lambda i: row_to_snapshot(self._tasks[i]))


class FeedReadableAfterClose(InMemoryTaskStore):
    """changes reads the feed without checking that the store is open."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        position, size = parse_cursor(after), check_page_limit(limit)
        with self._lock:
            return self._feed.page(position, size, lambda i: row_to_snapshot(self._tasks[i]))


# -- tombstones -------------------------------------------------------------------------------


class ReleaseLeavesTheFeed(_Feed):
    """A child released by its parent's end keeps its position: a reader that saw it WAITING
    never hears that it became PENDING."""

    def _move_child(self, child: str, row: Any, to: Any, parent: str, outcome: str) -> bool:
        self.switch.skip.add(child)
        try:
            return super()._move_child(child, row, to, parent, outcome)
        finally:
            self.switch.skip.discard(child)


class _NoTombstone(MemoryFeed):
    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        self._drop(task_id)


class PruneLeavesNoTombstone(_Feed):
    """prune drops the task's item and writes no tombstone: readers never learn it is gone."""

    feed = _NoTombstone


class _TombstoneInPlace(MemoryFeed):
    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        position = self._position.pop(task_id)
        self._items[position] = Tombstone(task_id, removed_at, name, bucket)
        self.tombstones += 1


class TombstoneAtTheOldPosition(_Feed):
    """The tombstone replaces the task's item at its old position instead of taking a new
    one: a reader that already passed the task never sees it removed."""

    feed = _TombstoneInPlace


class _TombstoneByIdSlot(MemoryFeed):
    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        super().tombstone(task_id, name, bucket, removed_at)
        self._position[task_id] = self.head  # one slot per id, task or tombstone

    def move(self, task_id: str) -> None:
        old = self._position.get(task_id)
        if old is not None and isinstance(self._items.get(old), Tombstone):
            self.tombstones -= 1
        super().move(task_id)


class RecreateDropsTheTombstone(_Feed):
    """The feed keeps one slot per id, tasks and tombstones alike, so creating a pruned id
    again deletes its tombstone (tombstones are not kept forever)."""

    feed = _TombstoneByIdSlot


class TombstonesCompactedByEachPrune(InMemoryTaskStore):
    """Every prune first drops the tombstones earlier prunes left (a compaction), so
    tombstones last only until the next prune."""

    def prune(self, *, keep_terminal: int) -> int:
        with self._open():
            feed = self._feed
            for position in [p for p, i in feed._items.items() if isinstance(i, Tombstone)]:
                del feed._items[position]
                feed.tombstones -= 1
        return super().prune(keep_terminal=keep_terminal)


class _FreshReaderSkipsTombstones(MemoryFeed):
    def page(self, after: int, limit: int, current: Current) -> ChangePage:
        found = super().page(after, limit, current)
        if after != 0:
            return found
        kept = tuple(i for i in found.tasks if not isinstance(i, Tombstone))
        return ChangePage(kept, found.next_cursor) if kept else found


class FreshReaderSkipsTombstones(_Feed):
    """A first page (after "0") leaves tombstones out, since a new reader "had nothing to
    forget": a reader that restarts from "0" keeps what was pruned."""

    feed = _FreshReaderSkipsTombstones


class _TombstoneBucketZero(MemoryFeed):
    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        super().tombstone(task_id, name, 0, removed_at)


class TombstoneWithoutTheBucket(_Feed):
    """The tombstone is written with bucket 0 instead of the pruned task's bucket."""

    feed = _TombstoneBucketZero


class _TombstoneNamedById(MemoryFeed):
    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        super().tombstone(task_id, task_id, bucket, removed_at)


class TombstoneWithoutTheName(_Feed):
    """The tombstone carries the task id where the task's name belongs."""

    feed = _TombstoneNamedById


class _BornFeed(MemoryFeed):
    def __init__(self) -> None:
        super().__init__()
        self.born: dict[str, tuple[str, int]] = {}

    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        name, bucket = self.born.pop(task_id, (name, bucket))
        super().tombstone(task_id, name, bucket, removed_at)


class TombstoneHoldsTheCreatedNameAndBucket(_Feed):
    """The tombstone is built from the name and bucket the task was created with (kept
    beside the feed item at create) instead of the ones it had when pruned."""

    feed = _BornFeed

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        assert isinstance(self._feed, _BornFeed)
        self._feed.born[snapshot.task_id] = (snapshot.name, snapshot.bucket)


# -- feed_stats -------------------------------------------------------------------------------


class _LiveSize(MemoryFeed):
    def stats(self) -> FeedStats:
        return FeedStats(self.head, len(self._position), self.tombstones)


class FeedStatsItemsLeaveOutTombstones(_Feed):
    """feed_stats counts the live tasks as the feed's size, not the tombstones beside them."""

    feed = _LiveSize


class _PrunedIds(MemoryFeed):
    def move(self, task_id: str) -> None:
        if any(isinstance(i, Tombstone) and i.task_id == task_id for i in self._items.values()):
            self.tombstones -= 1  # "this id is no longer pruned"
        super().move(task_id)


class FeedStatsForgetRecreatedTombstones(_Feed):
    """feed_stats counts the ids currently pruned, not the tombstones kept: creating a pruned
    id again lowers the count though its tombstone stays."""

    feed = _PrunedIds


class _HeadIsSize(MemoryFeed):
    def stats(self) -> FeedStats:
        return FeedStats(len(self._items), len(self._items), self.tombstones)


class FeedStatsHeadIsTheSize(_Feed):
    """feed_stats reports the feed's size as its head (the last position issued)."""

    feed = _HeadIsSize


BROKEN_FEEDS: dict[str, type[InMemoryTaskStore]] = {
    cls.__name__: cls
    for cls in list(globals().values())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not cls.__name__.startswith("_")
    and cls is not InMemoryTaskStore
}

#: The sound rebuild the swapped feeds start from: the contract passes it.
SOUND: dict[str, type[InMemoryTaskStore]] = {"InMemoryTaskStore": InMemoryTaskStore, "_Feed": _Feed}

_MOVES = "test_an_updated_task_reappears_once_at_its_latest_position"
_TOUCH = "test_touch_never_moves_a_task"
_ISSUES = "test_touch_and_refused_writes_issue_no_position"
_REFUSED = "test_a_refused_write_does_not_move_a_task"
_BATCH = "test_the_runtime_s_batched_writes_move_tasks_too"
_NEXT = "test_next_cursor_is_the_position_of_the_last_item_returned"
_AHEAD = "test_a_cursor_ahead_of_the_head_is_refused_not_reset"
_PRUNE = "test_prune_leaves_a_tombstone_at_a_new_position_kept_forever"
_STATS = "test_feed_stats_report_the_head_the_size_and_the_tombstones"
_EMPTY = "test_an_empty_feed_returns_an_empty_page_that_keeps_the_cursor"
_ORDER = "test_a_first_read_over_several_pages_returns_every_task_once_in_order"
_RECREATED = "test_a_pruned_id_created_again_is_a_new_item_after_its_tombstone"
_STONE_FIELDS = "test_a_tombstone_holds_the_name_and_bucket_the_task_had_when_pruned"

#: The contract test that pins the rule each feed breaks.
CAUGHT_BY: dict[str, str] = {
    "ReleaseLeavesTheFeed": "test_a_waiting_task_and_its_release_are_changes_in_order",
    "TouchMovesTheTask": _TOUCH,
    "TouchIssuesAPosition": _ISSUES,
    "RefusedWriteIssuesAPosition": _ISSUES,
    "RefusedCreateMovesTheTask": _REFUSED,
    "RefusedSaveMovesTheTask": _REFUSED,
    "SaveMovesOnlyOnAStatusChange": "test_every_save_moves_the_task_whatever_it_changes",
    "CommitCreatesDoNotMove": _BATCH,
    "CommitSavesDoNotMove": _BATCH,
    "RefusedCommitItemMovesTheTask": "test_a_refused_batched_item_does_not_move_its_task",
    "StartTasksDoNotMove": _BATCH,
    "SaveKeepsTheFirstPosition": _MOVES,
    "SaveAddsASecondItem": _MOVES,
    "PositionsFromTheItemCount": "test_a_reader_paging_while_tasks_change_never_skips_one",
    "HeadTrimmedAfterPrune": "test_positions_are_never_reused",
    "PageHoldsTheStateAtTheWrite": "test_a_page_holds_the_current_state_of_each_task",
    "EmptyPageReturnsZero": "test_an_empty_page_keeps_the_cursor_it_was_asked_with",
    "NextCursorIsTheHead": _NEXT,
    "NextCursorIsTheFirstItem": _NEXT,
    "NextCursorDoesNotAdvance": _NEXT,
    "PositionsSortedAsText": _ORDER,
    "PageOrderedByCreatedAt": _ORDER,
    "LimitCountsOnlyTasks": "test_tombstones_count_towards_the_limit_of_a_page",
    "CursorParsedWithInt": "test_a_malformed_cursor_is_refused",
    "CursorCheckedWithIsdigit": "test_a_malformed_cursor_is_refused",
    "CursorAcceptsAnInt": "test_a_malformed_cursor_is_refused",
    "AheadCursorReturnsAnEmptyPage": _AHEAD,
    "AheadCursorRestartsFromZero": _AHEAD,
    "AheadCheckOffByOne": _AHEAD,
    "CaughtUpCursorRefused": _AHEAD,
    "EmptyFeedRefusesTheFirstRead": _EMPTY,
    "AheadCheckedAgainstTheSize": "test_a_full_page_spans_many_positions",
    "LimitClamped": "test_limit_is_one_to_256",
    "LimitUpToAThousand": "test_limit_is_one_to_256",
    "FeedReadableAfterClose": "test_the_feed_after_close_raises_store_closed",
    "PruneLeavesNoTombstone": _PRUNE,
    "TombstoneAtTheOldPosition": _PRUNE,
    "RecreateDropsTheTombstone": _RECREATED,
    "TombstonesCompactedByEachPrune": "test_tombstones_outlive_later_prunes_and_writes",
    "FreshReaderSkipsTombstones": _PRUNE,
    "TombstoneWithoutTheBucket": _PRUNE,
    "TombstoneWithoutTheName": _PRUNE,
    "TombstoneHoldsTheCreatedNameAndBucket": _STONE_FIELDS,
    "FeedStatsItemsLeaveOutTombstones": _STATS,
    "FeedStatsForgetRecreatedTombstones": _STATS,
    "FeedStatsHeadIsTheSize": _STATS,
}
