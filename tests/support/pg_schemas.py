"""Schemas to reuse for tests that each want a new, empty ``PostgresTaskStore``: creating a
schema (its tables and indexes) is most of what such a test costs on the server.

``SchemaPool.open(make)`` gives a store from ``make(schema)`` on a schema that holds exactly
what a new one holds: either a new schema (the store creates it, and every row of every table
is recorded right then: its ``pristine`` rows, the meta and schema-version rows), or one a
finished test gave back with ``release``, emptied first: every row deleted, the pristine rows
put back, and every table checked to hold exactly those. The schema has no sequence or
AUTOINCREMENT counter a deleted row leaves behind (checked when it is first recorded), so to
the store and to its test it is a new schema. A schema is only taken again after the test
that used it gave it back, so the stores of one test are in different schemas, and the other
schemas of the database still hold what earlier tests left until they are taken again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql

S = TypeVar("S")
Rows = dict[str, list[tuple[Any, ...]]]


class SchemaPool:
    def __init__(self, dsn: str, prefix: str) -> None:
        self.dsn = dsn
        self.prefix = prefix
        self._db: psycopg.Connection[Any] | None = None
        self._pristine: dict[str, Rows] = {}
        self._free: list[str] = []
        self._taken: list[str] = []

    def _reader(self) -> psycopg.Connection[Any]:
        if self._db is None or self._db.closed:
            self._db = psycopg.connect(self.dsn, autocommit=True)
            # A store left open on a schema given back cannot hang emptying it: fail instead.
            self._db.execute("SET lock_timeout = '20s'")
        return self._db

    def rows(self, schema: str) -> Rows:
        db = self._reader()
        found: Rows = {}
        tables = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema])
        for (table,) in tables.fetchall():
            select = sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, table))
            found[table] = sorted(db.execute(select).fetchall(), key=repr)
        return found

    def open(self, make: Callable[[str], S]) -> S:
        if self._free:
            schema = self._free.pop()
            self._empty(schema)
            self._taken.append(schema)
            return make(schema)
        schema = f"{self.prefix}{uuid.uuid4().hex[:12]}"
        store = make(schema)
        self._taken.append(schema)
        (sequences,) = self._reader().execute(
            "SELECT count(*) FROM information_schema.sequences WHERE sequence_schema = %s",
            [schema],
        ).fetchone() or (0,)
        if sequences == 0:  # otherwise never reused
            self._pristine[schema] = self.rows(schema)
        return store

    def release(self) -> None:
        """Every schema taken since the last ``release`` may be taken again (its stores are
        closed, or will not be used again)."""
        self._free.extend(s for s in self._taken if s in self._pristine)
        self._taken.clear()

    def _empty(self, schema: str) -> None:
        pristine = self._pristine[schema]
        db = self._reader()
        with db.transaction():
            for table in self.rows(schema):
                db.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
            for table, rows in pristine.items():
                for row in rows:
                    insert = sql.SQL("INSERT INTO {} VALUES ({})").format(
                        sql.Identifier(schema, table),
                        sql.SQL(", ").join(sql.Placeholder() * len(row)),
                    )
                    db.execute(insert, row)
        assert self.rows(schema) == pristine, f"schema {schema} is not back to what it held new"


_POOLS: dict[tuple[str, str], SchemaPool] = {}


def schema_pool(dsn: str, prefix: str) -> SchemaPool:
    """This process's pool of schemas named ``prefix...`` on the server at ``dsn``."""
    return _POOLS.setdefault((dsn, prefix), SchemaPool(dsn, prefix))
