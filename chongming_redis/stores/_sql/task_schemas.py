"""``SqlTaskSchemas``: the published parameter schemas (``TaskSchemasStore`` in
``stores/task_schema_store.py``) of every SQL store, mixed into ``SqlTaskStore``; the table is
``schema._v8``'s (``task_schemas``: ``name``, ``params_schema``, ``published_at`` µs). A
publication is one write transaction of one upsert per name (all or nothing; the last write of
a name wins), a read one ``SELECT``."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import integer, text
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.stores.task_schema_store import PublishedSchema, check_names, check_record

_UPSERT = (
    "INSERT INTO task_schemas (name, params_schema, published_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET params_schema = excluded.params_schema,"
    " published_at = excluded.published_at"
)


class SqlTaskSchemas:
    if TYPE_CHECKING:  # provided by SqlTaskStore

        def _writing(self) -> AbstractContextManager[tuple[Tx, FeedPositions]]: ...

        def _reading(self) -> AbstractContextManager[Tx]: ...

        def _check_open(self) -> None: ...

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        """``TaskSchemasStore``: one upsert per name, in one write transaction."""
        checked, moment = check_record(schemas, now)
        if not checked:
            self._check_open()
            return
        at = encode_dt(moment)
        with self._writing() as (tx, _):
            for name in sorted(checked):
                tx.run(_UPSERT, [name, checked[name], at])

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        wanted = check_names(names)
        if wanted == []:
            self._check_open()
            return {}
        sql = "SELECT name, params_schema, published_at FROM task_schemas"
        params: list[object] = []
        with self._reading() as tx:
            if wanted is not None:
                condition, params = tx.dialect.member_of("name", wanted)
                sql += f" WHERE {condition}"
            rows = tx.rows(sql, params)
        return {
            text(name): PublishedSchema(
                text(schema), decode_dt(integer(at, f"task_schemas/{text(name)}", "published_at"))
            )
            for name, schema, at in rows
        }
