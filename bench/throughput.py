"""End-to-end throughput of no-op tasks through real worker processes, measured in one run.

    .venv/bin/python -m bench.throughput                 # 10,000 tasks (about 2 minutes)
    .venv/bin/python -m bench.throughput --quick         # 1,500 tasks, a smoke check (< 60 s)
    .venv/bin/python -m bench.throughput --tasks 20000 --profile

It starts its own redis-server on a free loopback port (AOF off, so the figures are Redis,
client and Python work, not fsync) and, for 1 and then 2 worker processes, each in a fresh
namespace (after an unreported warm-up drain):

1. submits N no-op tasks through ``Controller.submit`` (timed separately), then starts the
   worker processes (``python -m bench.throughput worker``: a ``Controller`` with
   ``join_pool`` and ``start``), waits until their bucket pool has settled, releases them all
   at once and measures the drain: from that release until ``counts()[SUCCEEDED] == N``;
2. checks every task's history: exactly one ``PENDING -> RUNNING`` per attempt, one attempt,
   ending ``SUCCEEDED``;
3. Redis bytes per finished task (``used_memory`` delta / N, history and indexes included,
   measured once the workers have disconnected; also the ``MEMORY USAGE`` sum of the
   namespace's keys / N), Redis CPU per task (``used_cpu_*`` delta), the workers' Python CPU
   per task (``process_time`` of each worker from its release to the end of the drain), and
   the rate that CPU alone would allow on an idle box (other load skews the rates, CPU less);
4. round trips per finished task by kind, counted in the workers (every script call and read
   of ``RedisTaskStore``, every pub/sub publish) and cross-checked with ``INFO commandstats``;
5. submit -> start latency: workers idle-waiting, tasks submitted at a steady rate (``--rate``,
   50/s: well below what one worker drains, so it is latency, not queueing), latency =
   the ``RUNNING`` history entry's ``at`` minus the task's ``created_at`` (both on the server
   clock), p50/p99.

Then (unless ``--no-aof``) the drains again on a redis-server with ``appendfsync always``, with
a fifth of the tasks (every write waits for an fsync). ``--rtt-ms X`` adds drains (a quarter
of the tasks) whose workers reach Redis through ``bench/delay_proxy.py``, adding X ms of round
trip. ``--profile`` adds a 1-process drain
under cProfile (every thread of the worker, on its CPU clock) and prints where the Python time
goes. ``--metrics`` gives every worker the Prometheus series of ``--metrics-port``
(``WorkerMetrics``; nothing scrapes them), to measure what counting costs. The load average is
printed at the start and the end: on a shared 2-core box every rate here moves with what else
runs.

The workers run with the CLI's defaults (``--concurrency`` for a tuned run beside them). The
side-by-side comparison with the peers, measured in the same run, is ``bench.peers``; this
benchmark breaks a drain down into its costs per task (targets: Redis CPU <= 60 us, worker
Python CPU <= 100 us, Redis memory <= 500 bytes per finished task).
No assertions: it reports, the docs record (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench.delay_proxy import DelayProxy
from bench.drains import Check, check_entries, code_under_test, load_average, percentile
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.model import TaskStatus
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores._redis.rows import decode_entry
from chongming_redis.stores.redis import RedisTaskStore

ROOT = Path(__file__).resolve().parents[1]
#: The worker's settings are the CLI's defaults (``chongming-redis worker`` with no flags:
#: ``ControllerConfig()``'s concurrency and prefetch, a 1 s start poll that only matters when a
#: nudge is lost); ``--concurrency`` measures a tuned worker beside them. Ratios to the peers
#: are measured side by side by ``bench.peers``, not here.
CONCURRENCY = ControllerConfig().concurrency
NUM_BUCKETS = 64
WORKER_LEASE = 5.0
START_POLL = 1.0
COMMAND_POLL = 0.5
#: Set by ``--metrics`` for the worker processes: they count into ``WorkerMetrics``.
METRICS_ENV = "CHONGMING_BENCH_METRICS"

app = App("bench")


@app.task()
def noop(ctx: TaskContext, params: Any) -> None:
    return None


# -- the worker process -------------------------------------------------------------------------

#: Store methods that are one read round trip each (the write path goes through ``_run``).
READS = ("get", "history", "counts", "server_time", "bucket_counts", "pool_state")


class CallCounter:
    """Counts round trips by kind in one worker, with their wall time as the caller sees it:
    script calls by script name (replies that are a conflict counted apart), reads by method,
    publishes. Also the starter's busy time (``start_available``)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.counts[kind] += 1
            self.seconds[kind] += seconds

    def instrument(self, store: RedisTaskStore, controller: Controller) -> None:
        run = store._run

        def counted_run(
            name: str, keys: Sequence[str], args: Sequence[Any], **options: Any
        ) -> list[Any]:
            started = time.perf_counter()
            reply = run(name, keys, args, **options)
            kind = name if reply[0] != "CONFLICT" else f"{name} (conflict)"
            self.add(kind, time.perf_counter() - started)
            return reply

        store._run = counted_run  # type: ignore[method-assign]
        for method in READS:
            setattr(store, method, self._wrap(method, getattr(store, method)))
        notifier = controller.notifier
        notifier.publish = self._wrap("publish", notifier.publish)  # type: ignore[method-assign]
        start_available = controller.runner.start_available

        def timed_start() -> int:
            started = time.perf_counter()
            count = start_available()
            with self._lock:
                self.seconds["starter busy"] += time.perf_counter() - started
                self.counts["starter passes"] += 1
            return count

        controller.runner.start_available = timed_start  # type: ignore[method-assign]

    def _wrap(self, kind: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.add(kind, time.perf_counter() - started)

        return counted


def worker_controller(store: RedisTaskStore, owner: str, concurrency: int) -> Controller:
    events = None
    if os.environ.get(METRICS_ENV) == "1":
        from prometheus_client import CollectorRegistry

        from chongming_redis.metrics.worker import WorkerMetrics

        events = WorkerMetrics(CollectorRegistry(), tasks=app.types)
    return Controller(
        store, app=app, owner=owner, concurrency=concurrency,
        buckets=BucketPolicy(NUM_BUCKETS), start_poll_interval=START_POLL,
        command_poll_interval=COMMAND_POLL, task_lease=30.0, events=events,
    )  # fmt: skip


class ThreadProfiles:
    """cProfile in every thread started after ``install`` (cProfile sees one thread only),
    timed by each thread's own CPU clock."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._original = threading.Thread.run

    def install(self) -> None:
        original, profiles = self._original, self.profiles

        def run(thread: threading.Thread) -> None:
            # CPU time of this thread: wall time would charge GIL waits to whatever waited
            profile = cProfile.Profile(time.thread_time)
            profiles.append(profile)
            profile.enable()
            try:
                original(thread)
            finally:
                profile.disable()

        threading.Thread.run = run  # type: ignore[method-assign]

    def dump(self, path: str) -> None:
        stats: pstats.Stats | None = None
        for profile in self.profiles:
            profile.disable()  # no-op for the threads that ended; others are cut short
            with contextlib.suppress(TypeError):  # a profile that recorded nothing
                stats = pstats.Stats(profile) if stats is None else stats.add(profile)
        if stats is not None:
            stats.dump_stats(path)


def worker_main(argv: list[str]) -> None:
    """One worker process: build the controller, settle the pool, report ready, wait for the
    release, run until SIGTERM, then write a JSON report (CPU, round trips)."""
    parser = argparse.ArgumentParser(prog="bench.throughput worker")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--workers", type=int, required=True, help="pool size to wait for")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--report", required=True)
    parser.add_argument("--profile")
    options = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    store = RedisTaskStore.from_url(options.redis, namespace=options.namespace, check_server=False)
    controller = worker_controller(store, options.owner, options.concurrency)
    pool = controller.join_pool(worker_lease=WORKER_LEASE)
    counter = CallCounter()
    coord = redis.Redis.from_url(options.redis)
    # Settle the pool before the clock starts: every bucket owned, shares within one.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pool.tick()
        _, owners = store.pool_state()
        shares = Counter(owners.values())
        balanced = bool(shares) and max(shares.values()) - min(shares.values()) <= 1
        if len(owners) == NUM_BUCKETS and len(shares) == options.workers and balanced:
            break
        time.sleep(0.05)
    coord.rpush(coord_key(options.namespace, "ready"), options.owner)
    go = coord_key(options.namespace, "go", options.owner)
    deadline = time.monotonic() + 120
    while coord.blpop([go], timeout=1) is None:  # short: redis-py's socket timeout is 5 s
        if time.monotonic() > deadline or stop.is_set():
            return
    profiles = ThreadProfiles()
    if options.profile:
        profiles.install()
    counter.instrument(store, controller)
    cpu_start = time.process_time()
    controller.start()
    stop.wait()
    cpu = time.process_time() - cpu_start
    report = {"owner": options.owner, "cpu": cpu, "calls": dict(counter.counts),
              "seconds": dict(counter.seconds)}  # fmt: skip
    Path(options.report).write_text(json.dumps(report))
    controller.shutdown(grace=5)
    if options.profile:
        profiles.dump(options.profile)
    store.close()


def coord_key(namespace: str, *parts: str) -> str:
    return ":".join(("bench", namespace, *parts))


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class Workers:
    """Worker processes of one namespace, started and released together."""

    url: str
    namespace: str
    count: int
    concurrency: int
    tmp: Path
    profile: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    spawn_seconds: float = 0.0

    def start(self) -> None:
        started = time.perf_counter()
        coord = redis.Redis.from_url(self.url)
        for i in range(self.count):
            owner = f"bench-{self.namespace}-{i}"
            command = [
                sys.executable, "-m", "bench.throughput", "worker", f"--redis={self.url}",
                f"--namespace={self.namespace}", f"--owner={owner}", f"--workers={self.count}",
                f"--concurrency={self.concurrency}", f"--report={self.tmp / owner}.json",
                *([f"--profile={self.tmp / owner}.prof"] if self.profile else []),
            ]  # fmt: skip
            log = open(self.tmp / f"{owner}.log", "wb")  # noqa: SIM115 (kept while it runs)
            self.procs.append(subprocess.Popen(command, cwd=ROOT, stderr=log))
            self.owners.append(owner)
        ready, deadline = 0, time.monotonic() + 60
        while ready < self.count:
            if coord.blpop([coord_key(self.namespace, "ready")], timeout=1) is not None:
                ready += 1
            elif time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                raise RuntimeError(f"workers did not get ready:\n{self.logs()}")
        self.spawn_seconds = time.perf_counter() - started

    def release(self) -> None:
        coord = redis.Redis.from_url(self.url)
        for owner in self.owners:
            coord.rpush(coord_key(self.namespace, "go", owner), "1")

    def stop(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reports = []
        for owner in self.owners:
            path = self.tmp / f"{owner}.json"
            if path.exists():
                reports.append(json.loads(path.read_text()))
        return reports

    def logs(self) -> str:
        return "\n".join(
            (self.tmp / f"{o}.log").read_text(errors="replace")[-2000:] for o in self.owners
        )


@dataclass
class Drain:
    workers: int
    tasks: int
    submit_seconds: float
    spawn_seconds: float
    drain_seconds: float
    bytes_pending: float
    bytes_finished: float
    bytes_keys: float  # MEMORY USAGE of the namespace's keys, per task
    encodings: str  # OBJECT ENCODING of one finished task's hash and history
    redis_cpu: float
    python_cpu: float
    calls: Counter[str]
    seconds: Counter[str]
    server_calls: dict[str, tuple[int, int]]
    check: Check
    polls: int
    starter_passes: int = 0
    starter_busy: float = 0.0  # seconds per worker in start_available

    @property
    def rate(self) -> float:
        return self.tasks / self.drain_seconds


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def settle_clients(client: redis.Redis, timeout: float = 3.0) -> None:
    """Wait until only this client is connected: a worker's closed connections (and their
    buffers) must not count as task memory."""
    deadline = time.monotonic() + timeout
    while int(client.info("clients")["connected_clients"]) > 1 and time.monotonic() < deadline:
        time.sleep(0.02)


def key_bytes(client: redis.Redis, namespace: str) -> int:
    """Sum of ``MEMORY USAGE`` over the namespace's keys (values and key overhead, not the
    keyspace's hash-table slots nor allocator slack)."""
    total = 0
    keys = list(client.scan_iter(match="{" + namespace + "}:*", count=1000))
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 1000]:
            pipe.memory_usage(key, samples=0)
        total += sum(x or 0 for x in pipe.execute())
    return total


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def submit(controller: Controller, n: int, *, priorities: bool = False) -> list[str]:
    """``n`` no-op tasks; with ``priorities``, spread over priorities -5..5 (each task's own,
    so every start call merges several priority bands)."""
    if priorities:
        return [controller.submit("noop", priority=i * 7 % 11 - 5) for i in range(n)]
    return [controller.submit("noop") for _ in range(n)]


