"""The shipped contracts bound to ``PostgresTaskStore`` on a real PostgreSQL server (Debian's,
started by the ``postgres_proc`` fixture): ``StoreContract``, ``ExtensionsContract`` and
``FeedContract``.

Every test gets a schema of its own on one session-wide server, new or one an earlier test gave
back, emptied to exactly what a new schema holds (``tests/support/pg_schemas.py``: creating the
tables was most of a test's cost): schemas are the isolation unit (the namespace), so this also
proves that stores in different schemas of one database never see each other's data (the
other schemas hold what earlier tests left)."""

from __future__ import annotations

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.extensions_contract import ExtensionsContract
from chongming_redis.testing.feed_contract import FeedContract
from chongming_redis.testing.store_contract import StoreContract
from tests.support.pg_schemas import SchemaPool, schema_pool
from tests.support.sqlite_files import SQLITE_EXTENSIONS

#: SQLite's (the SQL stores share every method, ``SqlTaskStore``) and the nudges
#: (``NudgeStore`` on ``LISTEN``/``NOTIFY``: the contract's work-nudge test runs on it).
POSTGRES_EXTENSIONS = SQLITE_EXTENSIONS | {"NudgeStore"}


class _OnPostgres:
    server: PostgresProc
    schemas: SchemaPool

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, postgres_proc: PostgresProc) -> None:
        # Class scope: bound before the function-scoped setup_method creates the store.
        cls.server = postgres_proc
        cls.schemas = schema_pool(postgres_proc.dsn, "c_")

    def make_store(self) -> TaskStore:
        return self.schemas.open(lambda schema: PostgresTaskStore(self.server.dsn, schema=schema))

    def teardown_method(self, method: object) -> None:
        try:
            super().teardown_method(method)  # type: ignore[misc]
        finally:
            self.schemas.release()


class TestPostgresStoreContract(_OnPostgres, StoreContract):
    pass


class TestPostgresExtensions(_OnPostgres, ExtensionsContract):
    expected_extensions = POSTGRES_EXTENSIONS


class TestPostgresFeed(_OnPostgres, FeedContract):
    pass
