"""taskiq with taskiq-redis' ``RedisStreamBroker``: ``await task.kiq()`` per job (no bulk
API), after the client's ``broker.startup()``, which creates the consumer group at ``$``
before the jobs are queued (taskiq's documented client set-up; a group created later by the
workers would skip them). Run by ``taskiq worker bench.peers.taskiq_app:broker --workers P``
(a parent starting P worker processes; taskiq's default is 2)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.peers.harness import BIN, System

#: One event loop for every enqueue: the broker's asyncio connection pool outlives a run.
_loop: asyncio.AbstractEventLoop | None = None


async def _enqueue(n: int) -> float:
    from bench.peers.taskiq_app import broker, noop

    await broker.startup()
    try:
        started = time.perf_counter()
        for _ in range(n):
            await noop.kiq()
        return time.perf_counter() - started
    finally:
        await broker.shutdown()


def enqueue_one_by_one(url: str, namespace: str, n: int) -> tuple[float, Any]:
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(_enqueue(n)), None


def worker_command(url: str, namespace: str, processes: int) -> list[str]:
    return [str(BIN / "taskiq"), "worker", "bench.peers.taskiq_app:broker",
            "--workers", str(processes)]  # fmt: skip


SYSTEM = System(
    name="taskiq",
    module="taskiq_redis",
    packages=("taskiq", "taskiq-redis"),
    enqueue_one_by_one=enqueue_one_by_one,
    enqueue_bulk=None,
    worker_command=worker_command,
    bulk_note="none",
)