def wait_succeeded(store: RedisTaskStore, n: int, timeout: float) -> tuple[float, int]:
    """Seconds until ``n`` tasks SUCCEEDED (polling ``counts`` every 5 ms), and the polls."""
    started = time.perf_counter()
    polls = 0
    while True:
        polls += 1
        if store.counts()[TaskStatus.SUCCEEDED] >= n:
            return time.perf_counter() - started, polls
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"not drained within {timeout:.0f}s: {store.counts()}")
        time.sleep(0.005)


def histories(store: RedisTaskStore, task_ids: Sequence[str]) -> dict[str, list[Any]]:
    """Every task's history, read in pipelined batches."""
    result: dict[str, list[Any]] = {}
    client = store.client
    for start in range(0, len(task_ids), 500):
        batch = task_ids[start : start + 500]
        pipe = client.pipeline(transaction=False)
        for task_id in batch:
            pipe.zrangebyscore(store.keys.history(task_id), "-inf", "+inf")
        for task_id, members in zip(batch, pipe.execute()):
            key = store.keys.history(task_id)
            result[task_id] = [decode_entry(task_id, key, m) for m in members]
    return result


def check_histories(store: RedisTaskStore, task_ids: Sequence[str]) -> tuple[Check, dict]:
    """Every task's history (``histories``), checked for exactly-once starts (``check_entries``)."""
    found = histories(store, task_ids)
    return check_entries(found, task_ids), found


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """``{command: (calls, microseconds)}`` since the last ``CONFIG RESETSTAT``."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
    }


def run_drain(
    server: EmbeddedRedis, namespace: str, workers: int, n: int, concurrency: int, tmp: Path,
    *, profile: bool = False, priorities: bool = False, worker_url: str | None = None,
) -> tuple[Drain, Workers]:  # fmt: skip
    """``worker_url``: where the workers reach Redis (``--rtt-ms``: through the delay proxy)."""
    store = RedisTaskStore.from_url(server.url, namespace=namespace, check_server=False)
    client = server.client()
    submitter = Controller(store, app=app, owner=f"submitter-{namespace}",
                           buckets=BucketPolicy(NUM_BUCKETS))  # fmt: skip
    memory_before = used_memory(client)
    started = time.perf_counter()
    task_ids = submit(submitter, n, priorities=priorities)
    submit_seconds = time.perf_counter() - started
    memory_pending = used_memory(client)

    pool = Workers(worker_url or server.url, namespace, workers, concurrency, tmp,
                   profile=profile)  # fmt: skip
    try:
        pool.start()
        client.config_resetstat()
        cpu_before = redis_cpu(client)
        pool.release()
        drain_seconds, polls = wait_succeeded(store, n, timeout=max(120.0, n / 50))
        cpu_redis = redis_cpu(client) - cpu_before
        server_calls = commandstats(client)
    finally:
        reports = pool.stop()
    settle_clients(client)
    memory_after = used_memory(client)
    bytes_keys = key_bytes(client, namespace) / n
    sample = task_ids[0]
    encodings = " / ".join(
        client.object("encoding", key).decode()
        for key in (store.keys.task(sample), store.keys.history(sample))
    )
    check, _ = check_histories(store, task_ids)
    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for report in reports:
        calls.update(report["calls"])
        seconds.update(report["seconds"])
    starter = (calls.pop("starter passes", 0), seconds.pop("starter busy", 0.0))
    drain = Drain(
        workers=workers, tasks=n, submit_seconds=submit_seconds,
        spawn_seconds=pool.spawn_seconds, drain_seconds=drain_seconds,
        bytes_pending=(memory_pending - memory_before) / n,
        bytes_finished=(memory_after - memory_before) / n, bytes_keys=bytes_keys,
        encodings=encodings,
        redis_cpu=cpu_redis,
        python_cpu=sum(r["cpu"] for r in reports), calls=calls, seconds=seconds,
        server_calls=server_calls, check=check, polls=polls, starter_passes=starter[0],
        starter_busy=starter[1] / workers,
    )  # fmt: skip
    store.close()
    return drain, pool


def run_latency(
    server: EmbeddedRedis, namespace: str, workers: int, rate: float, seconds: float,
    concurrency: int, tmp: Path,
) -> tuple[list[float], list[float], Check]:  # fmt: skip
    """Submit at ``rate``/s for ``seconds`` to idle-waiting workers; per task the seconds from
    ``created_at`` to its RUNNING entry and to its SUCCEEDED entry."""
    store = RedisTaskStore.from_url(server.url, namespace=namespace, check_server=False)
    submitter = Controller(store, app=app, owner=f"submitter-{namespace}",
                           buckets=BucketPolicy(NUM_BUCKETS))  # fmt: skip
    pool = Workers(server.url, namespace, workers, concurrency, tmp)
    n = round(rate * seconds)
    task_ids: list[str] = []
    try:
        pool.start()
        pool.release()
        time.sleep(0.5)  # let them start and go idle
        began = time.perf_counter()
        for i in range(n):
            pause = began + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            task_ids.append(submitter.submit("noop"))
        wait_succeeded(store, n, timeout=60)
    finally:
        pool.stop()
    check, found = check_histories(store, task_ids)
    to_start, to_end = [], []
    for task_id in task_ids:
        snapshot = store.get(task_id)
        assert snapshot is not None
        entries = {e.to_status: e.at for e in found[task_id]}
        if TaskStatus.RUNNING in entries:
            to_start.append((entries[TaskStatus.RUNNING] - snapshot.created_at).total_seconds())
        if TaskStatus.SUCCEEDED in entries:
            to_end.append((entries[TaskStatus.SUCCEEDED] - snapshot.created_at).total_seconds())
    store.close()
    return to_start, to_end, check


# -- reporting ----------------------------------------------------------------------------------


def throughput_table(title: str, drains: Sequence[Drain]) -> Table:
    table = Table(title=title)
    for column in ("worker processes", "tasks", "submit (tasks/s)", "drain", "tasks/s",
                   "exactly-once"):  # fmt: skip
        table.add_column(column, justify="right")
    for d in drains:
        once = "yes" if d.check.exactly_once else f"NO ({len(d.check.bad)} bad)"
        table.add_row(
            str(d.workers), f"{d.tasks:,}", f"{d.tasks / d.submit_seconds:,.0f}",
            f"{d.drain_seconds:.2f} s", f"{d.rate:,.0f}", once,
        )  # fmt: skip
    return table


def cost_table(drains: Sequence[Drain]) -> Table:
    table = Table(title="cost per finished task (AOF off)")
    table.add_column("measure")
    for d in drains:
        table.add_column(f"{d.workers} proc", justify="right")
    rows: list[tuple[str, Callable[[Drain], str]]] = [
        ("Redis bytes per pending task", lambda d: f"{d.bytes_pending:,.0f}"),
        ("Redis bytes per finished task (history incl.)", lambda d: f"{d.bytes_finished:,.0f}"),
        ("  of which in its keys (MEMORY USAGE)", lambda d: f"{d.bytes_keys:,.0f}"),
        ("  encoding of a task's hash / history", lambda d: d.encodings),
        ("worker Python CPU per task", lambda d: f"{d.python_cpu / d.tasks * 1e6:,.0f} µs"),
        ("redis-server CPU per task", lambda d: f"{d.redis_cpu / d.tasks * 1e6:,.0f} µs"),
        ("ceiling from CPU alone (idle box)", lambda d: f"{cpu_ceiling(d):,.0f} tasks/s"),
        ("round trips per task (workers)",
         lambda d: f"{(sum(d.calls.values())) / d.tasks:.2f}"),
        ("tasks started per worker", lambda d: ", ".join(
            f"{v:,}" for _, v in sorted(d.check.started_by.items()))),
        ("worker spawn + pool settle", lambda d: f"{d.spawn_seconds:.2f} s"),
    ]  # fmt: skip
    for name, cell in rows:
        table.add_row(name, *(cell(d) for d in drains))
    table.caption = (
        "a history is a sorted set: one entry longer than zset-max-listpack-value (64 bytes), "
        "e.g. 'started by <a long worker id> (attempt 1)', makes it a skiplist (~1 KB more)"
    )
    return table


def cpu_ceiling(d: Drain) -> float:
    """The rate the measured CPU per task allows on an idle machine: each worker process is
    held to one core by the GIL, redis-server to one core, and all of them share the cores."""
    python, server = d.python_cpu / d.tasks, d.redis_cpu / d.tasks
    cores = os.cpu_count() or 1
    return min(d.workers / python, 1 / server, cores / (python + server))


def calls_table(drains: Sequence[Drain]) -> Table:
    table = Table(title="round trips per finished task by kind, counted in the workers "
                        "(µs: mean wall time per call as the caller sees it)")  # fmt: skip
    table.add_column("kind")
    for d in drains:
        table.add_column(f"{d.workers} proc", justify="right")
    for d in drains:
        table.add_column(f"µs/call {d.workers} proc", justify="right")
    kinds = sorted({k for d in drains for k in d.calls}, key=lambda k: -drains[0].calls[k])
    for kind in kinds:
        table.add_row(
            kind, *(f"{d.calls[kind] / d.tasks:.3f}" for d in drains),
            *(f"{d.seconds[kind] / max(1, d.calls[kind]) * 1e6:,.0f}" for d in drains),
        )  # fmt: skip
    table.add_row("total", *(f"{sum(d.calls.values()) / d.tasks:.3f}" for d in drains))
    table.add_row(
        "starter passes (start_available)",
        *(f"{d.starter_passes / d.tasks:.3f}" for d in drains),
        *(f"{d.starter_busy / d.drain_seconds:.0%} busy" for d in drains),
    )  # fmt: skip
    return table


def server_table(drains: Sequence[Drain]) -> Table:
    table = Table(
        title="redis-server commands per finished task during the drain "
        "(commandstats; a script's µs include its nested commands')"
    )
    table.add_column("command")
    for d in drains:
        table.add_column(f"{d.workers} proc", justify="right")
    for d in drains:
        table.add_column(f"µs/task {d.workers} proc", justify="right")
    names = sorted({k for d in drains for k in d.server_calls},
                   key=lambda k: -drains[0].server_calls.get(k, (0, 0))[1])  # fmt: skip
    for name in names:
        per = [d.server_calls.get(name, (0, 0)) for d in drains]
        if max(calls for calls, _ in per) >= 0.001 * drains[0].tasks:
            table.add_row(name, *(f"{c / d.tasks:.3f}" for (c, _), d in zip(per, drains)),
                          *(f"{u / d.tasks:.1f}" for (_, u), d in zip(per, drains)))  # fmt: skip
    table.caption = "hgetall includes the driver's counts() polls: " + ", ".join(
        f"{d.polls / d.tasks:.3f}/task ({d.workers} proc)" for d in drains
    )
    return table


def profile_table(paths: Sequence[Path], n: int, top: int = 30) -> Table:
    stats = pstats.Stats(*(str(p) for p in paths if p.exists()), stream=io.StringIO())
    entries = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(filename).name}:{line} {name}" if line else name
        entries.append((where, calls, tottime, cumtime))
    table = Table(title=f"cProfile, 1 worker process, all threads, per finished task ({n:,})")
    for column in ("function", "calls/task", "own µs/task", "cumulative µs/task"):
        table.add_column(column, justify="right" if column != "function" else "left")
    for where, calls, tottime, cumtime in sorted(entries, key=lambda e: -e[2])[:top]:
        table.add_row(where[:70], f"{calls / n:.2f}", f"{tottime / n * 1e6:.1f}",
                      f"{cumtime / n * 1e6:.1f}")  # fmt: skip
    return table


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per drain")
    parser.add_argument("--quick", action="store_true", help="1,500 tasks, shorter phases")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="slots per worker")
    parser.add_argument("--no-aof", action="store_true", help="skip the appendfsync always run")
    parser.add_argument("--profile", action="store_true", help="add a 1-process cProfile drain")
    parser.add_argument("--rate", type=float, default=50.0, help="submits/s, latency phase")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="add drains whose workers reach Redis through a proxy adding this "
                             "round trip (bench/delay_proxy.py)")  # fmt: skip
    parser.add_argument("--metrics", action="store_true",
                        help="workers keep the Prometheus series of --metrics-port")  # fmt: skip
    options = parser.parse_args()
    if options.metrics:
        os.environ[METRICS_ENV] = "1"  # the worker processes inherit it
    n = 1_500 if options.quick else options.tasks
    latency_rate, latency_seconds = options.rate, (3.0 if options.quick else 10.0)
    console = Console(width=max(120, Console().width))
    tmp = Path(tempfile.mkdtemp(prefix="chongming-bench-"))
    console.print(f"load average at start: {load_average()}")
    console.print(
        f"{n:,} no-op tasks per drain; workers: concurrency {options.concurrency}, "
        f"{NUM_BUCKETS} buckets, worker lease {WORKER_LEASE:.0f} s, start poll "
        f"{START_POLL * 1000:.0f} ms, command poll {COMMAND_POLL * 1000:.0f} ms"
        + ("; Prometheus series kept (--metrics)" if options.metrics else "")
    )

    server = EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
    try:
        # Warm-up, not reported: script cache, keyspace tables, first connections.
        run_drain(server, "warmup", 1, min(n, 500), options.concurrency, tmp)
        drains = [run_drain(server, f"tp-{w}p", w, n, options.concurrency, tmp)[0] for w in (1, 2)]
        console.print(throughput_table("drain of pre-submitted no-op tasks, AOF off", drains))
        mixed = [run_drain(server, f"pr-{w}p", w, n, options.concurrency, tmp,
                           priorities=True)[0] for w in (1, 2)]  # fmt: skip
        console.print(throughput_table("the same drain, priorities -5..5 mixed, AOF off", mixed))
        console.print("mixed priorities / plain: " + ", ".join(
            f"{m.workers} proc {m.rate / d.rate:.2f}x"
            for m, d in zip(mixed, drains)))  # fmt: skip
        console.print(cost_table(drains))
        console.print(calls_table(drains))
        console.print(server_table(drains))
        for d in drains:
            for line in d.check.bad[:5]:
                console.print(f"[red]{d.workers} proc: {line}")

        latency = Table(title=f"submit -> start latency, {latency_rate:.0f} tasks/s submitted "
                              f"for {latency_seconds:.0f} s to idle workers, AOF off")  # fmt: skip
        for column in ("worker processes", "tasks", "start p50", "start p99", "start max",
                       "finish p50", "finish p99", "exactly-once"):  # fmt: skip
            latency.add_column(column, justify="right")
        for w in (1, 2):
            to_start, to_end, check = run_latency(
                server, f"lat-{w}p", w, latency_rate, latency_seconds, options.concurrency, tmp
            )
            ms = [x * 1000 for x in to_start]
            end_ms = [x * 1000 for x in to_end]
            latency.add_row(
                str(w), f"{len(ms):,}", f"{statistics.median(ms):.2f} ms",
                f"{percentile(ms, 99):.2f} ms", f"{max(ms):.2f} ms",
                f"{statistics.median(end_ms):.2f} ms", f"{percentile(end_ms, 99):.2f} ms",
                "yes" if check.exactly_once else f"NO ({len(check.bad)} bad)",
            )  # fmt: skip
        console.print(latency)

        if options.rtt_ms > 0:
            rtt_drains = []
            assert server.port is not None  # started on a TCP port (port=0 above)
            with DelayProxy(server.port, options.rtt_ms / 1000) as proxy:
                for w in (1, 2):
                    rtt_drains.append(run_drain(server, f"rtt-{w}p", w, max(300, n // 4),
                                                options.concurrency, tmp,
                                                worker_url=proxy.url)[0])  # fmt: skip
            console.print(throughput_table(
                f"drain through a proxy adding {options.rtt_ms:g} ms of round trip "
                "(the proxy's CPU included), AOF off", rtt_drains))  # fmt: skip

        if options.profile:
            drain, pool = run_drain(server, "prof-1p", 1, n, options.concurrency, tmp,
                                    profile=True)  # fmt: skip
            console.print(f"profiled drain: {drain.rate:,.0f} tasks/s under cProfile")
            console.print(profile_table([tmp / f"{o}.prof" for o in pool.owners], n))
        version = server.client().info("server")["redis_version"]
    finally:
        server.stop()

    if not options.no_aof:
        n_aof = max(200, n // 5)
        aof = EmbeddedRedis(port=0).start()  # the default: appendonly yes, appendfsync always
        try:
            aof_drains = [
                run_drain(aof, f"aof-{w}p", w, n_aof, options.concurrency, tmp)[0] for w in (1, 2)
            ]
            title = f"drain, appendfsync always (AOF in {aof.dir.parent})"
            console.print(throughput_table(title, aof_drains))
        finally:
            aof.stop()
    console.print(f"redis-server {version}, Python {sys.version.split()[0]}, "
                  f"redis-py {redis.__version__}, {os.cpu_count()} cores, load average at end "
                  f"{load_average()}; code under test: {code_under_test()}")  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
