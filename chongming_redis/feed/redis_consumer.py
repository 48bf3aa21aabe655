"""``RedisFeedConsumer``: a feed consumer on Redis (the consumer's own Redis, or the same one
under another prefix).

Keys, all under the hash tag ``{prefix}`` so they share a slot: ``{prefix}:cursor`` (string),
``{prefix}:caught-up`` (string "1" once caught up) and ``{prefix}:tasks`` (hash: task id ->
msgpack binding). Every page is one ``WATCH``/``MULTI``/``EXEC`` transaction: the cursor key is
watched, the bindings and the user's own commands (``apply`` queues them on the same
``MULTI`` pipeline) are written with the new cursor — or, if anyone moved the cursor meanwhile,
nothing is written and ``PageRejected`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import redis

from chongming_redis.feed.reader import Binding, Change, Item, PageRejected

#: ``apply(pipeline, item)``: the user's own commands for one item, queued in the page's
#: ``MULTI`` (the pipeline is in transaction mode: queue writes; do not read).
Apply = Callable[[Any, Item], None]


class RedisFeedConsumer:
    def __init__(self, client: redis.Redis, *, prefix: str, apply: Apply | None = None) -> None:
        """``client``: a ``redis.Redis`` with ``decode_responses=False``."""
        tag = "{" + prefix + "}"
        self._client = client
        self._cursor = tag + ":cursor"
        self._caught_up = tag + ":caught-up"
        self._tasks = tag + ":tasks"
        self._apply = apply

    def cursor(self) -> str:
        value = self._client.get(self._cursor)
        return "0" if value is None else value.decode() if isinstance(value, bytes) else str(value)

    def caught_up(self) -> bool:
        return self._client.get(self._caught_up) is not None

    def mark_caught_up(self) -> None:
        self._client.set(self._caught_up, "1")

    def bindings(self, task_ids: list[str]) -> dict[str, Binding]:
        ids = sorted(set(task_ids))
        if not ids:
            return {}
        values = self._client.hmget(self._tasks, ids)
        return {i: _binding(v) for i, v in zip(ids, values) if v is not None}

    def all_bindings(self) -> dict[str, Binding]:
        raw = self._client.hgetall(self._tasks)
        return {(k.decode() if isinstance(k, bytes) else k): _binding(v) for k, v in raw.items()}

    def commit(self, expect_cursor: str, changes: list[Change], next_cursor: str) -> None:
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self._cursor)  # type: ignore[no-untyped-call]
                stored: Any = pipe.get(self._cursor)
                stored_text = "0" if stored is None else bytes(stored).decode()
                if stored_text != expect_cursor:
                    raise PageRejected(
                        f"the cursor moved under this reader: {expect_cursor} -> {stored_text}"
                    )
                pipe.multi()
                for change in changes:
                    b = change.binding
                    packed = msgpack.packb(
                        [b.name, b.bucket, b.status, b.status_version, b.removed]
                    )
                    pipe.hset(self._tasks, change.item.task_id, packed)
                    if self._apply is not None:
                        self._apply(pipe, change.item)
                pipe.set(self._cursor, next_cursor)
                pipe.execute()
            except redis.WatchError:
                raise PageRejected("the cursor moved under this reader (WATCH)") from None


def _binding(value: Any) -> Binding:
    name, bucket, status, version, removed = msgpack.unpackb(value)
    return Binding(name, bucket, status, version, removed)
