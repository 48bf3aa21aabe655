"""One measured run: one system, one process count, N jobs, on a flushed Redis."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.peers import harness
from bench.peers.harness import System


@dataclass
class Run:
    system: str
    processes: int
    tasks: int
    command: list[str]
    enqueue_one_seconds: float
    enqueue_bulk_seconds: float | None
    bytes_queued: float  # used_memory delta per job, all N queued, before any worker started
    drain_seconds: float | None = None  # spawn -> last job (cold start included)
    warm_seconds: float | None = None  # first job -> last job
    runs_counted: int = 0  # bytes in the byte files once the workers stopped
    bytes_after: float | None = None  # used_memory delta per job once the workers stopped
    stopped: str = ""
    error: str | None = None
    check: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def rate(self, seconds: float | None) -> float | None:
        return self.tasks / seconds if seconds else None

    @property
    def drain_rate(self) -> float | None:
        return self.rate(self.drain_seconds)

    @property
    def warm_rate(self) -> float | None:
        return self.rate(self.warm_seconds)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            enqueue_one_rate=self.rate(self.enqueue_one_seconds),
            enqueue_bulk_rate=self.rate(self.enqueue_bulk_seconds),
            drain_rate=self.drain_rate,
            warm_rate=self.warm_rate,
        )
        return data


def run_one(
    system: System, processes: int, n: int, url: str, client: redis.Redis, tmp: Path, logs: Path
) -> Run:
    """Bulk enqueue (timed, then flushed), one-by-one enqueue of the N jobs that are drained
    (timed; memory delta = bytes queued), drain by the system's CLI, stop it, memory left,
    the system's own check; the database is flushed at the end."""
    namespace = f"peers-{system.name}-p{processes}"
    client.flushall()
    bulk_seconds = None
    if system.enqueue_bulk is not None:
        bulk_seconds, _ = system.enqueue_bulk(url, namespace, n)
        client.flushall()
    harness.settle_clients(client)
    before = harness.used_memory(client)
    one_seconds, handle = system.enqueue_one_by_one(url, namespace, n)
    harness.settle_clients(client)
    queued = (harness.used_memory(client) - before) / n

    marks = harness.Marks(tmp / f"{system.name}-p{processes}")
    command = system.worker_command(url, namespace, processes)
    run = Run(system.name, processes, n, command, one_seconds, bulk_seconds, queued)
    log = logs / f"{system.name}-p{processes}.log"
    timeout = max(120.0, n / 50)
    proc, drained = harness.drain(command, harness.worker_env(url, marks), marks, n, log, timeout)
    run.stopped = harness.stop(proc)
    run.drain_seconds, run.warm_seconds = drained.seconds, drained.warm_seconds
    run.runs_counted = marks.count()
    if drained.error is not None:
        run.error = f"{drained.error}; log tail:\n{harness.log_tail(log)}"
    harness.settle_clients(client)
    run.bytes_after = (harness.used_memory(client) - before) / n
    if system.check is not None:
        run.check = system.check(url, namespace, handle, n)
    run.extra["log"] = str(log)
    client.flushall()
    return run
