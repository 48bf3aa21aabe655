"""End-to-end throughput of no-op tasks on every built-in store, through real worker processes,
measured in one run.

    .venv/bin/python -m bench.store_throughput                  # 10,000 tasks per drain
    .venv/bin/python -m bench.store_throughput --quick          # 1,500 tasks, shorter phases
    .venv/bin/python -m bench.store_throughput --stores sqlite,postgres --tasks 200

The stores (``--stores``, default all of them): Redis with AOF off and with ``appendfsync
always`` (private redis-servers on free loopback ports), SQLite with its defaults (WAL,
``synchronous=FULL``; a new file per drain in a temporary directory), PostgreSQL with the
distribution's defaults (a private server: ``initdb`` in a temporary directory, ``fsync`` on;
a new schema per drain), and tuned beside them: SQLite with ``synchronous=NORMAL``
(``sqlite-normal``), PostgreSQL with ``synchronous_commit=off`` (``postgres-async``, set in the
URL). For 1 and then 2 worker processes, store after store (so every store sees the machine at
about the same time):

1. submits N no-op tasks through ``Controller.submit`` one by one (the submit rate), starts the
   worker processes (``python -m bench.store_worker``: the CLI worker's path — ``open_store``,
   ``ControllerConfig()``'s defaults with ``polling_for`` the store, 64 buckets, ``join_pool``
   with a 5 s lease, ``start``), waits until their bucket pool has settled, releases them all at
   once and measures the drain: from that release until ``counts()[SUCCEEDED] == N``;
2. the CPU per task of the workers (their process CPU from the release to the stop) and of the
   server (Redis; PostgreSQL's postmaster and backends; SQLite has none: its work is in the
   workers' figure);
3. checks every task's history: exactly one ``PENDING -> RUNNING``, ending ``SUCCEEDED``;
4. submit -> start latency with idle workers: tasks submitted at a steady rate (``--rate``,
   50/s) to workers already waiting; latency = the ``RUNNING`` history entry's time minus the
   task's ``created_at``; p50 / p99 / max;
5. idle submit -> start: one worker process, each task submitted after a quiet spell
   (``IDLE_GAP``, longer than SQLite's quicker poll after work); p50 / p95 / max.

``sqlite-poll`` and ``postgres-poll`` (latency phases only) are the stores as before issue 30
(``bench.store_worker --no-nudges``: PostgreSQL without ``LISTEN``/``NOTIFY``, SQLite without
the quicker poll after work), measured in the same run as the new figures.

The workers log no task lines (``chongming-redis worker`` logs two per task at INFO; see
docs/performance.md for their cost), as in ``bench.throughput``, which breaks a Redis drain
down into its costs. No assertions: it reports, the docs record (docs/store-guide.md §10).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from bench.drains import Check, check_entries, code_under_test, load_average
from bench.store_reports import drain_table, latency_table
from bench.store_worker import NUM_BUCKETS, Pool, app
from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.model import TaskStatus
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.loops import BUSY_FOR
from chongming_redis.stores.urls import open_store_url

STORES = ("redis", "redis-aof", "sqlite", "sqlite-normal", "postgres", "postgres-async",
          "sqlite-poll", "postgres-poll")  # fmt: skip
LABELS = {
    "redis": "Redis, AOF off",
    "redis-aof": "Redis, appendfsync always",
    "sqlite": "SQLite (synchronous=FULL)",
    "sqlite-normal": "SQLite, synchronous=NORMAL",
    "postgres": "PostgreSQL (fsync on)",
    "postgres-async": "PostgreSQL, synchronous_commit=off",
    "sqlite-poll": "SQLite, plain 0.2 s poll (before)",
    "postgres-poll": "PostgreSQL, no nudges, 0.2 s poll (before)",
}
#: The stores as before issue 30 (``bench.store_worker --no-nudges``): latency phases only.
BEFORE = ("sqlite-poll", "postgres-poll")


@dataclass(frozen=True)
class Target:
    """One store to drain on: ``url()`` for a fresh namespace (or file) per run."""

    name: str  # one of STORES
    base: str  # a server's URL, or the directory of the SQLite files
    extra: tuple[str, ...] = ()  # worker arguments
    server_pid: int | None = None  # the server's main process (none: SQLite, in-process)

    def server_cpu(self) -> float:
        """CPU seconds of the server so far: its main process and every child (PostgreSQL's
        backends, which live as long as the workers' pooled connections)."""
        if self.server_pid is None:
            return 0.0
        main = psutil.Process(self.server_pid)
        total = 0.0
        for process in (main, *main.children(recursive=True)):
            with suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def url(self, run: str) -> tuple[str, str]:
        """``(url, namespace)`` of a new, empty store for ``run``."""
        if self.name.startswith("sqlite"):
            return f"sqlite://{Path(self.base) / run}.sqlite3", "default"
        return self.base, run

    def open(self, url: str, namespace: str) -> Any:
        if self.name == "postgres-poll":
            from chongming_redis.stores.postgres import PostgresTaskStore

            return PostgresTaskStore(url, schema=namespace, nudges=False)
        if self.name == "sqlite-normal":
            from chongming_redis.stores.sqlite import SqliteTaskStore

            return SqliteTaskStore(url.removeprefix("sqlite://"), synchronous="NORMAL")
        redis = {"check_server": False} if self.name.startswith("redis") else None
        return open_store_url(url, namespace=namespace, redis_options=redis)


@dataclass
class Drain:
    target: Target
    workers: int
    tasks: int
    submit_seconds: float
    drain_seconds: float
    python_cpu: float
    server_cpu: float
    check: Check

    @property
    def rate(self) -> float:
        return self.tasks / self.drain_seconds


@dataclass
class Latency:
    target: Target
    workers: int
    to_start: list[float]
    check: Check


@contextmanager
def targets(names: Sequence[str], tmp: Path) -> Iterator[list[Target]]:
    """The stores to measure, their servers started (and stopped at the end)."""
    with ExitStack() as stack:
        found: list[Target] = []
        pg: PostgresProc | None = None
        for name in names:
            if name.startswith("redis"):  # EmbeddedRedis' default: appendfsync always
                extra = ("--appendonly", "no") if name == "redis" else ()
                server = EmbeddedRedis(port=0, extra_args=extra).start()
                stack.callback(server.stop)
                found.append(Target(name, server.url, server_pid=server.proc.pid))
            elif name.startswith("sqlite"):
                extra = {"sqlite-normal": ("--synchronous=NORMAL",),
                         "sqlite-poll": ("--no-nudges",)}.get(name, ())  # fmt: skip
                found.append(Target(name, str(tmp), extra))
            else:
                if pg is None:
                    from bench.store_ops_sql import postgres_server

                    pg = stack.enter_context(postgres_server())
                assert pg.proc is not None
                async_commit = "?options=-c%20synchronous_commit%3Doff"
                dsn = pg.dsn + (async_commit if "async" in name else "")
                extra = ("--no-nudges",) if name == "postgres-poll" else ()
                found.append(Target(name, dsn, extra, server_pid=pg.proc.pid))
        yield found


def submitter(store: Any, run: str) -> Controller:
    return Controller(store, app=app, owner=f"submitter-{run}", buckets=BucketPolicy(NUM_BUCKETS))


def run_drain(target: Target, workers: int, n: int, tmp: Path, run: str) -> Drain:
    url, namespace = target.url(run)
    store = target.open(url, namespace)
    try:
        controller = submitter(store, run)
        started = time.perf_counter()
        task_ids = [controller.submit("noop") for _ in range(n)]
        submit_seconds = time.perf_counter() - started
        with Pool(url, namespace, workers, tmp, target.extra) as pool:
            server_cpu = target.server_cpu()
            pool.release()
            drain_seconds = wait_succeeded(store, n, timeout=max(120.0, n / 20))
            server_cpu = target.server_cpu() - server_cpu
            cpu = pool.stop()
        check = check_entries({t: store.history(t) for t in task_ids}, task_ids)
    finally:
        close(target, store)
    return Drain(target, workers, n, submit_seconds, drain_seconds, cpu, server_cpu, check)


def run_latency(
    target: Target, workers: int, rate: float, seconds: float, tmp: Path, run: str
) -> Latency:
    """Submit at ``rate``/s for ``seconds`` to idle-waiting workers; per task the seconds
    from ``created_at`` to its ``RUNNING`` entry."""
    url, namespace = target.url(run)
    store = target.open(url, namespace)
    n = max(1, round(rate * seconds))
    try:
        controller = submitter(store, run)
        with Pool(url, namespace, workers, tmp, target.extra) as pool:
            pool.release()
            time.sleep(0.5)  # let them start and go idle
            began = time.perf_counter()
            task_ids = []
            for i in range(n):
                pause = began + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                task_ids.append(controller.submit("noop"))
            wait_succeeded(store, n, timeout=60)
            pool.stop()
        found, to_start = start_latencies(store, task_ids)
    finally:
        close(target, store)
    return Latency(target, workers, to_start, check_entries(found, task_ids))


def run_idle(target: Target, count: int, tmp: Path, run: str) -> Latency:
    """One worker process, ``count`` tasks each submitted after it has been idle for
    ``IDLE_GAP`` seconds (longer than SQLite's quicker poll after work, ``loops.BUSY_FOR``):
    the figure of a first task after a quiet spell."""
    url, namespace = target.url(run)
    store = target.open(url, namespace)
    try:
        controller = submitter(store, run)
        with Pool(url, namespace, 1, tmp, target.extra) as pool:
            pool.release()
            task_ids = []
            for i in range(count):
                time.sleep(IDLE_GAP)
                task_ids.append(controller.submit("noop"))
                wait_succeeded(store, i + 1, timeout=30)
            pool.stop()
        found, to_start = start_latencies(store, task_ids)
    finally:
        close(target, store)
    return Latency(target, 1, to_start, check_entries(found, task_ids))


#: Seconds a worker is left idle before each task of ``run_idle``.
IDLE_GAP = BUSY_FOR + 0.5


def start_latencies(store: Any, task_ids: Sequence[str]) -> tuple[dict[str, Any], list[float]]:
    """Each task's history, and per task the seconds from ``created_at`` to its first
    ``RUNNING`` entry."""
    found = {t: store.history(t) for t in task_ids}
    to_start = []
    for task_id in task_ids:
        snapshot = store.get(task_id)
        running = [e.at for e in found[task_id] if e.to_status is TaskStatus.RUNNING]
        if snapshot is not None and running:
            to_start.append((running[0] - snapshot.created_at).total_seconds())
    return found, to_start


def idle_table(latencies: Sequence[Latency]) -> Table:
    table = Table(title=f"idle submit -> start: 1 worker process, each task after {IDLE_GAP:g} s "
                        "idle")  # fmt: skip
    table.add_column("store")
    for column in ("tasks", "start p50", "start p95", "start max", "exactly-once"):
        table.add_column(column, justify="right")
    for lat in latencies:
        ms = sorted(x * 1000 for x in lat.to_start) or [float("nan")]
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        table.add_row(lat.target.label, str(len(ms)), f"{statistics.median(ms):.1f} ms",
                      f"{p95:.1f} ms", f"{ms[-1]:.1f} ms", lat.check.verdict())  # fmt: skip
    return table


def wait_succeeded(store: Any, n: int, timeout: float) -> float:
    """Seconds until ``n`` tasks SUCCEEDED (``counts`` polled every 5 ms)."""
    started = time.perf_counter()
    while store.counts()[TaskStatus.SUCCEEDED] < n:
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"not drained within {timeout:.0f}s: {store.counts()}")
        time.sleep(0.005)
    return time.perf_counter() - started


