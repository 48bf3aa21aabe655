"""``FeedReader`` and its two consumers: applied pages and cursors move together or not at all,
re-applying is idempotent, and every bad page is refused without moving the cursor."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from chongming_redis import (
    ChangePage,
    InMemoryTaskStore,
    InvalidCursor,
    TaskSnapshot,
    TaskStatus,
    Tombstone,
)
from chongming_redis.feed import (
    Binding,
    BindingConflict,
    FeedReader,
    PageRejected,
    RedisFeedConsumer,
    SqliteFeedConsumer,
)

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def task(
    task_id: str, version: int = 1, name: str = "job", bucket: int = 0, **kw: Any
) -> TaskSnapshot:
    status = kw.pop("status", TaskStatus.PENDING)
    return TaskSnapshot(task_id, name, status, version, T0, T0, bucket=bucket, **kw)


Factory = Callable[..., Any]


@pytest.fixture(params=["sqlite", "redis"])
def consumer_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    if request.param == "sqlite":
        yield lambda apply=None: SqliteFeedConsumer(tmp_path / "consumer.db", apply=apply)
    else:
        client = fakeredis.FakeRedis()
        yield lambda apply=None: RedisFeedConsumer(client, prefix="reader", apply=apply)


class FakeFeed:
    """A feed that returns the pages it is given, whatever the cursor."""

    def __init__(self, *pages: ChangePage) -> None:
        self.pages = list(pages)

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        return self.pages.pop(0) if self.pages else ChangePage((), after)

    def feed_stats(self) -> Any:
        raise NotImplementedError


def test_catch_up_binds_every_task_and_only_an_empty_page_means_caught_up(
    consumer_factory: Factory,
) -> None:
    store = InMemoryTaskStore()
    for i in range(7):
        store.create(task(f"t{i}", bucket=i % 3))
    reader = FeedReader(store, consumer_factory(), limit=3)
    assert reader.step() == 3
    assert not reader.caught_up, "reading one page is not caught up"
    assert reader.catch_up() == 4
    assert reader.caught_up
    bound = reader.consumer.all_bindings()
    assert bound == {f"t{i}": Binding("job", i % 3, "pending", 1) for i in range(7)}
    assert reader.consumer.cursor() == store.changes("0", 256).next_cursor
    assert consumer_factory().caught_up(), "persisted, not only in this object"


def test_follow_yields_each_page_and_a_zero_once_each_time_it_catches_up(
    consumer_factory: Factory,
) -> None:
    """A loop over ``follow`` hears that it is up to date: on an empty feed at once, and again
    after each burst of changes (not on every idle poll)."""
    store = InMemoryTaskStore()
    reader = FeedReader(store, consumer_factory(), limit=2)
    seen: list[tuple[int, bool]] = []
    polls = iter(range(12))

    def stop() -> bool:
        n = next(polls)
        if n == 4:  # a burst of three while it is idle
            for i in range(3):
                store.create(task(f"t{i}"))
        return n == 11

    for count in reader.follow(interval=0, stop=stop):
        seen.append((count, reader.caught_up))
    assert seen == [(0, True), (2, True), (1, True), (0, True)]


def test_updates_and_tombstones_reach_the_bindings(consumer_factory: Factory) -> None:
    store = InMemoryTaskStore()
    store.create(task("a"))
    store.create(task("b", status=TaskStatus.SUCCEEDED))
    reader = FeedReader(store, consumer_factory())
    reader.catch_up()
    store.save(task("a", 2, status=TaskStatus.RUNNING), expect_version=1)
    store.prune(keep_terminal=0)
    store.create(task("b", name="other", bucket=5))  # a new task with a pruned id
    reader.catch_up()
    bound = reader.consumer.all_bindings()
    assert bound["a"] == Binding("job", 0, "running", 2)
    assert bound["b"] == Binding("other", 5, "pending", 1)


def test_a_failure_before_the_commit_writes_nothing_and_the_page_is_read_again(
    consumer_factory: Factory, tmp_path: Path
) -> None:
    store = InMemoryTaskStore()
    for i in range(4):
        store.create(task(f"t{i}"))
    calls: list[str] = []

    def apply(txn: Any, item: Any) -> None:
        calls.append(item.task_id)
        if item.task_id == "t2" and calls.count("t2") == 1:
            raise RuntimeError("the consumer crashed mid-page")

    reader = FeedReader(store, consumer_factory(apply), limit=4)
    with pytest.raises(RuntimeError):
        reader.step()
    assert reader.consumer.cursor() == "0"
    assert reader.consumer.all_bindings() == {}
    assert reader.step() == 4
    assert calls == ["t0", "t1", "t2", "t0", "t1", "t2", "t3"]


def test_the_user_s_own_sqlite_rows_commit_with_the_cursor(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    store.create(task("t1"))

    def apply(db: sqlite3.Connection, item: Any) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS mine (id TEXT PRIMARY KEY, status TEXT)")
        db.execute("INSERT OR REPLACE INTO mine VALUES (?, ?)", (item.task_id, item.status))
        if item.status == "removed":
            raise RuntimeError("refuse removals")

    reader = FeedReader(store, SqliteFeedConsumer(tmp_path / "c.db", apply=apply))
    reader.catch_up()
    store.save(task("t1", 2, status=TaskStatus.FAILED), expect_version=1)
    store.prune(keep_terminal=0)
    cursor = reader.consumer.cursor()
    with pytest.raises(RuntimeError):
        reader.step()
    rows = sqlite3.connect(tmp_path / "c.db").execute("SELECT * FROM mine").fetchall()
    assert rows == [("t1", "pending")], "the refused page left no row behind"
    assert reader.consumer.cursor() == cursor


def test_re_applying_is_idempotent_by_task_and_version(consumer_factory: Factory) -> None:
    applied: list[tuple[str, int]] = []
    consumer = consumer_factory(
        lambda txn, item: applied.append((item.task_id, item.status_version))
    )
    page = ChangePage((task("a", 3), task("b", 1)), "2")
    FeedReader(FakeFeed(page), consumer).step()
    replay = ChangePage((task("a", 3), task("b", 2), task("a", 2)), "5")
    with pytest.raises(PageRejected):
        FeedReader(FakeFeed(replay), consumer).step()  # 'a' twice as a live item
    FeedReader(FakeFeed(ChangePage((task("a", 3), task("b", 2)), "4")), consumer).step()
    assert applied == [("a", 3), ("b", 1), ("b", 2)]
    assert consumer.cursor() == "4"


BAD_PAGES: dict[str, Any] = {
    "not a page": {"tasks": [], "next_cursor": "5"},
    "non-canonical cursor": ChangePage((task("a"),), "007"),
    "cursor with a trailing newline": ChangePage((task("a"),), "5\n"),
    "too large": ChangePage(tuple(task(f"t{i}") for i in range(4)), "9"),
    "non-advancing": ChangePage((task("a"),), "3"),
    "backwards": ChangePage((task("a"),), "2"),
    "empty but moving": ChangePage((), "4"),
    "empty and backwards": ChangePage((), "1"),
    "live item twice": ChangePage((task("a"), task("a", 2)), "5"),
    "tombstone after its live item": ChangePage((task("a"), Tombstone("a", T0, "job", 0)), "5"),
}


@pytest.mark.parametrize("why", sorted(BAD_PAGES))
def test_a_bad_page_is_refused_and_the_cursor_does_not_move(
    consumer_factory: Factory, why: str
) -> None:
    consumer = consumer_factory()
    FeedReader(FakeFeed(ChangePage((task("x"), task("y"), task("z")), "3")), consumer).step()
    before = consumer.all_bindings()
    with pytest.raises(PageRejected):
        FeedReader(FakeFeed(BAD_PAGES[why]), consumer, limit=3).step()
    assert consumer.cursor() == "3"
    assert consumer.all_bindings() == before


@pytest.mark.parametrize(
    "item",
    [task("a", 2, name="renamed"), task("a", 2, bucket=9), Tombstone("a", T0, "renamed", 0)],
)
def test_a_task_whose_name_or_bucket_changed_is_a_conflict(
    consumer_factory: Factory, item: Any
) -> None:
    consumer = consumer_factory()
    FeedReader(FakeFeed(ChangePage((task("a"),), "1")), consumer).step()
    with pytest.raises(BindingConflict):
        FeedReader(FakeFeed(ChangePage((task("b"), item), "3")), consumer).step()
    assert consumer.cursor() == "1" and set(consumer.all_bindings()) == {"a"}


def test_a_tombstone_then_a_new_task_with_the_id_in_one_page_is_accepted(
    consumer_factory: Factory,
) -> None:
    consumer = consumer_factory()
    FeedReader(FakeFeed(ChangePage((task("a", 4),), "1")), consumer).step()
    page = ChangePage((Tombstone("a", T0, "job", 0), task("a", 1, name="new", bucket=2)), "3")
    FeedReader(FakeFeed(page), consumer).step()
    assert consumer.all_bindings()["a"] == Binding("new", 2, "pending", 1)


def test_a_store_behind_the_reader_s_cursor_is_an_error_not_a_reset(
    consumer_factory: Factory,
) -> None:
    store = InMemoryTaskStore()
    for i in range(3):
        store.create(task(f"t{i}"))
    consumer = consumer_factory()
    FeedReader(store, consumer).catch_up()
    restored = InMemoryTaskStore()  # "restored from an older backup": one task, head 1
    restored.create(task("t0"))
    with pytest.raises(InvalidCursor):
        FeedReader(restored, consumer).step()
    assert consumer.cursor() == "3"


def test_two_readers_of_one_consumer_store_cannot_both_commit_a_page(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    store.create(task("t1"))
    first = FeedReader(store, SqliteFeedConsumer(tmp_path / "c.db"))
    second = FeedReader(store, SqliteFeedConsumer(tmp_path / "c.db"))
    changes_of_second = second.consumer.cursor()
    first.step()
    page = store.changes(changes_of_second, 256)
    with pytest.raises(PageRejected):
        second.consumer.commit(changes_of_second, [], page.next_cursor)


def test_limit_is_checked() -> None:
    for bad in (0, 257):
        with pytest.raises(ValueError):
            FeedReader(InMemoryTaskStore(), SqliteFeedConsumer(":memory:"), limit=bad)


def test_a_commit_refused_by_a_locked_database_rolls_back_and_the_next_step_works(
    tmp_path: Path,
) -> None:
    store = InMemoryTaskStore()
    store.create(task("t1"))
    consumer = SqliteFeedConsumer(tmp_path / "c.db")
    consumer._db.execute("PRAGMA busy_timeout = 100")
    other = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    other.execute("BEGIN")
    other.execute("SELECT * FROM feed_cursor").fetchall()  # a reader's shared lock
    reader = FeedReader(store, consumer)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        reader.step()
    assert not consumer._db.in_transaction
    other.execute("COMMIT")
    assert consumer.cursor() == "0" and consumer.all_bindings() == {}
    assert reader.step() == 1
    assert consumer.cursor() == "1"
