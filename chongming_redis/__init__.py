"""chongming-redis: a Redis-backed distributed worker framework.

The names below are the public API. Each is imported lazily, at its first use (``_LAZY``): a
user of the protocol alone does not import redis-py or sqlite3, and a worker imports neither
the in-memory store nor the producer client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chongming_redis.client.client import Client
    from chongming_redis.client.client_async import AsyncClient
    from chongming_redis.client.flows import CommandTimeout, TaskNotFinished, TaskNotFound
    from chongming_redis.client.workflows import Node, Workflow
    from chongming_redis.errors import (
        CommandAlreadyExists,
        CommandNotFound,
        ConcurrencyConflict,
        CorruptRecord,
        InvalidCursor,
        ParentNotFound,
        ScheduleConflict,
        ScheduleNotFound,
        StoreClosed,
        StoreError,
        StoreUnavailable,
        TaskAlreadyExists,
        UniqueTaken,
        WaitingMove,
    )
    from chongming_redis.limits import Concurrency, LimitConflict, LimitKeyError, RateLimit
    from chongming_redis.model import (
        ChangePage,
        Command,
        CommandBacklog,
        CommandKind,
        Failure,
        FeedStats,
        Progress,
        TaskQuery,
        TaskSnapshot,
        TaskStatus,
        Tombstone,
        Transition,
    )
    from chongming_redis.outcomes import TaskFailed, TaskLost, TaskOutcome, TaskStopped
    from chongming_redis.policy import NonRetryable, RetryPolicy, TaskTimeout
    from chongming_redis.runtime.app import App, InvalidParams, UnknownTask
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.context import TaskContext
    from chongming_redis.runtime.controller import Controller
    from chongming_redis.schedules import Overlap, Schedule, ScheduleError
    from chongming_redis.stores.memory import InMemoryTaskStore
    from chongming_redis.stores.postgres import PostgresTaskStore
    from chongming_redis.stores.redis import RedisTaskStore
    from chongming_redis.stores.sqlite import SqliteTaskStore

__all__ = [
    "App",
    "AsyncClient",
    "BucketPolicy",
    "ChangePage",
    "Client",
    "Command",
    "CommandAlreadyExists",
    "CommandBacklog",
    "CommandKind",
    "CommandNotFound",
    "CommandTimeout",
    "Concurrency",
    "ConcurrencyConflict",
    "Controller",
    "CorruptRecord",
    "Failure",
    "FeedStats",
    "InMemoryTaskStore",
    "InvalidCursor",
    "InvalidParams",
    "LimitConflict",
    "LimitKeyError",
    "Node",
    "NonRetryable",
    "Overlap",
    "ParentNotFound",
    "PostgresTaskStore",
    "Progress",
    "RateLimit",
    "RedisTaskStore",
    "RetryPolicy",
    "Schedule",
    "ScheduleConflict",
    "ScheduleError",
    "ScheduleNotFound",
    "SqliteTaskStore",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "TaskAlreadyExists",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "TaskNotFinished",
    "TaskNotFound",
    "TaskOutcome",
    "TaskQuery",
    "TaskSnapshot",
    "TaskStatus",
    "TaskStopped",
    "TaskTimeout",
    "Tombstone",
    "Transition",
    "UniqueTaken",
    "UnknownTask",
    "WaitingMove",
    "Workflow",
]

#: Every name's module, imported at the name's first use (``__getattr__``): ``import
#: chongming_redis`` (as every submodule's import does first) then costs nothing, so a worker
#: loads the modules it runs and no more (the in-memory store, for one, is for tests).
_LAZY = {
    **dict.fromkeys(
        (
            "CommandAlreadyExists",
            "CommandNotFound",
            "ConcurrencyConflict",
            "CorruptRecord",
            "InvalidCursor",
            "ParentNotFound",
            "ScheduleConflict",
            "ScheduleNotFound",
            "StoreClosed",
            "StoreError",
            "StoreUnavailable",
            "TaskAlreadyExists",
            "UniqueTaken",
            "WaitingMove",
        ),
        "chongming_redis.errors",
    ),
    **dict.fromkeys(
        ("Concurrency", "LimitConflict", "LimitKeyError", "RateLimit"), "chongming_redis.limits"
    ),
    **dict.fromkeys(
        (
            "ChangePage",
            "Command",
            "CommandBacklog",
            "CommandKind",
            "Failure",
            "FeedStats",
            "Progress",
            "TaskQuery",
            "TaskSnapshot",
            "TaskStatus",
            "Tombstone",
            "Transition",
        ),
        "chongming_redis.model",
    ),
    **dict.fromkeys(
        ("TaskFailed", "TaskLost", "TaskOutcome", "TaskStopped"), "chongming_redis.outcomes"
    ),
    **dict.fromkeys(("NonRetryable", "RetryPolicy", "TaskTimeout"), "chongming_redis.policy"),
    "InMemoryTaskStore": "chongming_redis.stores.memory",
    "TaskContext": "chongming_redis.runtime.context",
    "App": "chongming_redis.runtime.app",
    "Client": "chongming_redis.client.client",
    "AsyncClient": "chongming_redis.client.client_async",
    "TaskNotFound": "chongming_redis.client.flows",
    "TaskNotFinished": "chongming_redis.client.flows",
    "CommandTimeout": "chongming_redis.client.flows",
    "Workflow": "chongming_redis.client.workflows",
    "Node": "chongming_redis.client.workflows",
    "InvalidParams": "chongming_redis.runtime.app",
    "UnknownTask": "chongming_redis.runtime.app",
    "RedisTaskStore": "chongming_redis.stores.redis",
    "PostgresTaskStore": "chongming_redis.stores.postgres",  # psycopg: the [postgres] extra
    "SqliteTaskStore": "chongming_redis.stores.sqlite",
    "Controller": "chongming_redis.runtime.controller",
    "BucketPolicy": "chongming_redis.runtime.buckets",
    # cron expressions (cronsim) and time zones: loaded when a schedule is made
    "Schedule": "chongming_redis.schedules",
    "Overlap": "chongming_redis.schedules",
    "ScheduleError": "chongming_redis.schedules",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chongming_redis' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use is a plain attribute: no second look-up here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
