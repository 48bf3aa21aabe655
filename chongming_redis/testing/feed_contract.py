"""``FeedContract``: the executable contract of the change feed (``ChangeFeed`` in
``stores/protocol.py``), for any store that has one.

Bind it like ``StoreContract``::

    from chongming_redis.testing.feed_contract import FeedContract

    class TestMyStoreFeed(FeedContract):
        def make_store(self) -> TaskStore:
            return MyStore(...)  # a fresh, isolated, empty store on every call

It checks what one reader can see: a first read over several pages, the empty page that means
"caught up", a task that reappears after any save (even while a reader pages), ``touch`` and
refused writes (batched ones too) neither moving a task nor issuing a position, tombstones
(holding the pruned task's name and bucket, counted by ``limit``) kept forever, a pruned id
created again, malformed and ahead-of-head cursors, the bounds of ``limit``, and (with
dependencies) a ``WAITING`` task and its release.
``tests/test_feed_teeth.py`` fails it on deliberately broken feeds. No test framework is
imported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chongming_redis.errors import (
    ConcurrencyConflict,
    InvalidCursor,
    StoreClosed,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.model import ChangePage, Progress, TaskSnapshot, TaskStatus, Tombstone
from chongming_redis.stores.dependency_store import DependenciesStore
from chongming_redis.stores.extensions import BatchingStore
from chongming_redis.testing.contract.support import (
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
    raises,
    snapshot,
    transition,
)

__all__ = ["FeedContract"]

Item = TaskSnapshot | Tombstone
WAITING = TaskStatus.WAITING
MALFORMED = ("007", "-1", "1e3", " 5", "5 ", "", "+5", "0x10", "5.0", "\u0663", "1_0", "٣")
# Not canonical, yet ``int()`` reads each as a position at or below a small head: a lenient
# parser is caught here rather than by the ahead-of-head check.
LENIENT = ("00", "01", "+1", "-0", " 1", "1\n", "0_1", "\u0661", "\uff11", "1.0")


class FeedContract(ContractBase):
    """The change feed's contract as test methods. Define ``make_store``."""

    # -- helpers -----------------------------------------------------------------------------

    def page(self, after: str = "0", limit: int = 256) -> ChangePage:
        return self.store.changes(after=after, limit=limit)  # type: ignore[attr-defined, no-any-return]

    def read_all(self, after: str = "0", limit: int = 256) -> tuple[list[Item], str]:
        """Read until an empty page, checking what every page promises on the way."""
        items: list[Item] = []
        cursor = after
        for _ in range(10_000):
            page = self.page(cursor, limit)
            assert isinstance(page, ChangePage) and type(page.next_cursor) is str
            assert len(page.tasks) <= limit
            if not page.tasks:
                assert page.next_cursor == cursor, "an empty page keeps the cursor"
                return items, cursor
            assert int(page.next_cursor) > int(cursor), "a non-empty page advances the cursor"
            items.extend(page.tasks)
            cursor = page.next_cursor
        raise AssertionError("the feed never returned an empty page")

    def seen(self, items: list[Item]) -> list[str]:
        return [("-" if isinstance(i, Tombstone) else "") + i.task_id for i in items]

    def save_as(self, task_id: str, **changes: Any) -> TaskSnapshot:
        current = self.store.get(task_id)
        assert current is not None
        new = replace(current, status_version=current.status_version + 1, **changes)
        self.store.save(new, expect_version=current.status_version)
        return new

    # -- reading -----------------------------------------------------------------------------

    def test_an_empty_feed_returns_an_empty_page_that_keeps_the_cursor(self) -> None:
        page = self.page("0")
        assert page.tasks == () and page.next_cursor == "0"
        assert self.read_all() == ([], "0")

    def test_an_empty_page_keeps_the_cursor_it_was_asked_with(self) -> None:
        self.put(*(snapshot(f"t{i}", status=SUCCEEDED, created=i) for i in range(3)))
        self.save_as("t0", status=SUCCEEDED)
        head = self.page("0").next_cursor
        assert head != "0"
        for limit in (1, 256):
            assert self.page(head, limit) == ChangePage((), head)
        self.store.prune(keep_terminal=2)
        cursor = self.page(head).next_cursor
        assert int(cursor) > int(head)
        assert self.page(cursor) == ChangePage((), cursor)

    def test_a_first_read_over_several_pages_returns_every_task_once_in_order(self) -> None:
        tasks = [snapshot(f"t{i:02}", created=50 - i) for i in range(10)]
        self.put(*tasks)
        for limit in (1, 3, 10, 256):
            items, _ = self.read_all(limit=limit)
            assert items == tasks, limit  # in write order, not created_at order

    def test_next_cursor_is_the_position_of_the_last_item_returned(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i) for i in range(5)))
        first = self.page("0", 2)
        assert [t.task_id for t in first.tasks] == ["t0", "t1"]
        rest = self.page(first.next_cursor, 256)
        assert [t.task_id for t in rest.tasks] == ["t2", "t3", "t4"]
        again = self.page(first.next_cursor, 256)
        assert again == rest, "reading from the same cursor returns the same page"
        assert self.page(rest.next_cursor).tasks == ()

    def test_a_page_holds_the_current_state_of_each_task(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        _, cursor = self.read_all()
        moved = self.save_as("t1", status=RUNNING, tags=frozenset({"x"}))
        self.store.touch("t1", lease_owner="w", lease_until=at(30))
        assert self.page(cursor).tasks == (replace(moved, lease_owner="w", lease_until=at(30)),)
        assert self.store.get("t1") == self.page(cursor).tasks[0]

    def test_an_updated_task_reappears_once_at_its_latest_position(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i) for i in range(4)))
        _, cursor = self.read_all()
        self.save_as("t1", status=RUNNING)
        self.save_as("t1", status=SUCCEEDED)
        self.save_as("t0", status=RUNNING)
        items, _ = self.read_all(cursor)
        assert self.seen(items) == ["t1", "t0"]
        assert [t.status for t in items] == [SUCCEEDED, RUNNING]
        everything, _ = self.read_all()
        assert self.seen(everything) == ["t2", "t3", "t1", "t0"]

    def test_a_reader_paging_while_tasks_change_never_skips_one(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i) for i in range(8)))
        first = self.page("0", 3)
        assert self.seen(list(first.tasks)) == ["t0", "t1", "t2"]
        self.save_as("t1", status=RUNNING)  # already read: must come again
        self.save_as("t5", status=RUNNING)  # not read yet: must not be skipped
        items, _ = self.read_all(first.next_cursor, 2)
        assert self.seen(items) == ["t3", "t4", "t6", "t7", "t1", "t5"]
        assert all(t.status == RUNNING for t in items[-2:])

    def test_every_save_moves_the_task_whatever_it_changes(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i) for i in range(5)))
        _, cursor = self.read_all()
        self.save_as("t3", progress=Progress(1, 4, "a quarter"))
        self.save_as("t1", result={"rows": 3})
        self.save_as("t0", tags=frozenset({"x"}))
        self.save_as("t4", updated_at=at(60))
        self.save_as("t2")  # nothing but the version
        items, _ = self.read_all(cursor)
        assert items == [self.store.get(i) for i in ("t3", "t1", "t0", "t4", "t2")]

    def test_touch_never_moves_a_task(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i) for i in range(3)))
        before, cursor = self.read_all()
        self.store.touch("t0", progress=None, heartbeat_at=at(5), lease_owner="w",
                         lease_until=at(9))  # fmt: skip
        self.store.touch("t1", heartbeat_at=at(6))
        assert self.page(cursor).tasks == ()
        after, _ = self.read_all()
        assert self.seen(after) == self.seen(before) == ["t0", "t1", "t2"]

    def test_a_refused_write_does_not_move_a_task(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        _, cursor = self.read_all()
        raises(TaskAlreadyExists, self.store.create, snapshot("t1", status=FAILED))
        raises(ConcurrencyConflict, self.store.save, snapshot("t2", version=5), expect_version=4)
        raises(ConcurrencyConflict, self.store.save, snapshot("zz", version=2), expect_version=1)
        assert self.page(cursor).tasks == ()
        assert self.seen(self.read_all()[0]) == ["t1", "t2"]

    def test_touch_and_refused_writes_issue_no_position(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        before = self.store.feed_stats()  # type: ignore[attr-defined]
        self.store.touch("t1", heartbeat_at=at(5), lease_owner="w", lease_until=at(9))
        self.store.touch("missing", heartbeat_at=at(5))
        raises(TaskAlreadyExists, self.store.create, snapshot("t1"))
        raises(ConcurrencyConflict, self.store.save, snapshot("t2", version=5), expect_version=4)
        assert self.store.feed_stats() == before  # type: ignore[attr-defined]
        _, cursor = self.read_all()
        assert int(cursor) == before.head, "a caught-up reader's cursor is the head"

    def test_a_full_page_spans_many_positions(self) -> None:
        self.put(*(snapshot(f"t{i:03}", created=i) for i in range(300)))
        for i in range(0, 300, 3):
            self.save_as(f"t{i:03}", status=RUNNING)
        first = self.page("0", 256)
        assert len(first.tasks) == 256
        items, _ = self.read_all()
        order = [f"t{i:03}" for i in range(300) if i % 3] + [f"t{i:03}" for i in range(0, 300, 3)]
        assert self.seen(items) == order

    # -- tombstones --------------------------------------------------------------------------

    def test_prune_leaves_a_tombstone_at_a_new_position_kept_forever(self) -> None:
        self.put(snapshot("old", status=SUCCEEDED, bucket=7, name="etl.load"))
        self.put(snapshot("live", created=1))
        _, cursor = self.read_all()
        assert self.store.prune(keep_terminal=0) == 1
        page = self.page(cursor)
        assert len(page.tasks) == 1
        stone = page.tasks[0]
        assert isinstance(stone, Tombstone)
        assert (stone.task_id, stone.name, stone.bucket, stone.status) == (
            "old", "etl.load", 7, "removed")  # fmt: skip
        assert stone.removed_at.utcoffset() is not None
        for _ in range(2):  # kept: every read from the start sees it, once
            assert self.seen(self.read_all()[0]) == ["live", "-old"]
        assert self.page(page.next_cursor).tasks == ()

    def test_a_pruned_id_created_again_is_a_new_item_after_its_tombstone(self) -> None:
        self.put(snapshot("t1", status=FAILED))
        self.store.append(transition("t1", 1))
        self.store.prune(keep_terminal=0)
        fresh = snapshot("t1", name="other", bucket=3, created=9)
        self.store.create(fresh)
        items, _ = self.read_all()
        assert self.seen(items) == ["-t1", "t1"]
        assert items[1] == fresh
        self.store.prune(keep_terminal=0)  # a live task: nothing pruned
        assert self.seen(self.read_all()[0]) == ["-t1", "t1"]

    def test_a_tombstone_holds_the_name_and_bucket_the_task_had_when_pruned(self) -> None:
        self.put(snapshot("t1", name="etl.extract", bucket=2))
        self.save_as("t1", status=SUCCEEDED, name="etl.load", bucket=9)
        _, cursor = self.read_all()
        self.store.prune(keep_terminal=0)
        (stone,) = self.page(cursor).tasks
        assert isinstance(stone, Tombstone)
        assert (stone.task_id, stone.name, stone.bucket) == ("t1", "etl.load", 9)

    def test_tombstones_outlive_later_prunes_and_writes(self) -> None:
        self.put(snapshot("a", status=SUCCEEDED), snapshot("b", status=FAILED, created=1))
        self.put(snapshot("c", created=2))
        assert self.store.prune(keep_terminal=1) == 1  # a
        self.save_as("c", status=SUCCEEDED)
        assert self.store.prune(keep_terminal=0) == 2  # b and c
        assert self.store.prune(keep_terminal=0) == 0
        self.put(snapshot("d", created=3))
        self.save_as("d", status=RUNNING)
        seen = self.seen(self.read_all()[0])
        assert seen[0] == "-a" and sorted(seen[1:3]) == ["-b", "-c"] and seen[3:] == ["d"]
        stats = self.store.feed_stats()  # type: ignore[attr-defined]
        assert (stats.items, stats.tombstones) == (4, 3)

    def test_tombstones_count_towards_the_limit_of_a_page(self) -> None:
        self.put(*(snapshot(f"t{i}", status=SUCCEEDED, created=i) for i in range(5)))
        self.put(snapshot("live", created=9))
        _, cursor = self.read_all()
        assert self.store.prune(keep_terminal=0) == 5
        self.save_as("live", status=RUNNING)
        for limit in (1, 2, 4, 6):
            assert len(self.page(cursor, limit).tasks) == limit
            seen = self.seen(self.read_all(cursor, limit)[0])  # no page above its limit
            assert sorted(seen[:5]) == [f"-t{i}" for i in range(5)] and seen[5:] == ["live"]

    def test_feed_stats_report_the_head_the_size_and_the_tombstones(self) -> None:
        stats = self.store.feed_stats()  # type: ignore[attr-defined]
        assert (stats.head, stats.items, stats.tombstones) == (0, 0, 0)
        self.put(*(snapshot(f"t{i}", status=SUCCEEDED, created=i) for i in range(4)))
        self.save_as("t3", status=SUCCEEDED)
        self.store.prune(keep_terminal=1)
        stats = self.store.feed_stats()  # type: ignore[attr-defined]
        _, cursor = self.read_all()
        assert (stats.items, stats.tombstones) == (4, 3)
        assert stats.head == int(cursor)
        self.store.create(snapshot("t0", created=9))
        assert self.store.feed_stats().tombstones == 3  # type: ignore[attr-defined]

    def test_positions_are_never_reused(self) -> None:
        self.put(*(snapshot(f"t{i}", status=SUCCEEDED, created=i) for i in range(3)))
        _, first = self.read_all()
        self.store.prune(keep_terminal=0)
        _, second = self.read_all(first)
        assert int(second) > int(first)
        self.put(snapshot("t9", created=9))
        page = self.page(second)
        assert self.seen(list(page.tasks)) == ["t9"] and int(page.next_cursor) > int(second)

    # -- batched writes ----------------------------------------------------------------------

    def test_the_runtime_s_batched_writes_move_tasks_too(self) -> None:
        store = self.store
        if not isinstance(store, BatchingStore):
            return  # a store without the batching extension has no batched writes
        store.commit_tasks([(snapshot("a"), None, [transition("a", 1)])])
        created, cursor = self.read_all()
        assert created == [self.store.get("a")], "a batched create moves the task"
        started = store.start_tasks(owner="w", now=at(10), lease_until=at(40), buckets=[0])
        assert [t.task_id for t in started] == ["a"]
        page = self.page(cursor)
        assert page.tasks == tuple(started)
        done = replace(started[0], status=SUCCEEDED, status_version=3)
        assert store.commit_tasks([(done, 2, [])]) == [None]
        assert self.page(page.next_cursor).tasks == (self.store.get("a"),)

    def test_a_refused_batched_item_does_not_move_its_task(self) -> None:
        store = self.store
        if not isinstance(store, BatchingStore):
            return
        self.put(snapshot("a"), snapshot("b", created=1))
        _, cursor = self.read_all()
        results = store.commit_tasks(
            [
                (snapshot("a", status=FAILED), None, []),  # exists
                (snapshot("b", version=3), 2, []),  # b is at version 1
                (snapshot("c", created=2), None, [transition("c", 1)]),
            ]
        )
        assert [type(r) for r in results] == [TaskAlreadyExists, ConcurrencyConflict, type(None)]
        assert self.seen(self.read_all(cursor)[0]) == ["c"]
        assert self.seen(self.read_all()[0]) == ["a", "b", "c"]

    # -- cursors and limits ------------------------------------------------------------------

    def test_a_waiting_task_and_its_release_are_changes_in_order(self) -> None:
        """With dependencies (``DependenciesStore``): a ``WAITING`` task is in the feed as
        written, and the release its parent's end makes is a change after the parent's."""
        if not isinstance(self.store, DependenciesStore):
            return
        self.put(snapshot("p", status=RUNNING))
        self.put(snapshot("c", status=WAITING, created=1, parents=("p",)))
        items, cursor = self.read_all()
        assert [(i.task_id, i.status) for i in items] == [("p", RUNNING), ("c", WAITING)]
        self.save_as("p", status=SUCCEEDED)
        later, _ = self.read_all(cursor)
        assert [(i.task_id, i.status) for i in later] == [("p", SUCCEEDED), ("c", PENDING)]
        assert [i.status_version for i in later] == [2, 2]  # type: ignore[union-attr]

    def test_a_malformed_cursor_is_refused(self) -> None:
        self.put(*(snapshot(f"t{i:02}", created=i) for i in range(12)))  # head >= 12
        for bad in MALFORMED + LENIENT:
            error = raises(InvalidCursor, self.page, bad)
            assert isinstance(error, StoreError), bad
        for wrong in (0, None, b"0", 1.0):
            raises(TypeError, self.page, wrong)
        assert self.seen(self.read_all()[0]) == [f"t{i:02}" for i in range(12)]

    def test_a_cursor_ahead_of_the_head_is_refused_not_reset(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        _, head = self.read_all()
        assert self.page(head).tasks == ()
        for ahead in (str(int(head) + 1), str(int(head) + 1000), str(2**53 - 1)):
            raises(InvalidCursor, self.page, ahead)
        raises(InvalidCursor, self.page, str(2**53))
        self.put(snapshot("t3", created=2))
        assert self.seen(list(self.page(head).tasks)) == ["t3"]

    def test_limit_is_one_to_256(self) -> None:
        self.put(*(snapshot(f"t{i:03}", created=i) for i in range(260)))
        for bad in (0, -1, 257, 10_000):
            raises(ValueError, self.page, "0", bad)
        for wrong in (True, 1.0, "5", None):
            raises(TypeError, self.page, "0", wrong)
        assert len(self.page("0", 1).tasks) == 1
        assert len(self.page("0", 256).tasks) == 256

    def test_the_feed_after_close_raises_store_closed(self) -> None:
        self.put(snapshot("t1"))
        self.close_store()
        raises(StoreClosed, self.page, "0")
        raises(StoreClosed, self.store.feed_stats)  # type: ignore[attr-defined]
        raises(InvalidCursor, self.page, "007")  # argument checks come first
