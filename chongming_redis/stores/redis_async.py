"""``AsyncRedisTaskStore``: what a producer needs of the Redis store, on ``redis.asyncio``.

The subset ``AsyncClient`` uses — ``get``, ``query``, ``counts``, ``history``,
``commit_tasks``, ``submit_command``, ``get_command``, ``recorded_num_buckets``,
``task_types``, ``task_schemas``, ``limit_definitions``, ``server_time`` and the nudges — each
an ``await``-able call with the same arguments, checks, replies and exceptions as
``RedisTaskStore``'s: both drive the same plans of ``_redis.ops`` (which build the requests and
decode the replies) by the same rules (``_redis.driver``, their common base), each with its own
I/O, and run the same Lua scripts. It never claims commands or starts tasks.

The connection is made at the first call (``from_url`` does no I/O); the first script call
also asks the server whether it understands script flags (Redis >= 7: read-only scripts go
through ``EVALSHA_RO``). Unlike ``RedisTaskStore`` it does not check the server's durability
settings: the workers' stores warn about those.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.commands.core import AsyncScript

from chongming_redis.errors import StoreError
from chongming_redis.model import Command, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._redis import driver, ops, replies
from chongming_redis.stores._redis.cluster_async import AsyncClusterCalls, connect_cluster_async
from chongming_redis.stores._redis.connect import connect_async
from chongming_redis.stores._redis.durability import WaitForReplicas
from chongming_redis.stores._redis.scripts import script_text
from chongming_redis.stores._redis.server import hello_supports_flags
from chongming_redis.stores._redis.task_schemas import task_schemas
from chongming_redis.stores.task_schema_store import PublishedSchema

__all__ = ["AsyncRedisStore", "AsyncRedisTaskStore"]

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")


class AsyncRedisTaskStore(driver.Driver[AsyncClusterCalls]):
    """The producer's calls of ``RedisTaskStore`` on one Redis database, isolated by
    ``namespace``, for asyncio. ``client`` must be a ``redis.asyncio.Redis`` created with
    ``decode_responses=False``; ``from_url`` makes one with bounded timeouts and retries."""

    #: Its create and commit scripts are the Redis store's: they keep unique ids (refused as
    #: ``UniqueTaken``), though it offers no ``TaskPoliciesStore`` reads (a producer's store).
    keeps_unique_ids = True
    keeps_dependencies = True

    def __init__(
        self,
        client: redis.asyncio.Redis | AsyncRedisCluster,
        *,
        namespace: str,
        owns_client: bool = False,
        durability_replicas: int = 0,
        durability_timeout: float | None = None,
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("AsyncRedisTaskStore needs a client with decode_responses=False")
        # durability_replicas: not checked at open, unlike RedisTaskStore's (the first write
        # says it); legacy_scripts: asked at the first script call.
        super().__init__(client, AsyncClusterCalls.of, namespace=namespace,
                         owns_client=owns_client, durability_replicas=durability_replicas,
                         durability_timeout=durability_timeout)  # fmt: skip
        self._client: redis.asyncio.Redis = client  # type: ignore[assignment]
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
    ) -> AsyncRedisTaskStore:
        """A store on ``url`` (``redis://``, ``rediss://``, ``unix://`` or
        ``redis+sentinel://``), connected at its first call. A call fails with
        ``StoreUnavailable`` after at most about ``(retries + 1) * (socket_timeout +
        socket_connect_timeout)`` seconds. ``durability_replicas``: as ``RedisTaskStore``'s.
        ``cluster=True``: ``url`` names a node of a Redis Cluster (``_redis.cluster_async``)."""
        driver.check_before_connecting(namespace, durability_replicas, durability_timeout,
                                       socket_timeout)  # fmt: skip
        make = connect_cluster_async if cluster else connect_async
        client = make(url, socket_timeout=socket_timeout, retries=retries,
                      socket_connect_timeout=socket_connect_timeout, **options)  # fmt: skip
        store = cls(client, namespace=namespace, owns_client=True,
                    durability_replicas=durability_replicas,
                    durability_timeout=durability_timeout)  # fmt: skip
        if store._cluster is not None:
            store._cluster.url = url  # for its connection errors
        return store

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
        / ``TaskAlreadyExists`` / ``UniqueTaken`` it met (that item wrote nothing; the unique
        records and expiries follow the script's writes as on ``RedisTaskStore``)."""
        return await self._perform(ops.commit_tasks(self.keys, items))

    async def submit_command(self, command: Command) -> None:
        await self._perform(ops.submit_command(self.keys, command))

    async def get_command(self, command_id: str) -> Command | None:
        return await self._perform(ops.get_command(self.keys, command_id))

    async def recorded_num_buckets(self) -> int | None:
        return await self._perform(ops.recorded_num_buckets(self.keys))

    async def task_types(self) -> frozenset[str]:
        return await self._perform(ops.task_types(self.keys))

    async def task_schemas(
        self, names: Collection[str] | None = None
    ) -> dict[str, PublishedSchema]:
        """The parameter schemas the workers published (``TaskSchemasStore.task_schemas``):
        a producer without the app checks parameters against them."""
        return await self._perform(task_schemas(self.keys, names))

    async def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """The limit definitions the workers recorded (``LimitsStore.limit_definitions``):
        a producer without the app submits a task under its type's limits from them."""
        return await self._perform(ops.limit_definitions(self.keys))

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

    # -- I/O: the requests of a plan (``_redis.driver``; ``RedisTaskStore``'s, awaited) -----

    async def _perform(self, plan: ops.Plan[T]) -> T:
        """Run an operation of ``_redis.ops`` with this store's I/O (see its docstring)."""
        run = driver.Run(plan, self._check_open)
        request = run.start()
        while request is not None:
            request = run.send(await self._request(request))
        return run.result

    async def _request(self, request: ops.Request) -> Any:
        if isinstance(request, ops.Script):
            return await self._run(request.name, request.keys, request.args, **request.about)
        return await self._read(request)

    async def _run(
        self, name: str, keys: Sequence[str], args: Sequence[Any], **about: Any
    ) -> list[Any]:
        return replies.check(replies.Call(name, **about), await self._eval(name, keys, args))

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        with ops.errors():
            script = await self._script(name)
            reply = await self._sender(name)(script, list(keys), list(args))
        return driver.coded(reply)

    async def _read(self, request: ops.Read | ops.Transaction) -> Any:
        """A plain command or a transaction; on Redis Cluster ``TIME`` of the slot's master,
        anything else sent again while the slot migrates. (The plans this store drives make
        no writing read: ``_redis.durability.WRITING_READS``.)"""
        call: Callable[[], Awaitable[Any]]
        if isinstance(request, ops.Transaction):
            call = partial(driver.transaction, self._client, request)
        elif self._cluster is not None:
            call = partial(self._cluster.read, request.method, request.args)
        else:
            call = partial(getattr(self._client, request.method), *request.args)
        with ops.errors(request.key):
            if self._cluster is None or isinstance(request, ops.Read):
                return await call()
            return await self._cluster.call(call)

    async def _script(self, name: str) -> AsyncScript:
        """The registered script (registered once, after asking the server for flags)."""
        if self.legacy_scripts is None:
            self.legacy_scripts = not await self._supports_script_flags()
        script = self._scripts.get(name)
        if script is None:
            text_ = script_text(name, legacy=self.legacy_scripts)
            script = self._scripts[name] = self._client.register_script(text_)
        return script

    async def _evalsha_ro(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> Any:
        try:
            return await self._client.evalsha_ro(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self._client.evalsha_ro(script.sha, len(keys), *keys, *args)

    async def _evalsha_waiting(
        self, rule: WaitForReplicas, script: AsyncScript, keys: list[Any], args: list[Any]
    ) -> Any:
        return await rule.evalsha_async(self._client, script, keys, args)

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


#: The name before the twin rule (``x_async.py`` holds ``AsyncX``): kept for existing imports.
AsyncRedisStore = AsyncRedisTaskStore
