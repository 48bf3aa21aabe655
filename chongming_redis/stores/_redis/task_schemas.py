"""The published parameter schemas on Redis (``TaskSchemasStore``): one hash, ``{ns}:schemas``,
task type -> ``{"at": µs, "schema": text}`` (JSON). A publication is one ``HSET`` of every
name in a ``MULTI``/``EXEC`` (all or nothing, the last write of a name wins); a read is one
``HGETALL`` or ``HMGET``. The plans serve both stores: ``RedisTaskStore`` mixes in
``RedisTaskSchemas``, ``AsyncRedisTaskStore`` (a producer's) drives ``task_schemas``.

Like ``record_limits``' ``MULTI``, the publication is not followed by ``WAIT`` under
``durability_replicas`` (only scripts and ``WRITING_READS`` are): a failover right after a
worker started may lose it, and producers then check against what the replica held until the
next worker start publishes again."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from chongming_redis.errors import CorruptRecord
from chongming_redis.stores._redis import ops
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.stores.task_schema_store import PublishedSchema, check_names, check_record

T = TypeVar("T")


def record_task_schemas(keys: Keys, schemas: object, now: object) -> ops.Plan[None]:
    checked, moment = check_record(schemas, now)
    if not checked:
        return
    at = encode_dt(moment)
    values = {name: json.dumps({"at": at, "schema": t}) for name, t in checked.items()}
    key = keys.task_schemas
    (reply,) = yield ops.Transaction(key, (ops.Read(key, "hset", (key, None, None, values)),))
    if isinstance(reply, Exception):  # WRONGTYPE: the key holds something else
        with ops.errors(key):
            raise reply


def task_schemas(keys: Keys, names: object) -> ops.Plan[dict[str, PublishedSchema]]:
    wanted = check_names(names)
    key = keys.task_schemas
    if wanted is None:
        raw: dict[Any, Any] = yield ops.Read(key, "hgetall", (key,))
        found = {text(name, key): value for name, value in raw.items()}
    elif not wanted:
        return {}
    else:
        values = yield ops.Read(key, "hmget", (key, *wanted))
        found = {n: v for n, v in zip(wanted, values, strict=True) if v is not None}
    return {name: _decode(key, name, value) for name, value in found.items()}


def _decode(key: str, name: str, value: bytes | str) -> PublishedSchema:
    try:
        record = json.loads(text(value, key))
        return PublishedSchema(str(record["schema"]), decode_dt(int(record["at"])))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(key, name, f"not a published schema: {exc}") from None


class RedisTaskSchemas:
    """``TaskSchemasStore`` for ``RedisTaskStore`` (a base of it)."""

    keys: Keys

    if TYPE_CHECKING:  # provided by RedisTaskStore

        def _perform(self, plan: ops.Plan[T]) -> T: ...

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        """Publish the schemas: one ``HSET`` of ``{ns}:schemas`` in a ``MULTI``."""
        self._perform(record_task_schemas(self.keys, schemas, now))

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        """The published schemas: one ``HGETALL`` (every name) or ``HMGET`` of ``{ns}:schemas``."""
        return self._perform(task_schemas(self.keys, names))
