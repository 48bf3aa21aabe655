"""The shipped contracts bound to ``PostgresTaskStore`` on a real PostgreSQL server (Debian's,
started by the ``postgres_proc`` fixture): ``StoreContract``, ``ExtensionsContract`` and
``FeedContract``.

Every test gets a fresh schema on one session-wide server: schemas are the isolation unit (the
namespace), so this also proves that stores in different schemas of one database never see
each other's data."""

from __future__ import annotations

import uuid

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.extensions_contract import ExtensionsContract
from chongming_redis.testing.feed_contract import FeedContract
from chongming_redis.testing.store_contract import StoreContract
from tests.support.sqlite_files import SQLITE_EXTENSIONS

#: Every extension but the Redis pub/sub nudges (``NudgeStore``): the runtime polls instead.
#: The SQL stores share every method (``SqlTaskStore``), so they implement the same set.
POSTGRES_EXTENSIONS = SQLITE_EXTENSIONS


class _OnPostgres:
    server: PostgresProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, postgres_proc: PostgresProc) -> None:
        # Class scope: bound before the function-scoped setup_method creates the store.
        cls.server = postgres_proc

    def make_store(self) -> TaskStore:
        return PostgresTaskStore(self.server.dsn, schema=f"c_{uuid.uuid4().hex[:12]}")


class TestPostgresStoreContract(_OnPostgres, StoreContract):
    pass


class TestPostgresExtensions(_OnPostgres, ExtensionsContract):
    expected_extensions = POSTGRES_EXTENSIONS


class TestPostgresFeed(_OnPostgres, FeedContract):
    pass
