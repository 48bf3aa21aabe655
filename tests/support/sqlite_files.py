"""A fresh ``SqliteTaskStore`` per test, in a temporary directory removed afterwards: the
binding every shipped suite (``StoreContract``, ``ExtensionsContract``, ``FeedContract``) uses
for SQLite. A file, never ``:memory:`` (refused: a private database is not a shared store)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from chongming_redis.stores.sqlite import SqliteTaskStore

#: What ``SqliteTaskStore`` implements beyond the protocol (``ExtensionsContract``).
SQLITE_EXTENSIONS = frozenset(
    {
        "BatchingStore",
        "FencedTouchStore",
        "ServerClockStore",
        "BucketCountingStore",
        "BucketPoolStore",
        "CommandReadingStore",
        "RecordedBucketsStore",
        "TaskTypesStore",
        "PagedQueryStore",
        "CommandInspectingStore",
        "WorkerBeatsStore",
        "TaskPoliciesStore",
        "LimitsStore",
        "SchedulesStore",
        "DependenciesStore",
        "TaskSchemasStore",
    }
)


class SqliteFileBinding:
    """Mixin for a contract binding: ``make_store`` opens a new database file per test."""

    _sqlite_dir: tempfile.TemporaryDirectory[str]

    def make_store(self) -> SqliteTaskStore:
        self._sqlite_dir = tempfile.TemporaryDirectory(prefix="chongming-sqlite-")
        return SqliteTaskStore(Path(self._sqlite_dir.name) / "tasks.sqlite3")

    def teardown_method(self, method: object) -> None:
        super().teardown_method(method)  # type: ignore[misc]  # the contract closes the store
        self._sqlite_dir.cleanup()
