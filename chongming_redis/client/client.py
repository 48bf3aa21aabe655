"""``Client``: what a producer needs — submit tasks, wait for their results, stop, pause,
resume or retry them, and read them — without running a worker.

    client = Client.from_url("redis://127.0.0.1:6379/0", namespace="app", app=app)
    handle = client.submit("resize", {"width": 640})     # or resize.submit(client, width=640)
    handle.wait(timeout=10.0)     # the result, or TaskFailed / TaskStopped / TaskLost
    client.stop(handle.task_id)   # "stopped": the outcome, once the holder acted

A client never claims commands (that would take them from the tasks' holders). A stop, pause
or resume of a task nobody holds (``PENDING``, or paused before it ran) is a compare-and-set
by the client itself, with its history entry; one for a running task is a command for its
holder, nudged at once, whose outcome the client waits for.
"""

from __future__ import annotations

import builtins
import time
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
    drive,
    query_of,
)
from chongming_redis.client.schedules import Schedules
from chongming_redis.client.workflows import Workflow
from chongming_redis.model import CommandKind, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.notify import WORK, LocalNotifier, RedisNotifier
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.task_schema_store import TaskSchemasStore
from chongming_redis.validation import check_identifier

__all__ = ["Client", "CommandTimeout", "TaskHandle", "TaskNotFinished", "TaskNotFound"]

T = TypeVar("T")


class TaskHandle:
    """A submitted task: its id, and shortcuts to the client's calls about it."""

    def __init__(self, client: Client, task_id: str, *, created: bool = True) -> None:
        self.client = client
        self.task_id = task_id
        #: False when a ``unique`` submit found this task already holding the unique id
        #: (nothing was written).
        self.created = created

    def wait(self, timeout: float | None = None) -> Any:
        return self.client.wait(self.task_id, timeout=timeout)

    def result(self) -> Any:
        return self.client.result(self.task_id)

    def get(self) -> TaskSnapshot | None:
        return self.client.get(self.task_id)

    def history(self) -> list[Transition]:
        return self.client.history(self.task_id)

    def stop(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.stop(self.task_id, wait=wait, timeout=timeout)

    def pause(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.pause(self.task_id, wait=wait, timeout=timeout)

    def resume(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.resume(self.task_id, wait=wait, timeout=timeout)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskHandle) and other.task_id == self.task_id

    def __hash__(self) -> int:
        return hash(self.task_id)

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_id!r})"


