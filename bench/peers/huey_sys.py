"""huey with ``RedisHuey``: ``task()`` per job (no bulk API: ``task.map()`` enqueues one by
one), run by ``huey_consumer bench.peers.huey_app.huey``: its default is one worker thread in
the consumer's own process, so 1 process is exactly the default; 2 processes is ``-k process
-w 2`` (two forked worker processes beside the consumer's scheduler process), the only way
huey runs jobs in two processes."""

from __future__ import annotations

import time
from typing import Any

from bench.peers.harness import BIN, System


def enqueue_one_by_one(url: str, namespace: str, n: int) -> tuple[float, Any]:
    from bench.peers.huey_app import huey, noop

    try:
        started = time.perf_counter()
        for _ in range(n):
            noop()
        return time.perf_counter() - started, None
    finally:
        huey.storage.pool.disconnect()


def worker_command(url: str, namespace: str, processes: int) -> list[str]:
    command = [str(BIN / "huey_consumer"), "bench.peers.huey_app.huey"]
    return command if processes == 1 else [*command, "-k", "process", "-w", str(processes)]


SYSTEM = System(
    name="huey",
    module="huey",
    packages=("huey",),
    enqueue_one_by_one=enqueue_one_by_one,
    enqueue_bulk=None,
    worker_command=worker_command,
    bulk_note="none (task.map() enqueues one by one)",
)
