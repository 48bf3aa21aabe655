"""dramatiq with its Redis broker: ``actor.send()`` per job (no bulk API: ``group(...).run()``
and ``broker.enqueue`` send one message per call), run by ``dramatiq bench.peers.dramatiq_app
--processes P`` (a parent forking P worker processes of 8 threads each, the default)."""

from __future__ import annotations

import time
from typing import Any

from bench.peers.harness import BIN, System


def enqueue_one_by_one(url: str, namespace: str, n: int) -> tuple[float, Any]:
    from bench.peers.dramatiq_app import broker, noop

    try:
        started = time.perf_counter()
        for _ in range(n):
            noop.send()
        return time.perf_counter() - started, None
    finally:
        broker.client.connection_pool.disconnect()


def worker_command(url: str, namespace: str, processes: int) -> list[str]:
    return [str(BIN / "dramatiq"), "bench.peers.dramatiq_app", "--processes", str(processes)]


SYSTEM = System(
    name="dramatiq",
    module="dramatiq",
    packages=("dramatiq",),
    enqueue_one_by_one=enqueue_one_by_one,
    enqueue_bulk=None,
    worker_command=worker_command,
    bulk_note="none (group().run() sends one by one)",
)
