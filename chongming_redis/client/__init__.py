"""The producer: submit tasks, wait for their outcomes, stop / pause / resume them.

``client.py`` (``Client``, ``TaskHandle``) and its asyncio twin ``client_async.py``
(``AsyncClient``, ``AsyncTaskHandle``) drive the same sans-I/O flows (``flows.py``, which yield
the effects of ``effects.py``). A producer never imports the worker engine (the import contract
in ``pyproject.toml`` says so); it uses only the runtime's shared parts (the ``App``'s task
types, buckets, the clock, held tasks, nudges, the store adapter, submission).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chongming_redis.client.client import Client, TaskHandle
from chongming_redis.client.flows import CommandTimeout, TaskNotFinished, TaskNotFound

if TYPE_CHECKING:
    from chongming_redis.client.client_async import AsyncClient, AsyncTaskHandle

__all__ = [
    "AsyncClient",
    "AsyncTaskHandle",
    "Client",
    "CommandTimeout",
    "TaskHandle",
    "TaskNotFinished",
    "TaskNotFound",
]


def __getattr__(name: str) -> Any:
    """``AsyncClient`` and ``AsyncTaskHandle`` load asyncio's machinery only when asked for."""
    if name in ("AsyncClient", "AsyncTaskHandle"):
        from chongming_redis.client import client_async

        return getattr(client_async, name)
    raise AttributeError(f"module 'chongming_redis.client' has no attribute {name!r}")