class Client(ClientFlows):
    """The blocking client: the flows of ``client/flows.py`` performed with blocking calls."""

    store: TaskStore

    def __init__(
        self,
        store: TaskStore,
        *,
        app: App | None = None,
        num_buckets: int | None = None,
        name: str | None = None,
        owns_store: bool = False,
    ) -> None:
        """``app``: validate parameters against its task types (and refuse unknown names);
        without one, against the JSON Schema the type's workers published (read again every
        few seconds; a type none published takes any value: ``client/params_check.py``).
        ``num_buckets``: the namespace's bucket count (default: the one its workers recorded,
        else 64). ``name``: written into the history as who submitted or controlled a task."""
        if not isinstance(store, TaskStore):
            raise TypeError(f"store must implement TaskStore, not {type(store).__name__}")
        self.store = store
        super().__init__(app=app, num_buckets=num_buckets, name=name)
        self.adapter = StoreAdapter(store, owner=self.name)
        self.clock = ServerClock(self.adapter)
        self._owns_store = owns_store
        self._notifier: RedisNotifier | LocalNotifier | None = None

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
    ) -> Client:
        """A client on the store at ``url``: a Redis (``redis://``, ``rediss://``,
        ``unix://``), a SQLite file (``sqlite:///abs/path``) or a PostgreSQL (``postgresql://``,
        the namespace is its schema); ``stores/urls.py``. ``store_options`` go to
        ``RedisTaskStore.from_url`` (timeouts, retries); the other stores take none."""
        from chongming_redis.stores.urls import open_store_url, parse_store_url

        if parse_store_url(url).kind != "redis":
            if store_options:
                raise TypeError(f"store options are for a Redis URL: {sorted(store_options)}")
        else:
            # The server's durability settings are the workers' concern (they warn once); a
            # producer does not repeat the warning in every process.
            store_options.setdefault("check_server", False)
        store = open_store_url(url, namespace=namespace, redis_options=store_options)
        return cls(store, app=app, num_buckets=num_buckets, name=name, owns_store=True)

    # -- submitting ------------------------------------------------------------------------

    def submit(
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
    ) -> TaskHandle:
        """Create one ``PENDING`` task; validated (name, parameters, options) before anything
        is written. ``delay`` (seconds) or ``not_before``: no worker starts it earlier.
        ``priority`` (-100..100; default: the task type's, else 0): higher starts first among
        due tasks. ``after`` (handles or ids of existing tasks): created ``WAITING``, released
        to ``PENDING`` once every parent ``SUCCEEDED``; with ``on_parent_failure="stop"`` (the
        default) a parent that ends otherwise ends it ``STOPPED``, with ``"run"`` it runs once
        every parent has ended (``ParentNotFound``: a parent that does not exist; nothing
        written)."""
        flow = self._submit_flow(task, params, key=key, tags=tags, task_id=task_id,
                                 pipeline_run_id=pipeline_run_id, delay=delay,
                                 not_before=not_before, priority=priority, unique=unique,
                                 retry=retry, timeout=timeout, retention=retention,
                                 after=after, on_parent_failure=on_parent_failure)  # fmt: skip
        new_id, created = self._drive(flow)
        return TaskHandle(self, new_id, created=created)

    def submit_many(
        self,
        task: str | TaskType,
        params_list: Iterable[Any],
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        pipeline_run_id: str | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        retention: float | timedelta | None = None,
        after: Iterable[Any] = (),
        on_parent_failure: str = "stop",
    ) -> builtins.list[TaskHandle]:
        """One task per parameter set (on Redis, 100 per round trip). Every set is validated
        before anything is written; an empty list writes nothing."""
        flow = self._submit_many_flow(task, params_list, key=key, tags=tags,
                                      pipeline_run_id=pipeline_run_id, delay=delay,
                                      priority=priority, retry=retry, timeout=timeout,
                                      retention=retention, after=after,
                                      on_parent_failure=on_parent_failure)  # fmt: skip
        return [TaskHandle(self, task_id) for task_id in self._drive(flow)]

    @property
    def schedules(self) -> Schedules:
        """The namespace's schedules: ``upsert``, ``get``, ``list``, ``pause``, ``resume``,
        ``trigger``, ``delete`` (``client/schedules.py``)."""
        return Schedules(self)

    def workflow(self, pipeline_run_id: str | None = None) -> Workflow:
        """A graph of tasks to build and ``submit()`` together (``client/workflows.py``):
        ``add``, ``chain``, ``group``; its pipeline id is ``pipeline_run_id`` (default: a new
        ``wf-...`` id)."""
        return Workflow(self, self._run_workflow, pipeline_run_id)

    def _run_workflow(self, workflow: Workflow) -> builtins.list[TaskHandle]:
        return [TaskHandle(self, task_id) for task_id in self._drive(workflow.submit_flow())]

    def handle(self, task_id: str) -> TaskHandle:
        """A handle for a task submitted elsewhere (nothing is read)."""
        return TaskHandle(self, check_identifier(task_id, "task_id"))

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, task_id: str, timeout: float | None = None) -> Any:
        """Block until the task finishes; its result. Raises ``TaskFailed`` (with the stored
        failure), ``TaskStopped``, ``TaskLost`` (no attempt left), ``TaskNotFound``, or
        ``TaskNotFinished`` after ``timeout`` seconds (``None``: no limit)."""
        return self._drive(self._wait_flow(task_id, timeout))

    def result(self, task_id: str) -> Any:
        """A finished task's result now (``TaskNotFinished`` while it is under way; the
        ``TaskOutcome`` of one that ended without a result)."""
        return self.wait(task_id, timeout=0)

    # -- reading ---------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        return self.store.get(task_id)

    def list(self, query: TaskQuery | None = None, **filters: Any) -> builtins.list[TaskSnapshot]:
        """Tasks matching a ``TaskQuery`` (or its fields as keywords: ``statuses=``,
        ``name=``, ``tag=``, ``limit=``, ``newest_first=``, ...)."""
        return self.store.query(query_of(query, filters))

    def stats(self) -> dict[TaskStatus, int]:
        return self.store.counts()

    def history(self, task_id: str) -> builtins.list[Transition]:
        return self.store.history(task_id)

    # -- control ---------------------------------------------------------------------------

    def stop(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Stop a task; returns the outcome (``"stopped"``, ``"already-terminal"``,
        ``"no-such-task"``; ``"sent:<command id>"`` with ``wait=False`` for a running task).
        A running task's holder stops it at its next checkpoint; the outcome comes when it
        has really ended (``CommandTimeout`` after ``timeout`` seconds)."""
        return self._drive(self._control_flow(task_id, CommandKind.STOP, wait, timeout))

    def pause(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Pause a task (``"paused"``, ``"already-paused"``, ...); see ``stop``."""
        return self._drive(self._control_flow(task_id, CommandKind.PAUSE, wait, timeout))

    def resume(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Resume a paused task (``"resumed"``, ``"not-paused"``, ...); see ``stop``."""
        return self._drive(self._control_flow(task_id, CommandKind.RESUME, wait, timeout))

    def retry(self, task_id: str) -> TaskHandle:
        """A new attempt of a ``FAILED``, ``STOPPED`` or ``LOST`` task, ``PENDING`` now
        (``ValueError`` for a task in any other status, ``TaskNotFound``)."""
        return TaskHandle(self, self._drive(self._retry_flow(task_id)))

    # -- plumbing --------------------------------------------------------------------------

    @property
    def _reads_commands(self) -> bool:
        return self.adapter.reads_commands

    def _drive(self, flow: Flow[T]) -> T:
        return drive(flow, self._perform)

    def _perform(self, effect: Effect) -> Any:
        match effect:
            case GetTask(task_id):
                return self.get(task_id)
            case Now():
                return self.clock.now()
            case Sleep(seconds):
                return time.sleep(seconds)
            case Commit(items):
                return self.adapter.commit(items, best_effort_history=True)
            case GetCommand(command_id):
                return self.adapter.get_command(command_id)
            case SubmitCommand(command):
                return self.store.submit_command(command)
            case RecordedBuckets():
                return self.adapter.recorded_num_buckets()
            case TaskTypes():
                return self.adapter.task_types()
            case RecordedLimits():
                return self.adapter.limit_definitions()
            case TaskSchemas(names):
                store = self.store
                return store.task_schemas(names) if isinstance(store, TaskSchemasStore) else None
            case Nudge(topic):
                return self._nudge(topic)
        raise TypeError(f"not an effect: {effect!r}")

    def _nudge(self, topic: str) -> None:
        """Wake the task's holder (or idle workers) now instead of at their next poll; for a
        submit, only where the store's own write did not already publish it."""
        nudge = self.adapter.nudge
        if topic == WORK and nudge is not None and nudge.publishes_work:
            return
        if self._notifier is None:
            self._notifier = (
                LocalNotifier(self.store) if nudge is None
                else RedisNotifier(nudge.client, nudge.namespace)
            )  # fmt: skip
        self._notifier.publish(topic)

    def close(self) -> None:
        """Close the store if this client opened it (``from_url``)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
