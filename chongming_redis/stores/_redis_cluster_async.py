"""``AsyncRedisStore`` on Redis Cluster: ``_redis_cluster``'s calls on ``redis.asyncio``.

The same rules as the sync store's (see ``_redis_cluster``): scripts by ``EVALSHA`` on the
namespace's slot, loaded where a master lacks them (``NOSCRIPT``); a call refused while the
slot migrates (``TRYAGAIN``, redis-py's "TTL exhausted") sent again for up to
``MIGRATION_WAIT`` seconds; ``TIME`` and ``HELLO`` of the slot's master. The client connects at
its first call, as the single-server async store does; an unreachable cluster is then
``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript

from chongming_redis.stores import _redis_cluster as sync
from chongming_redis.stores._redis_server import hello_supports_flags

T = TypeVar("T")


def connect_cluster_async(
    url: str,
    *,
    socket_timeout: float,
    socket_connect_timeout: float,
    retries: int,
    **options: Any,
) -> AsyncRedisCluster:
    """An asyncio ``RedisCluster`` from one node's URL; connects at its first call. A bad
    URL (``unix://``, a database other than 0) is ``ValueError`` here."""
    try:
        return AsyncRedisCluster.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
            decode_responses=False,
            **options,
        )
    except ValueError as exc:
        raise ValueError(f"bad Redis URL {url!r}: {exc}") from None
    except redis.exceptions.RedisClusterException as exc:
        raise sync.cluster_error(url, exc) from exc


class AsyncClusterCalls:
    """The asyncio twin of ``_redis_cluster.ClusterCalls``."""

    def __init__(self, client: AsyncRedisCluster, key: str, url: str = "") -> None:
        self.client: Any = client  # redis-py's cluster methods are untyped
        self.key = key
        self.url = url

    @classmethod
    def of(cls, client: object, key: str) -> AsyncClusterCalls | None:
        return cls(client, key) if isinstance(client, AsyncRedisCluster) else None

    async def ready(self) -> None:
        """Connect if not yet: an unreachable cluster is ``StoreUnavailable``, a server that
        is not a cluster node ``StoreError`` (``_redis_cluster.cluster_error``)."""
        try:
            await self.client.initialize()
        except redis.exceptions.RedisClusterException as exc:
            raise sync.cluster_error(self.url, exc) from exc

    async def node(self) -> Any:
        """The master of the namespace's slot."""
        await self.ready()
        return self.client.get_node_from_key(self.key)

    async def eval(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        await self.ready()
        return await during_migration(lambda: self._evalsha(script, keys, args))

    async def _evalsha(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        loads = 0
        while True:
            try:
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                loads += 1
                if loads > sync.SCRIPT_LOADS:
                    raise
                nodes = [await self.node()] if loads == 1 else self.client.get_primaries()
                for node in nodes:
                    try:
                        await self.client.execute_command("SCRIPT LOAD", script.script,
                                                          target_nodes=node)  # fmt: skip
                    except redis.exceptions.ConnectionError:
                        continue  # a master that is down runs nothing: it needs no script

    async def call(self, call: Callable[[], Awaitable[T]]) -> T:
        await self.ready()
        return await during_migration(call)

    async def time(self) -> Any:
        return await self.client.execute_command("TIME", target_nodes=await self.node())

    async def supports_script_flags(self) -> bool:
        try:
            hello = await self.client.execute_command("HELLO", target_nodes=await self.node())
        except redis.exceptions.ResponseError:
            return False
        return hello_supports_flags(hello)


async def during_migration(call: Callable[[], Awaitable[T]]) -> T:
    """``_redis_cluster.during_migration`` for coroutines."""
    deadline = time.monotonic() + sync.MIGRATION_WAIT
    delay = 0.005
    while True:
        try:
            return await call()
        except (redis.exceptions.TryAgainError, redis.exceptions.ClusterError) as exc:
            if not sync.is_migrating(exc) or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
