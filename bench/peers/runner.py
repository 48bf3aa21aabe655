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


SPLIT_LIMIT = 0.6  # "two workers started together split a drain within 60/40"


def split_of(marks: harness.Marks, processes: int, start_ns: int) -> dict[str, Any]:
    """How the jobs spread over the worker processes (pid -> jobs, most first), each one's
    share, when each ran its first job (seconds after the spawn) and, for 2 processes, whether
    the larger share is within 60/40."""
    jobs, firsts = marks.split(), marks.firsts()
    total = sum(jobs.values())
    shares = [count / total for count in jobs.values()] if total else []
    within = None
    if processes == 2:
        within = len(jobs) == 2 and max(shares) <= SPLIT_LIMIT
    first = {str(pid): (firsts[pid] - start_ns) / 1e9 for pid in jobs if pid in firsts}
    return {"jobs": {str(pid): count for pid, count in jobs.items()}, "shares": shares,
            "first_job_after_spawn": first, "within_60_40": within}  # fmt: skip


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
    if processes >= 2:
        run.extra["split"] = split_of(marks, processes, drained.start_ns)
    if drained.error is not None:
        run.error = f"{drained.error}; log tail:\n{harness.log_tail(log)}"
    harness.settle_clients(client)
    run.bytes_after = (harness.used_memory(client) - before) / n
    if system.check is not None:
        run.check = system.check(url, namespace, handle, n)
    run.extra["log"] = str(log)
    client.flushall()
    return run
