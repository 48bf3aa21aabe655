"""Benchmark of RedisTaskStore against the bare Redis round trip, measured in one run.

    .venv/bin/python -m bench.store_ops            # full run (100k tasks, a few minutes)
    .venv/bin/python -m bench.store_ops --quick    # smaller, for a smoke check

It starts its own redis-server on a free loopback port (AOF off, so the figures are Redis and
client work, not fsync) and prints:

1. ops/s of each protocol call from one connection (and of ``Controller.submit``), and its
   ratio to a bare ``EVALSHA`` of a trivial compare-and-set script on the same connection,
   each call alternating with one bare call (target: >= 0.8 for every single-task call);
2. latency of a bucket-filtered ``PENDING`` query with ``limit=50`` at 10k and at 100k tasks,
   and their ratio (target: <= 1.5);
3. Redis memory per stored task (``used_memory`` delta / N) for a typical pending task with two
   tags, every index included (target: <= 700 bytes);
4. the slowest script call seen by SLOWLOG while 100k tasks are stored, queried and pruned
   (target: none over 10 ms).

No assertions: it reports, the docs record (docs/performance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from chongming_redis import (
    Command,
    CommandKind,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.embedded import EmbeddedRedis
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BARE_CAS = """
local v = redis.call('HGET', KEYS[1], 'v')
if v == ARGV[1] then redis.call('HSET', KEYS[1], 'v', ARGV[2]) return 1 end
return 0
"""
NUM_BUCKETS = 64

submit_app = App("bench-ops")


class Resize(BaseModel):
    w: int
    h: int


@submit_app.task(name="resize")
def resize(ctx: TaskContext, params: Resize) -> None:
    return None


def task_id(i: int) -> str:
    """A typical generated id: 20 hex characters (80 random-looking bits)."""
    return f"{(i * 0x9E3779B97F4A7C15) & (2**80 - 1):020x}"


def typical_task(i: int) -> TaskSnapshot:
    """A pending task as a producer submits it: a name, two tags, a key, small params."""
    created = T0 + timedelta(microseconds=i * 7)
    return TaskSnapshot(
        task_id(i), "thumbnails.resize", TaskStatus.PENDING, 1, created, created,
        tags=frozenset({"images", "tenant-42"}), bucket=i % NUM_BUCKETS,
        key=f"user-{i % 5000}", params={"w": 320, "h": 240},
    )  # fmt: skip


def interleaved(
    call: Callable[[int], object], bare: Callable[[int], object], n: int
) -> tuple[float, float]:
    """``(call ops/s, bare ops/s)`` over ``n`` calls of each, alternating one call with one
    bare round trip, so both see the same machine at the same moment (a shared machine's
    load drifts between blocks of calls, not between neighbouring calls)."""
    spent = spent_bare = 0.0
    clock = time.perf_counter
    for i in range(n):
        started = clock()
        call(i)
        middle = clock()
        bare(i)
        spent += middle - started
        spent_bare += clock() - middle
    return n / spent, n / spent_bare


def measure_ops(store: RedisTaskStore, n: int) -> list[tuple[str, float, float]]:
    """``(call, ops/s, bare ops/s)``: each call alternates with a bare compare-and-set
    ``EVALSHA`` on the same connection (``interleaved``)."""
    client = store._client
    script = client.register_script(BARE_CAS)
    client.hset("bench-bare", "v", "0")

    def bare(i: int) -> object:
        return script(keys=["bench-bare"], args=[i, i + 1])

    snaps = [typical_task(10_000_000 + i) for i in range(n)]
    plain = [typical_task(20_000_000 + i) for i in range(n)]
    running = [dataclasses.replace(s, status=TaskStatus.RUNNING, status_version=2) for s in snaps]
    beat = [dataclasses.replace(s, status_version=3, heartbeat_at=T0 + timedelta(seconds=2))
            for s in running]  # fmt: skip
    commands = [Command(f"cmd-{i}", snaps[i].task_id, CommandKind.STOP, T0) for i in range(n)]
    now = T0 + timedelta(seconds=1)
    submitter = Controller(store, app=submit_app, owner="bench-submit")
    ops: list[tuple[str, Callable[[int], object]]] = [
        ("create", lambda i: store.create(snaps[i])),
        ("get", lambda i: store.get(snaps[i].task_id)),
        ("save (status change: indexes move)",
         lambda i: store.save(running[i], expect_version=1)),
        ("save (same status)", lambda i: store.save(beat[i], expect_version=2)),
        ("touch", lambda i: store.touch(snaps[i].task_id, progress=Progress(i, n),
                                        heartbeat_at=now)),
        ("append", lambda i: store.append(Transition(snaps[i].task_id, 4, TaskStatus.RUNNING,
                                                     TaskStatus.RUNNING, now))),
        ("history", lambda i: store.history(snaps[i].task_id)),
        ("submit_command", lambda i: store.submit_command(commands[i])),
        ("claim_commands (1)", lambda i: store.claim_commands(now=now, lease_seconds=60, limit=1)),
        ("release_command", lambda i: store.release_command(commands[i].command_id, now=now)),
        ("complete_command", lambda i: store.complete_command(commands[i].command_id, now=now)),
        ("counts", lambda i: store.counts()),
        ("query PENDING, one bucket, limit 1", lambda i: store.query(
            TaskQuery(statuses=frozenset({TaskStatus.PENDING}),
                      buckets=frozenset({i % NUM_BUCKETS}), limit=1))),
        ("query RUNNING, one bucket, limit 50", lambda i: store.query(
            TaskQuery(statuses=frozenset({TaskStatus.RUNNING}),
                      buckets=frozenset({i % NUM_BUCKETS}), limit=50))),
        ("Controller.submit (validate, create + history + nudge)",
         lambda i: submitter.submit("resize", {"w": 320, "h": 240})),
    ]  # fmt: skip
    for i in range(n):  # PENDING tasks for the limit-1 query to find in every bucket
        store.create(plain[i])
    return [(name, *interleaved(call, bare, n)) for name, call in ops]


def fill(store: RedisTaskStore, start: int, stop: int) -> None:
    for i in range(start, stop):
        store.create(typical_task(i))


def query_latency(store: RedisTaskStore, rounds: int = 300) -> float:
    """Median seconds of a PENDING query on 4 buckets with limit 50."""
    samples = []
    for r in range(rounds):
        buckets = frozenset({(r + k * 16) % NUM_BUCKETS for k in range(4)})
        query = TaskQuery(statuses=frozenset({TaskStatus.PENDING}), buckets=buckets, limit=50)
        start = time.perf_counter()
        found = store.query(query)
        samples.append(time.perf_counter() - start)
        assert len(found) == 50
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3k ops, 2k/20k tasks")
    options = parser.parse_args()
    n_ops, small, large = (3_000, 2_000, 20_000) if options.quick else (9_000, 10_000, 100_000)
    console = Console()
    extra = ("--appendonly", "no", "--slowlog-log-slower-than", "10000")
    server = EmbeddedRedis(port=0, extra_args=extra).start()
    try:
        store = RedisTaskStore.from_url(server.url, namespace="bench-ops", check_server=False)
        table = Table(title=f"protocol calls, one connection, {n_ops} calls each")
        table.add_column("call")
        table.add_column("ops/s", justify="right")
        table.add_column("ratio to bare", justify="right")
        table.add_column("bare EVALSHA ops/s", justify="right")
        for name, ops, bare in measure_ops(store, n_ops):
            table.add_row(name, f"{ops:,.0f}", f"{ops / bare:.2f}", f"{bare:,.0f}")
        console.print(table)

        client = server.client()
        client.slowlog_reset()
        mem_store = RedisTaskStore.from_url(server.url, namespace="bench-mem", check_server=False)
        before = int(client.info("memory")["used_memory"])
        fill(mem_store, 0, small)
        small_latency = query_latency(mem_store)
        fill(mem_store, small, large)
        after = int(client.info("memory")["used_memory"])
        large_latency = query_latency(mem_store)
        per_task = (after - before) / large
        for i in range(large):  # finish every task, then prune them all in bounded batches
            if i % 2 == 0:
                snap = typical_task(i)
                mem_store.save(dataclasses.replace(snap, status=TaskStatus.SUCCEEDED,
                                                   status_version=2), expect_version=1)  # fmt: skip
        start = time.perf_counter()
        pruned = mem_store.prune(keep_terminal=0)
        prune_seconds = time.perf_counter() - start
        slow = [e for e in client.slowlog_get(128) if b"EVALSHA" in (e.get("command") or b"")]
        worst_us = max((int(e["duration"]) for e in slow), default=0)
        for entry in slow:
            console.print(f"slow: {entry['duration']} µs {entry['command'][:120]!r}")

        summary = Table(title="queries, memory, slow scripts")
        summary.add_column("measure")
        summary.add_column("value", justify="right")
        summary.add_column("target", justify="right")
        summary.add_row(f"query p50 at {small:,} tasks", f"{small_latency * 1e6:,.0f} µs", "")
        summary.add_row(f"query p50 at {large:,} tasks", f"{large_latency * 1e6:,.0f} µs", "")
        summary.add_row("ratio large/small", f"{large_latency / small_latency:.2f}", "<= 1.5")
        summary.add_row("bytes per pending task (2 tags)", f"{per_task:,.0f}", "<= 700")
        summary.add_row(f"prune of {pruned:,} tasks", f"{prune_seconds:.2f} s", "")
        summary.add_row("script calls over 10 ms (SLOWLOG)", str(len(slow)), "0")
        summary.add_row("slowest of those", f"{worst_us / 1000:.1f} ms", "")
        console.print(summary)
        console.print(f"redis-server {client.info('server')['redis_version']}, "
                      f"Python {sys.version.split()[0]}, {os.cpu_count()} cores")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
