"""The in-memory reference of the published parameter schemas (``TaskSchemasStore``,
``stores/task_schema_store.py``): one dict, name -> ``(text, µs)``, written whole under the
store's lock, so a call is all or nothing and the last write of a name wins."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.stores.task_schema_store import PublishedSchema, check_names, check_record

if TYPE_CHECKING:
    from contextlib import AbstractContextManager


class MemoryTaskSchemas:
    """Mixed into ``InMemoryTaskStore``; every method runs under the store's lock."""

    _task_schemas: dict[str, tuple[str, int]]

    if TYPE_CHECKING:

        def _open(self) -> AbstractContextManager[None]: ...

    def _init_task_schemas(self) -> None:
        self._task_schemas = {}

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        checked, moment = check_record(schemas, now)
        at = encode_dt(moment)
        with self._open():
            self._task_schemas.update((name, (text, at)) for name, text in checked.items())

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        wanted = check_names(names)
        with self._open():
            chosen = self._task_schemas if wanted is None else {
                n: self._task_schemas[n] for n in wanted if n in self._task_schemas}  # fmt: skip
            return {n: PublishedSchema(text, decode_dt(at)) for n, (text, at) in chosen.items()}
