"""``App``: a named set of task types, independent of any store or process.

Define tasks once in a module; every process that imports it (workers, submitters, the CLI)
gets the same types::

    app = App("thumbnails")

    @app.task()
    def resize(ctx: TaskContext, params: Resize) -> dict: ...

``Controller(store, app=app)`` runs them; ``chongming-redis worker mymodule:app`` too.
``@app.task()`` returns a ``TaskFunction``: still callable as the function, and a typed handle
to submit it (``resize.submit(client, width=640)``, or ``await resize.asubmit(aclient, ...)``
on an ``AsyncClient``), so a misspelt task name fails at import.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel, ValidationError

from chongming_redis.errors import InvalidParams as InvalidParams  # its home before errors.py
from chongming_redis.limits import BoundLimit, Concurrency, Limit, RateLimit, bind
from chongming_redis.policy import (
    DEFAULT_RETENTION,
    MAX_RETENTION,
    MAX_TIMEOUT,
    RetryPolicy,
    check_duration,
)
from chongming_redis.schedules import Schedule
from chongming_redis.validation import check_identifier, check_priority

R = TypeVar("R")
#: The handle a client's ``submit`` returns (``TaskHandle``, ``AsyncTaskHandle``).
H = TypeVar("H")


class Submitter(Protocol[H]):
    """What ``TaskFunction.submit`` needs of a client (``Client``): its ``submit`` and
    ``submit_many``. The clients sit above the runtime, so they are described here, not
    imported: ``resize.submit(client, ...)`` is typed with the client's own handle."""

    @property
    def submit(self) -> Callable[..., H]: ...

    @property
    def submit_many(self) -> Callable[..., list[H]]: ...


class AsyncSubmitter(Protocol[H]):
    """``Submitter`` for an ``AsyncClient``: ``submit`` and ``submit_many`` are awaited."""

    @property
    def submit(self) -> Callable[..., Awaitable[H]]: ...

    @property
    def submit_many(self) -> Callable[..., Awaitable[list[H]]]: ...


class UnknownTask(ValueError):
    """A task type that this process has not registered."""


