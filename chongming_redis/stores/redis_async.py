"""``AsyncRedisStore``: what a producer needs of the Redis store, on ``redis.asyncio``.

The subset ``AsyncClient`` uses — ``get``, ``query``, ``counts``, ``history``,
``commit_tasks``, ``submit_command``, ``get_command``, ``recorded_num_buckets``,
``server_time`` and the nudges — each an ``await``-able call with the same arguments, checks,
replies and exceptions as ``RedisTaskStore``'s: both drive the same operations of
``_redis.ops`` (which build the requests and decode the replies) with their own I/O, and run
the same Lua scripts. It never claims commands or starts tasks.

The connection is made at the first call (``from_url`` does no I/O); the first script call
also asks the server whether it understands script flags (Redis >= 7: read-only scripts go
through ``EVALSHA_RO``). Unlike ``RedisTaskStore`` it does not check the server's durability
settings: the workers' stores warn about those.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.commands.core import AsyncScript

from chongming_redis.errors import StoreClosed, StoreError
from chongming_redis.model import Command, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._redis import ops, replies
from chongming_redis.stores._redis.cluster_async import AsyncClusterCalls, connect_cluster_async
from chongming_redis.stores._redis.connect import client_from_url
from chongming_redis.stores._redis.durability import barrier, wait_rule
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.scripts import READ_ONLY_SCRIPTS, script_text
from chongming_redis.stores._redis.sentinel import async_sentinel_client, is_sentinel_url
from chongming_redis.stores._redis.server import hello_supports_flags

__all__ = ["AsyncRedisStore"]

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")


class AsyncRedisStore:
    """The producer's calls of ``RedisTaskStore`` on one Redis database, isolated by
    ``namespace``, for asyncio. ``client`` must be a ``redis.asyncio.Redis`` created with
    ``decode_responses=False``; ``from_url`` makes one with bounded timeouts and retries."""

    def __init__(
        self,
        client: redis.asyncio.Redis | AsyncRedisCluster,
        *,
        namespace: str,
        owns_client: bool = False,
        durability_replicas: int = 0,
        durability_timeout: float | None = None,
    ) -> None:
        kwargs = client.get_connection_kwargs()
        if kwargs.get("decode_responses"):
            raise ValueError("AsyncRedisStore needs a client with decode_responses=False")
        self.keys = Keys(namespace)
        #: On Redis Cluster: the calls routed to the namespace's slot (``_redis.cluster_async``).
        self._cluster = AsyncClusterCalls.of(client, self.keys.root)
        #: ``durability_replicas``: writes wait for replicas, as ``RedisTaskStore``'s
        #: (``_redis.durability``; not checked at open: the first write says it).
        self.wait_rule = wait_rule(durability_replicas, durability_timeout,
                                   kwargs.get("socket_timeout"),
                                   barrier(self.keys, cluster=bool(self._cluster)))  # fmt: skip
        self._client: redis.asyncio.Redis = client  # type: ignore[assignment]
        self._owns_client = owns_client
        self._closed = False
        #: Whether the server predates script flags (``None``: not asked yet).
        self.legacy_scripts: bool | None = None
        self._scripts: dict[str, AsyncScript] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 2.0,
        retries: int = 3,
        durability_replicas: int = 0,
        durability_timeout: float | None = None,
        cluster: bool = False,
        **options: Any,
    ) -> AsyncRedisStore:
        """A store on ``url`` (``redis://``, ``rediss://``, ``unix://`` or
        ``redis+sentinel://``), connected at its first call. A call fails with
        ``StoreUnavailable`` after at most about ``(retries + 1) * (socket_timeout +
        socket_connect_timeout)`` seconds. ``durability_replicas``: as ``RedisTaskStore``'s.
        ``cluster=True``: ``url`` names a node of a Redis Cluster (``_redis.cluster_async``)."""
        Keys(namespace)  # refuse a bad namespace before anything else
        if cluster:
            made = connect_cluster_async(url, socket_timeout=socket_timeout, retries=retries,
                                         socket_connect_timeout=socket_connect_timeout,
                                         **options)  # fmt: skip
            store = cls(made, namespace=namespace, owns_client=True,
                        durability_replicas=durability_replicas,
                        durability_timeout=durability_timeout)  # fmt: skip
            store._cluster.url = url  # type: ignore[union-attr]  # for its connection errors
            return store
        make = async_sentinel_client if is_sentinel_url(url) else redis.asyncio.Redis.from_url
        client = client_from_url(make, url, Retry, socket_timeout=socket_timeout, retries=retries,
                                 socket_connect_timeout=socket_connect_timeout,
                                 **options)  # fmt: skip
        return cls(client, namespace=namespace, owns_client=True,
                   durability_replicas=durability_replicas,
                   durability_timeout=durability_timeout)  # fmt: skip

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    @property
    def client(self) -> redis.asyncio.Redis:
        return self._client

    # -- the calls (``RedisTaskStore``'s, awaitable) -----------------------------------------

    async def get(self, task_id: str) -> TaskSnapshot | None:
        return await self._perform(ops.get_task(self.keys, task_id))

    async def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return await self._perform(ops.query(self.keys, query))

    async def counts(self) -> dict[TaskStatus, int]:
        return await self._perform(ops.counts(self.keys))

    async def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        return await self._perform(ops.history(self.keys, task_id, since_version))

    async def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """``BatchingStore.commit_tasks``: per item ``None``, or the ``ConcurrencyConflict``
        / ``TaskAlreadyExists`` it met (that item wrote nothing)."""
        return await self._perform(ops.commit_tasks(self.keys, items))

    async def submit_command(self, command: Command) -> None:
        await self._perform(ops.submit_command(self.keys, command))

    async def get_command(self, command_id: str) -> Command | None:
        return await self._perform(ops.get_command(self.keys, command_id))

    async def recorded_num_buckets(self) -> int | None:
        return await self._perform(ops.recorded_num_buckets(self.keys))

    async def task_types(self) -> frozenset[str]:
        return await self._perform(ops.task_types(self.keys))

    async def server_time(self) -> datetime:
        return await self._perform(ops.server_time(self.keys))

    async def publish(self, topic: str) -> None:
        """Nudge ``topic`` (``runtime/notify.py``): fire and forget, a lost nudge only delays
        the reaction to the next poll."""
        self._check_open()
        try:
            await self._client.publish(self.keys.nudge(topic), b"1")
        except redis.exceptions.RedisError as exc:
            log.debug("nudge %s not published: %s", topic, exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    # -- I/O -----------------------------------------------------------------------------------

    async def _perform(self, plan: ops.Plan[T]) -> T:
        """Run an operation of ``_redis.ops`` with this store's I/O (see its docstring)."""
        reply: Any = None
        requested = False
        while True:
            try:
                request = plan.send(reply)
            except StopIteration as done:
                if not requested:
                    self._check_open()
                return done.value  # type: ignore[no-any-return]
            requested = True
            reply = await self._request(request)

    async def _request(self, request: ops.Request) -> Any:
        self._check_open()
        if isinstance(request, ops.Read):
            with ops.errors(request.key):
                return await self._read(request)
        return replies.check(request.call, await self._eval(request))

    async def _read(self, request: ops.Read) -> Any:
        def call() -> Any:
            return getattr(self._client, request.method)(*request.args)

        if self._cluster is None:
            return await call()
        if request.method == "time":  # the slot master's clock
            return await self._cluster.time()
        return await self._cluster.call(call)

    async def _eval(self, request: ops.Script) -> list[Any]:
        keys, args = request.keys, request.args
        with ops.errors():
            script = await self._script(request.name)
            if self._cluster is not None:
                rule = None if request.name in READ_ONLY_SCRIPTS else self.wait_rule
                reply = await self._cluster.eval(script, keys, args, rule)
            elif request.name in READ_ONLY_SCRIPTS and not self.legacy_scripts:
                reply = await self._evalsha_ro(script, keys, args)
            elif self.wait_rule is not None and request.name not in READ_ONLY_SCRIPTS:
                reply = await self.wait_rule.evalsha_async(self._client, script, keys, args)
            else:
                reply = await script(keys=keys, args=args)
        reply[0] = text(reply[0])
        return reply  # type: ignore[no-any-return]

    async def _evalsha_ro(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._client.evalsha_ro(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self._client.evalsha_ro(script.sha, len(keys), *keys, *args)

    async def _script(self, name: str) -> AsyncScript:
        """The registered script (registered once, after asking the server for flags)."""
        if self.legacy_scripts is None:
            self.legacy_scripts = not await self._supports_script_flags()
        script = self._scripts.get(name)
        if script is None:
            text_ = script_text(name, legacy=self.legacy_scripts)
            script = self._scripts[name] = self._client.register_script(text_)
        return script

    async def _supports_script_flags(self) -> bool:
        """As ``_redis.server.supports_script_flags``: Redis >= 7 (fakeredis is not asked)."""
        if type(self._client).__module__.startswith("fakeredis"):
            return False
        if self._cluster is not None:
            return await self._cluster.supports_script_flags()
        try:
            hello = await self._client.execute_command("HELLO")  # type: ignore[no-untyped-call]
        except redis.exceptions.ResponseError:
            return False
        return hello_supports_flags(hello)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()
