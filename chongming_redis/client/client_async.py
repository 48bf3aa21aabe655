"""``AsyncClient``: ``Client`` for asyncio, on ``redis.asyncio``.

    async with AsyncClient.from_url("redis://127.0.0.1:6379/0", namespace="app", app=app) as c:
        handle = await c.submit("resize", {"width": 640})   # or await resize.asubmit(c, ...)
        await handle.wait(timeout=10.0)   # the result, or TaskFailed / TaskStopped / TaskLost
        await c.stop(handle.task_id)      # "stopped": the outcome, once the holder acted

The same calls, arguments, outcomes and exceptions as ``Client``, each awaitable: both run the
flows of ``client/flows.py`` (every decision: validation, waiting, control), and their stores the
operations of ``stores/_redis/ops.py`` (every request and reply); this module only performs them
with ``await`` and ``asyncio.sleep``. Many calls may run at once on one client (each takes a
connection of the pool). Cancelling a ``wait`` leaves nothing behind; cancelling a control
while it waits for its outcome leaves the command queued, as a ``CommandTimeout`` does. A
client never claims commands (that would take them from the tasks' holders).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chongming_redis.client.flows import (
    ClientFlows,
    CommandTimeout,
    Commit,
    Effect,
    Flow,
    GetCommand,
    GetTask,
    Now,
    Nudge,
    RecordedBuckets,
    RecordedLimits,
    Sleep,
    SubmitCommand,
    TaskNotFinished,
    TaskNotFound,
    TaskSchemas,
    TaskTypes,
    adrive,
    query_of,
)
from chongming_redis.client.workflows import Workflow
from chongming_redis.model import CommandKind, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.clock import AsyncServerClock
from chongming_redis.runtime.notify import WORK
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from chongming_redis.validation import check_identifier

__all__ = [
    "AsyncClient",
    "AsyncTaskHandle",
    "CommandTimeout",
    "TaskNotFinished",
    "TaskNotFound",
]

T = TypeVar("T")


class AsyncTaskHandle:
    """A submitted task: its id, and shortcuts to the client's calls about it (awaitable)."""

    def __init__(self, client: AsyncClient, task_id: str, *, created: bool = True) -> None:
        self.client = client
        self.task_id = task_id
        #: False when a ``unique`` submit found this task already holding the unique id
        #: (nothing was written).
        self.created = created

    async def wait(self, timeout: float | None = None) -> Any:
        return await self.client.wait(self.task_id, timeout=timeout)

    async def result(self) -> Any:
        return await self.client.result(self.task_id)

    async def get(self) -> TaskSnapshot | None:
        return await self.client.get(self.task_id)

    async def history(self) -> list[Transition]:
        return await self.client.history(self.task_id)

    async def stop(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return await self.client.stop(self.task_id, wait=wait, timeout=timeout)

    async def pause(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return await self.client.pause(self.task_id, wait=wait, timeout=timeout)

    async def resume(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return await self.client.resume(self.task_id, wait=wait, timeout=timeout)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncTaskHandle) and other.task_id == self.task_id

    def __hash__(self) -> int:
        return hash(self.task_id)

    def __repr__(self) -> str:
        return f"AsyncTaskHandle({self.task_id!r})"


class AsyncClient(ClientFlows):
    """``Client`` for asyncio: see the module docstring, and ``Client`` for each call."""

    store: AsyncRedisTaskStore

    def __init__(
        self,
        store: AsyncRedisTaskStore,
        *,
        app: App | None = None,
        num_buckets: int | None = None,
        name: str | None = None,
        owns_store: bool = False,
    ) -> None:
        """As ``Client``, on an ``AsyncRedisTaskStore``."""
        if not isinstance(store, AsyncRedisTaskStore):
            raise TypeError(f"store must be an AsyncRedisTaskStore, not {type(store).__name__}")
        self.store = store
        super().__init__(app=app, num_buckets=num_buckets, name=name)
        self.clock = AsyncServerClock(store)
        self._owns_store = owns_store

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "default",
        app: App | None = None,
        num_buckets: int | None = None,
        name: str | None = None,
        **store_options: Any,
    ) -> AsyncClient:
        """A client on the Redis at ``url``, connected at its first call; ``store_options``
        go to ``AsyncRedisTaskStore.from_url`` (timeouts, retries)."""
        store = AsyncRedisTaskStore.from_url(url, namespace=namespace, **store_options)
        return cls(store, app=app, num_buckets=num_buckets, name=name, owns_store=True)

    # -- submitting ------------------------------------------------------------------------

    async def submit(
        self,
        task: str | TaskType,
        params: Any = None,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        delay: float | timedelta | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        unique: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        retention: float | timedelta | None = None,
        after: Iterable[Any] = (),
        on_parent_failure: str = "stop",
    ) -> AsyncTaskHandle:
        """``Client.submit``."""
        flow = self._submit_flow(task, params, key=key, tags=tags, task_id=task_id,
                                 pipeline_run_id=pipeline_run_id, delay=delay,
                                 not_before=not_before, priority=priority, unique=unique,
                                 retry=retry, timeout=timeout, retention=retention,
                                 after=after, on_parent_failure=on_parent_failure)  # fmt: skip
        new_id, created = await self._drive(flow)
        return AsyncTaskHandle(self, new_id, created=created)

    async def submit_many(
        self,
        task: str | TaskType,
        params_list: Iterable[Any],
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        pipeline_run_id: str | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        after: Iterable[Any] = (),
        on_parent_failure: str = "stop",
    ) -> builtins.list[AsyncTaskHandle]:
        """``Client.submit_many``."""
        flow = self._submit_many_flow(task, params_list, key=key, tags=tags,
                                      pipeline_run_id=pipeline_run_id, delay=delay,
                                      priority=priority, after=after,
                                      on_parent_failure=on_parent_failure)  # fmt: skip
        return [AsyncTaskHandle(self, task_id) for task_id in await self._drive(flow)]

    def workflow(self, pipeline_run_id: str | None = None) -> Workflow:
        """``Client.workflow``; its ``submit()`` is awaited."""
        return Workflow(self, self._run_workflow, pipeline_run_id)

    async def _run_workflow(self, workflow: Workflow) -> builtins.list[AsyncTaskHandle]:
        ids = await self._drive(workflow.submit_flow())
        return [AsyncTaskHandle(self, task_id) for task_id in ids]

    def handle(self, task_id: str) -> AsyncTaskHandle:
        """A handle for a task submitted elsewhere (nothing is read, so not awaitable)."""
        return AsyncTaskHandle(self, check_identifier(task_id, "task_id"))

    # -- waiting ---------------------------------------------------------------------------

    async def wait(self, task_id: str, timeout: float | None = None) -> Any:
        """``Client.wait``; cancel-safe."""
        return await self._drive(self._wait_flow(task_id, timeout))

    async def result(self, task_id: str) -> Any:
        """``Client.result``."""
        return await self.wait(task_id, timeout=0)

    # -- reading ---------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskSnapshot | None:
        return await self.store.get(task_id)

    async def list(
        self, query: TaskQuery | None = None, **filters: Any
    ) -> builtins.list[TaskSnapshot]:
        """``Client.list``."""
        return await self.store.query(query_of(query, filters))

    async def stats(self) -> dict[TaskStatus, int]:
        return await self.store.counts()

    async def history(self, task_id: str) -> builtins.list[Transition]:
        return await self.store.history(task_id)

    # -- control ---------------------------------------------------------------------------

    async def stop(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """``Client.stop``."""
        return await self._drive(self._control_flow(task_id, CommandKind.STOP, wait, timeout))

    async def pause(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """``Client.pause``."""
        return await self._drive(self._control_flow(task_id, CommandKind.PAUSE, wait, timeout))

    async def resume(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """``Client.resume``."""
        return await self._drive(self._control_flow(task_id, CommandKind.RESUME, wait, timeout))

    async def retry(self, task_id: str) -> AsyncTaskHandle:
        """``Client.retry``."""
        return AsyncTaskHandle(self, await self._drive(self._retry_flow(task_id)))

    # -- plumbing --------------------------------------------------------------------------

    async def _drive(self, flow: Flow[T]) -> T:
        return await adrive(flow, self._perform)

    async def _perform(self, effect: Effect) -> Any:
        match effect:
            case GetTask(task_id):
                return await self.get(task_id)
            case Now():
                return await self.clock.now()
            case Sleep(seconds):
                return await asyncio.sleep(seconds)
            case Commit(items):
                return await self.store.commit_tasks(items)
            case GetCommand(command_id):
                return await self.store.get_command(command_id)
            case SubmitCommand(command):
                return await self.store.submit_command(command)
            case RecordedBuckets():
                return await self.store.recorded_num_buckets()
            case TaskTypes():
                return await self.store.task_types()
            case RecordedLimits():
                # AsyncRedisTaskStore reads them; a store without the read limits nothing.
                reader = getattr(self.store, "limit_definitions", None)
                return None if reader is None else await reader()
            case TaskSchemas(names):
                return await self.store.task_schemas(names)
            case Nudge(topic):
                # The store's create and commit scripts publish the work nudge themselves.
                return None if topic == WORK else await self.store.publish(topic)
        raise TypeError(f"not an effect: {effect!r}")

    async def aclose(self) -> None:
        """Close the store if this client opened it (``from_url``)."""
        if self._owns_store:
            await self.store.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
