"""``AsyncRedisTaskStore`` on Redis Cluster: ``_redis.cluster``'s calls on ``redis.asyncio``.

The same rules as the sync store's (see ``_redis.cluster``): scripts by ``EVALSHA`` on the
namespace's slot, loaded where a master lacks them (``NOSCRIPT``); a call refused while the
slot migrates (``TRYAGAIN``, redis-py's "TTL exhausted") sent again for up to
``MIGRATION_WAIT`` seconds; ``TIME`` and ``HELLO`` of the slot's master; under
``durability_replicas`` each write, its barrier and ``WAIT`` in one pipeline on a connection
of the slot's master (the cluster client's own node, ``ClusterNode.execute_pipeline``), a
``MOVED``/``ASK``/``TRYAGAIN`` reply never taken for a success. The client connects at its
first call, as the single-server async store does; an unreachable cluster is then
``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import redis
from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.commands.core import AsyncScript

from chongming_redis.stores._redis import cluster as sync
from chongming_redis.stores._redis.connect import client_from_url
from chongming_redis.stores._redis.durability import RawCommand, WaitForReplicas
from chongming_redis.stores._redis.server import hello_supports_flags

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
        return client_from_url(AsyncRedisCluster.from_url, url, Retry,
                               socket_timeout=socket_timeout, retries=retries,
                               socket_connect_timeout=socket_connect_timeout,
                               **options)  # fmt: skip
    except redis.exceptions.RedisClusterException as exc:
        raise sync.cluster_error(url, exc) from exc


class AsyncClusterCalls:
    """The asyncio twin of ``_redis.cluster.ClusterCalls``."""

    def __init__(self, client: AsyncRedisCluster, key: str, url: str = "") -> None:
        self.client: Any = client  # redis-py's cluster methods are untyped
        self.key = key
        self.url = url

    @classmethod
    def of(cls, client: object, key: str) -> AsyncClusterCalls | None:
        return cls(client, key) if isinstance(client, AsyncRedisCluster) else None

    async def ready(self) -> None:
        """Connect if not yet: an unreachable cluster is ``StoreUnavailable``, a server that
        is not a cluster node ``StoreError`` (``_redis.cluster.cluster_error``)."""
        try:
            await self.client.initialize()
        except redis.exceptions.RedisClusterException as exc:
            raise sync.cluster_error(self.url, exc) from exc

    async def node(self) -> Any:
        """The master of the namespace's slot."""
        await self.ready()
        return self.client.get_node_from_key(self.key)

    async def eval(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any],
        rule: WaitForReplicas | None = None,
    ) -> Any:  # fmt: skip
        """``EVALSHA`` routed by ``keys``; under ``rule`` with its barrier and ``WAIT``, in one
        pipeline on the slot's master (``_redis.cluster.ClusterCalls.eval``)."""
        await self.ready()
        if rule is not None:
            return await during_migration(lambda: self._on_master(rule, script, keys, args))
        return await during_migration(lambda: self._evalsha(script, keys, args))

    async def _on_master(
        self, rule: WaitForReplicas, script: AsyncScript, keys: Sequence[str],
        args: Sequence[Any],
    ) -> Any:  # fmt: skip
        """``ClusterCalls.on_master`` for the asyncio client: ``MOVED`` updates the slot map
        and is raised; a lost connection or ``CLUSTERDOWN`` refreshes it and sends again."""
        retries = self.client.retry.get_retries()
        attempt = 0
        while True:
            try:
                node = self.client.get_node_from_key(self.key)
                return await rule.evalsha_via_async(
                    partial(_send_on, node), partial(self._load, script, node), script,
                    list(keys), list(args),
                )  # fmt: skip
            except redis.exceptions.MovedError as moved:
                await self.client.nodes_manager.move_slot(moved)
                raise
            except sync.REFRESH_ERRORS:
                if attempt >= retries:
                    raise
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            attempt += 1
            with contextlib.suppress(*sync.UNREFRESHED):  # the next attempt says what is wrong
                await self.client.nodes_manager.initialize()

    async def _load(self, script: AsyncScript, node: ClusterNode) -> str:
        await self.client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
        return script.sha  # the SHA1 of its text, wherever it is loaded

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

    async def read(self, method: str, args: tuple[Any, ...]) -> Any:
        """``ClusterCalls.read`` for coroutines: ``TIME`` of the slot's master, any other plain
        command routed by its key and sent again while the slot migrates. (No writing read:
        the async store drives none, ``_redis.durability.WRITING_READS``.)"""
        if method == "time":
            return await self.time()
        return await self.call(lambda: getattr(self.client, method)(*args))

    async def supports_script_flags(self) -> bool:
        try:
            hello = await self.client.execute_command("HELLO", target_nodes=await self.node())
        except redis.exceptions.ResponseError:
            return False
        return hello_supports_flags(hello)


async def _send_on(node: ClusterNode, commands: list[RawCommand]) -> list[Any]:
    """``commands`` in one round trip on one connection of ``node``; a refused one's reply
    is its exception."""
    queued = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
    await node.execute_pipeline(queued)
    return [command.result for command in queued]


async def during_migration(call: Callable[[], Awaitable[T]]) -> T:
    """``_redis.cluster.during_migration`` for coroutines."""
    deadline = time.monotonic() + sync.MIGRATION_WAIT
    delay = 0.005
    while True:
        try:
            return await call()
        except sync.MIGRATION_ERRORS as exc:
            if not sync.is_migrating(exc) or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