def close(target: Target, store: Any) -> None:
    """Close the driver's store; a PostgreSQL run's schema is dropped (the next run has its
    own, and the server's tables stay small)."""
    try:
        if target.name.startswith("postgres"):
            store.drop_schema()
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per drain")
    parser.add_argument("--quick", action="store_true", help="1,500 tasks, shorter phases")
    parser.add_argument("--stores", default=",".join(STORES),
                        help=f"comma-separated, of {', '.join(STORES)}")  # fmt: skip
    parser.add_argument("--rate", type=float, default=50.0, help="submits/s, latency phase")
    parser.add_argument("--latency-seconds", type=float, help="default 10 (quick: 3)")
    parser.add_argument("--idle-tasks", type=int, help="tasks of the idle phase, default 12 "
                        "(quick: 5), each after a quiet spell")  # fmt: skip
    options = parser.parse_args(argv)
    names = [s.strip() for s in options.stores.split(",") if s.strip()]
    if not names or set(names) - set(STORES):
        parser.error(f"--stores: one or more of {', '.join(STORES)}, not {options.stores!r}")
    n = 1_500 if options.quick else options.tasks
    seconds = options.latency_seconds or (3.0 if options.quick else 10.0)
    console = Console(width=max(200, Console().width))
    console.print(f"load average at start: {load_average()}")
    console.print(f"{n:,} no-op tasks per drain; the workers are the CLI's defaults on each "
                  f"store ({NUM_BUCKETS} buckets, polls as `polling_for` sets them)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="chongming-bench-stores-") as tmp_name:
        tmp = Path(tmp_name)
        with targets(names, tmp) as stores:
            if n >= 1000:  # warm-up, not reported: first connections, caches, schema creation
                for target in stores:
                    run_drain(target, 1, 200, tmp, f"{target.name}-warmup")
            drained = [target for target in stores if target.name not in BEFORE]
            drains = [run_drain(target, w, n, tmp, f"{target.name}-tp-{w}p")
                      for w in (1, 2) for target in drained]  # fmt: skip
            console.print(drain_table(drains))
            for d in drains:
                for line in d.check.bad[:5]:
                    console.print(f"[red]{d.target.label}, {d.workers} proc: {line}")
            latencies = [run_latency(target, w, options.rate, seconds, tmp,
                                     f"{target.name}-lat-{w}p")
                         for w in (1, 2) for target in stores]  # fmt: skip
            console.print(latency_table(latencies, options.rate, seconds))
            idle_count = options.idle_tasks or (5 if options.quick else 12)
            idle = [run_idle(target, idle_count, tmp, f"{target.name}-idle") for target in stores]
            console.print(idle_table(idle))
    console.print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average at "
                  f"end {load_average()}; code under test: {code_under_test()}")  # fmt: skip


if __name__ == "__main__":
    main()
