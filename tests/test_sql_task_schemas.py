"""The published parameter schemas on the SQL stores (``TaskSchemasStore``,
``_sql/task_schemas.py``), on SQLite and PostgreSQL, where the shipped contract cannot look: a
version-7 database (before the ``task_schemas`` table) upgrades to version 8, keeps its rows and
takes publications; a reopened one migrates nothing more and reads them back; the text is a
text column (SQLite), kept as given."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_redis.stores._sql.schema import SCHEMA_VERSION
from chongming_redis.stores.task_schema_store import PublishedSchema
from chongming_redis.testing.contract.support import at
from tests.test_sql_task_policies import OLD_ROWS, Database, _old_database

SCHEMA = '{"properties": {"x": {"type": "integer"}}, "type": "object", "title": "Größe"}'


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    made = Database(request, tmp_path)
    yield made
    made.close()


def test_a_version_7_database_upgrades_and_takes_publications(database: Database) -> None:
    _old_database(database, 7)
    store = database.open()
    try:
        versions = [v for (v,) in database.raw("SELECT version FROM schema_version")]
        assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 8
        assert store.query() == OLD_ROWS
        assert store.task_schemas() == {}
        store.record_task_schemas({"echo": SCHEMA, "free": "{}"}, now=at(1))
        store.record_task_schemas({"echo": "{}"}, now=at(2))  # the last write wins
        store.record_task_schemas({"echo": SCHEMA}, now=at(3))
    finally:
        store.close()
    again = database.open()  # reopening migrates nothing more
    try:
        assert [v for (v,) in database.raw("SELECT version FROM schema_version")] == list(
            range(1, SCHEMA_VERSION + 1)
        )
        assert again.task_schemas() == {
            "echo": PublishedSchema(SCHEMA, at(3)),
            "free": PublishedSchema("{}", at(1)),
        }
        assert database.raw("SELECT COUNT(*) FROM task_schemas") == [(2,)]
        if database.kind == "sqlite":  # valid text is stored as text
            assert database.raw("SELECT params_schema FROM task_schemas WHERE name = ?",
                                ["echo"]) == [(SCHEMA,)]  # fmt: skip
    finally:
        again.close()