@dataclass(frozen=True)
class TaskType:
    name: str
    fn: Callable[..., Any]
    params_model: type[BaseModel] | None
    isolation: str = "thread"
    #: The priority its tasks get unless a submit names one (``TaskSnapshot.priority``).
    priority: int = 0
    #: Its policies, frozen into each task at submit (``chongming_redis.policy``): the retry
    #: policy (``None``: the worker's default), the seconds an attempt may run and a finished
    #: task is kept (``None``: the app's retention, else ``DEFAULT_RETENTION``).
    retry: RetryPolicy | None = None
    timeout: float | None = None
    retention: float | None = None
    #: Its limits with their ids (``limits.bind``), resolved into refs at each submit.
    limits: tuple[BoundLimit, ...] = ()

    @property
    def retention_or_default(self) -> float:
        """Its retention, else ``DEFAULT_RETENTION``."""
        return self.retention if self.retention is not None else DEFAULT_RETENTION

    def validate(self, params: Any) -> Any:
        """The parameters as they are stored (JSON types), or ``InvalidParams``."""
        if self.params_model is None:
            return params
        try:
            if isinstance(params, self.params_model):
                model = params
            else:
                model = self.params_model.model_validate(params if params is not None else {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or None
            message = f"parameters of {self.name!r} do not validate: {exc}"
            raise InvalidParams(message, task=self.name, field=where, reason=first["msg"]) from None
        return model.model_dump(mode="json")

    @property
    def is_async(self) -> bool:
        """An ``async def`` task: run on the worker's event loop, not in a thread."""
        # Unwrapped: a plain decorator around an async function still returns a coroutine.
        return inspect.iscoroutinefunction(inspect.unwrap(self.fn))

    def load(self, stored: Any) -> Any:
        """The stored parameters as the function receives them."""
        if self.params_model is None:
            return stored
        return self.params_model.model_validate(stored if stored is not None else {})


class App:
    """The task types a worker runs. ``retention`` (seconds or a timedelta): how long a
    finished task of its types is kept when the type says nothing (default
    ``policy.DEFAULT_RETENTION``, 7 days)."""

    def __init__(self, name: str = "app", *, retention: float | timedelta | None = None) -> None:
        self.name = check_identifier(name, "app name")
        self.types: dict[str, TaskType] = {}
        self.retention = check_duration(retention, "retention", maximum=MAX_RETENTION)
        #: What ``schedule`` registered: stored by every worker of the app when it starts.
        self.schedules: dict[str, Schedule] = {}

    def schedule(self, schedule: Schedule) -> Schedule:
        """Register ``schedule``: each worker of this app stores it when it starts (a changed
        definition replaces the stored one; one removed from the code stays stored, and keeps
        firing, until ``chongming-redis schedules delete``). Its task must be one of the app's
        types when it starts; the parameters are checked then too."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule takes a Schedule, not {type(schedule).__name__}")
        if schedule.id in self.schedules and self.schedules[schedule.id] != schedule:
            raise ValueError(f"schedule {schedule.id!r} is registered twice, differently")
        self.schedules[schedule.id] = schedule
        return schedule

    @overload
    def task(self, name: Callable[..., R], /) -> TaskFunction[R]: ...

    @overload
    def task(
        self,
        name: str | None = None,
        *,
        params: type[BaseModel] | None = None,
        isolation: str = "thread",
        priority: int = 0,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        retention: float | timedelta | None = None,
        limits: Iterable[Limit] = (),
    ) -> Callable[[Callable[..., R]], TaskFunction[R]]: ...

    def task(
        self,
        name: str | Callable[..., R] | None = None,
        *,
        params: type[BaseModel] | None = None,
        isolation: str = "thread",
        priority: int = 0,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        retention: float | timedelta | None = None,
        limits: Iterable[Limit] = (),
    ) -> TaskFunction[R] | Callable[[Callable[..., R]], TaskFunction[R]]:
        """Register ``fn(ctx, params)`` under ``name`` (default: the function's name). With a
        pydantic model (``params=`` or the annotation of the second argument), submitted
        parameters are validated and the function receives a model instance.

        ``isolation="process"`` runs each execution in a child process (CPU-heavy work; stop
        and pause then work without the task's cooperation: see ``runtime/isolation.py``).
        ``priority`` (-100..100, higher starts first among due tasks) is what its tasks get
        when a submit names none; a retry keeps its task's priority.
        ``retry`` (a ``RetryPolicy``): how its failures and lost attempts are retried (default:
        the worker's ``--max-attempts``/``--retry-backoff``, failures final); ``timeout``
        (seconds or a timedelta): how long one attempt may run; ``retention``: how long a
        finished task is kept. All three are frozen into each task when it is submitted.
        ``limits`` (``Concurrency``/``RateLimit``): when its tasks may start, over the whole
        pool; bound now (their ids: ``name``, else ``<task>.concurrency``/``<task>.rate``), and
        a limit id another type of this app defines differently is refused (``ValueError``).
        ``fn`` may be ``async def`` (it runs on the worker's event loop). Its signature is
        checked now: it must accept ``(ctx, params)`` (``TypeError`` otherwise). ``@app.task``
        without parentheses registers the function under its own name. A name registered twice
        is refused (``ValueError``): the second would silently replace the first."""
        if callable(name):  # @app.task, without parentheses
            return self.task()(name)
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', not {isolation!r}")
        check_priority(priority)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        timeout_s = check_duration(timeout, "timeout", maximum=MAX_TIMEOUT)
        retention_s = check_duration(retention, "retention", maximum=MAX_RETENTION)
        given_limits = _limit_list(limits)

        def register(fn: Callable[..., R]) -> TaskFunction[R]:
            if isinstance(fn, TaskFunction):
                fn = fn.fn
            task_name = check_identifier(name or getattr(fn, "__name__", ""), "task name")
            _check_signature(fn, task_name)
            if isolation == "process" and inspect.iscoroutinefunction(fn):
                raise ValueError(f"task {task_name!r}: an async task cannot run in a process")
            existing = self.types.get(task_name)
            if existing is not None and existing.fn is not fn:
                raise ValueError(f"task {task_name!r} is already registered on app "
                                 f"{self.name!r} (by {_where(existing.fn)})")  # fmt: skip
            model = params or _annotated_model(fn, task_name)
            bound = bind(task_name, given_limits)
            self._check_shared_limits(task_name, bound)
            task_type = TaskType(
                task_name,
                fn,
                model,
                isolation,
                priority,
                retry,
                timeout_s,
                retention_s if retention_s is not None else self.retention,
                bound,
            )
            self.types[task_name] = task_type
            return TaskFunction(task_type)

        return register

    def _check_shared_limits(self, task_name: str, bound: Iterable[BoundLimit]) -> None:
        """A named limit shared by several types must be one definition: the store records
        one per id, and a worker would otherwise conflict with itself."""
        for b in bound:
            for other in self.types.values():
                for o in other.limits:
                    if other.name != task_name and o.id == b.id and o.to_json() != b.to_json():
                        raise ValueError(f"task {task_name!r}: limit {b.id!r} is defined as "
                                         f"{o.to_json()} by task {other.name!r}, here as "
                                         f"{b.to_json()}")  # fmt: skip

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``(limit id -> definition JSON, task type -> its limit ids)`` of its types that
        have limits: what its workers record (``LimitsStore.record_limits``)."""
        definitions: dict[str, str] = {}
        task_limits: dict[str, tuple[str, ...]] = {}
        for task_type in self.types.values():
            if task_type.limits:
                definitions.update((b.id, b.to_json()) for b in task_type.limits)
                task_limits[task_type.name] = tuple(b.id for b in task_type.limits)
        return definitions, task_limits

    def get(self, name: str) -> TaskType:
        task_type = self.types.get(name)
        if task_type is None:
            known = ", ".join(sorted(self.types)) or "none registered"
            raise UnknownTask(f"unknown task type {name!r} (known: {known})")
        return task_type


class TaskFunction(Generic[R]):
    """What ``@app.task()`` returns: the function (call it as before, in tests for example)
    and a typed handle to submit it by its registered name."""

    def __init__(self, task_type: TaskType) -> None:
        self.task_type = task_type
        self.fn = task_type.fn
        self.name = task_type.name
        functools.update_wrapper(self, task_type.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]

    def submit(self, client: Submitter[H], params: Any = None, /, **fields: Any) -> H:
        """Submit one task of this type: ``resize.submit(client, width=640)`` or
        ``resize.submit(client, Resize(width=640))``. Options of ``Client.submit`` (``key``,
        ``tags``, ``delay``, ...) are passed by name as ``submit_options``."""
        options = fields.pop("submit_options", None) or {}
        return client.submit(self.task_type, _params(params, fields), **options)

    def submit_many(self, client: Submitter[H], params_list: Iterable[Any]) -> list[H]:
        return client.submit_many(self.task_type, params_list)

    async def asubmit(self, client: AsyncSubmitter[H], params: Any = None, /, **fields: Any) -> H:
        """``submit`` on an ``AsyncClient``: ``await resize.asubmit(client, width=640)``."""
        options = fields.pop("submit_options", None) or {}
        return await client.submit(self.task_type, _params(params, fields), **options)

    async def asubmit_many(self, client: AsyncSubmitter[H], params_list: Iterable[Any]) -> list[H]:
        return await client.submit_many(self.task_type, params_list)

    def __repr__(self) -> str:
        return f"<task {self.name!r} of {self.fn.__module__}.{self.fn.__qualname__}>"


def _limit_list(limits: Iterable[Limit]) -> tuple[Limit, ...]:
    """``limits=`` as a tuple, checked now (``bind`` checks each one's type and ids)."""
    if isinstance(limits, (str, bytes)) or not isinstance(limits, Iterable):
        raise TypeError(f"limits must be a list of Concurrency/RateLimit, not "
                        f"{type(limits).__name__}")  # fmt: skip
    given = tuple(limits)
    for limit in given:  # now, at the decorator's call; ids and count when bound
        if not isinstance(limit, (Concurrency, RateLimit)):
            raise TypeError(f"limits takes Concurrency and RateLimit, not {type(limit).__name__}")
    return given


def _params(params: Any, fields: dict[str, Any]) -> Any:
    if params is not None and fields:
        raise TypeError("pass the parameters either as one object or as keywords, not both")
    return fields if params is None and fields else params


def _check_signature(fn: Callable[..., Any], task_name: str) -> None:
    """A task function is called ``fn(ctx, params)``: refuse one that cannot be, now."""
    if not callable(fn):
        raise TypeError(f"task {task_name!r}: {fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: it is called as it is
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"task {task_name!r}: {getattr(fn, '__qualname__', fn)}{signature} must accept "
            "(ctx, params): the task context and the parameters"
        ) from None


def _annotated_model(fn: Callable[..., Any], task_name: str) -> type[BaseModel] | None:
    """The pydantic model of ``fn``'s second parameter, if it is annotated with one. An
    annotation that cannot be resolved is refused now (``TypeError``): taken for "no model",
    the task would get unvalidated dictionaries."""
    try:
        parameters = list(inspect.signature(fn, eval_str=True).parameters.values())
    except NameError as exc:
        raise TypeError(
            f"task {task_name!r}: the annotations of {_where(fn)} cannot be resolved ({exc}); "
            "define the model at module level or pass it as params="
        ) from None
    except (TypeError, ValueError):
        return None
    if len(parameters) < 2:
        return None
    annotation = parameters[1].annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
