"""The shipped ``ExtensionsContract`` bound to every store here: ``InMemoryTaskStore``,
``RedisTaskStore`` on a real redis-server and on fakeredis, ``SqliteTaskStore`` (a new file per
test), and the protocol-only ``JsonFileTaskStore`` (which declares no extension: every
extension test returns at once)."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import fakeredis
import pytest

from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.extensions_contract import ExtensionsContract
from tests.json_file_store import JsonFileTaskStore
from tests.support.redis_server import RedisProc
from tests.support.sqlite_files import SQLITE_EXTENSIONS, SqliteFileBinding

MEMORY = frozenset(
    {
        "BatchingStore",
        "FencedTouchStore",
        "ServerClockStore",
        "BucketCountingStore",
        "CommandReadingStore",
        "TaskTypesStore",
        "PagedQueryStore",
        "CommandInspectingStore",
        "TaskPoliciesStore",
        "LimitsStore",
        "SchedulesStore",
        "DependenciesStore",
        "TaskSchemasStore",
        "CommitStartStore",
    }
)
#: The limits are enforced by the in-memory reference and the SQL stores; the others follow.
REDIS = MEMORY | {
    "BucketPoolStore",
    "NudgeStore",
    "RecordedBucketsStore",
    "WorkerBeatsStore",
}
#: The SQL stores implement the task policies too (``SqlTaskStore``, shared by SQLite and
#: PostgreSQL); ``SQLITE_EXTENSIONS`` (tests/support/sqlite_files.py) may not list it yet.
SQLITE = SQLITE_EXTENSIONS | {"TaskPoliciesStore"}


class TestInMemoryExtensions(ExtensionsContract):
    expected_extensions = MEMORY

    def make_store(self) -> TaskStore:
        return InMemoryTaskStore()


class TestRedisExtensions(ExtensionsContract):
    expected_extensions = REDIS
    server: RedisProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, redis_proc: RedisProc) -> None:
        cls.server = redis_proc

    def make_store(self) -> TaskStore:
        return RedisTaskStore.from_url(self.server.url, namespace=f"x-{uuid.uuid4().hex[:12]}")


class TestFakeRedisExtensions(ExtensionsContract):
    expected_extensions = REDIS

    def make_store(self) -> TaskStore:
        client = fakeredis.FakeRedis(decode_responses=False)
        return RedisTaskStore(client, namespace="extensions", check_server=False)


class TestSqliteExtensions(SqliteFileBinding, ExtensionsContract):
    expected_extensions = SQLITE


class TestJsonFileExtensions(ExtensionsContract):
    expected_extensions = frozenset()

    def make_store(self) -> TaskStore:
        self._dir = tempfile.TemporaryDirectory()
        return JsonFileTaskStore(Path(self._dir.name) / "tasks.json")

    def teardown_method(self, method: object) -> None:
        super().teardown_method(method)
        self._dir.cleanup()
