"""Benchmark of the built-in stores, each call against its own bare round trip, in one run.

    .venv/bin/python -m bench.store_ops                  # every store, full sizes
    .venv/bin/python -m bench.store_ops --quick          # smaller, for a smoke check
    .venv/bin/python -m bench.store_ops --store sqlite   # memory|redis|sqlite|postgres|all

It starts its own servers: a redis-server on a free loopback port (AOF off, so the figures
are Redis and client work, not fsync) and a private PostgreSQL (``initdb`` in a temporary
directory, a free loopback port, the distribution's defaults: ``fsync`` on); SQLite is a file
in a temporary directory, with the store's defaults (WAL, ``synchronous=FULL``). For each store
it prints:

1. ops/s and µs of each protocol call from one connection (and of ``Controller.submit``), and
   its ratio to the store's own bare round trip on the same server or file, each call
   alternating with one bare call (target on Redis: >= 0.8 for every single-task call). The
   bare round trip: Redis, an ``EVALSHA`` of a trivial compare-and-set script on the same
   connection; SQLite and PostgreSQL, see ``bench.store_ops_sql``; in-memory, a compare-and-set
   of a dict under a lock (no I/O: there, a call's µs are its Python work);
2. latency of a bucket-filtered ``PENDING`` query with ``limit=50`` at 10k and at 100k tasks,
   and their ratio (target: <= 1.5);
3. bytes per stored task for a typical pending task with two tags, every index included
   (Redis ``used_memory``, target <= 700; SQLite the file's growth; PostgreSQL the tables');
4. the time to prune 50k terminal tasks, and on Redis the slowest script call seen by SLOWLOG
   while 100k tasks are stored, queried and pruned (target: none over 10 ms).

No assertions: it reports, the docs record (docs/performance.md, docs/store-guide.md §10).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence

from rich.console import Console

from bench.drains import code_under_test, load_average
from bench.store_calls import (
    OpsRow,
    cas_values,
    measure_ops,
    ops_table,
    ratios_table,
    scale_and_prune,
)
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore

BARE_CAS = """
local v = redis.call('HGET', KEYS[1], 'v')
if v == ARGV[1] then redis.call('HSET', KEYS[1], 'v', ARGV[2]) return 1 end
return 0
"""
STORES = ("memory", "redis", "sqlite", "postgres")


def redis_bare(store: RedisTaskStore) -> Callable[[int], object]:
    """A bare compare-and-set ``EVALSHA`` on the store's own connection, one that succeeds
    (and so writes) every time."""
    client = store._client
    script = client.register_script(BARE_CAS)
    client.hset("bench-bare", "v", "0")
    values = cas_values()
    return lambda i: script(keys=["bench-bare"], args=next(values))


def run_redis(console: Console, n_ops: int, small: int, large: int) -> list[OpsRow]:
    extra = ("--appendonly", "no", "--slowlog-log-slower-than", "10000")
    server = EmbeddedRedis(port=0, extra_args=extra).start()
    try:
        store = RedisTaskStore.from_url(server.url, namespace="bench-ops", check_server=False)
        rows = measure_ops(store, redis_bare(store), n_ops)
        title = f"Redis: protocol calls, one connection, {n_ops} calls each"
        console.print(ops_table(title, rows, "EVALSHA"))

        client = server.client()
        client.slowlog_reset()
        mem_store = RedisTaskStore.from_url(server.url, namespace="bench-mem", check_server=False)
        summary = scale_and_prune(
            "Redis", mem_store, small, large, batched=False,
            size=lambda: int(client.info("memory")["used_memory"]),
            size_name="used_memory per pending task (2 tags)", size_target="<= 700",
        )  # fmt: skip
        slow = [e for e in client.slowlog_get(128) if b"EVALSHA" in (e.get("command") or b"")]
        worst_us = max((int(e["duration"]) for e in slow), default=0)
        for entry in slow:
            console.print(f"slow: {entry['duration']} µs {entry['command'][:120]!r}")
        summary.add_row("script calls over 10 ms (SLOWLOG)", str(len(slow)), "0")
        summary.add_row("slowest of those", f"{worst_us / 1000:.1f} ms", "")
        console.print(summary)
        console.print(f"redis-server {client.info('server')['redis_version']}, AOF off")
    finally:
        server.stop()
    return rows


def memory_bare() -> Callable[[int], object]:
    """The in-memory store's bare compare-and-set: what each of its methods wraps, one
    critical section under a lock around a dict."""
    lock, cell, values = threading.Lock(), {"v": 0}, cas_values()

    def bare(i: int) -> object:
        expected, new = next(values)
        with lock:
            if cell["v"] == expected:
                cell["v"] = new
        return None

    return bare


def run_memory(console: Console, n_ops: int, small: int, large: int) -> list[OpsRow]:
    """No I/O at all: each call's µs is its Python work (checks, the codec's rows, indexes)."""
    rows = measure_ops(InMemoryTaskStore(), memory_bare(), n_ops)
    title = f"in-memory: protocol calls, {n_ops} calls each"
    console.print(ops_table(title, rows, "lock + dict compare-and-set"))
    # 30 queries at each size: every one reads every task (the reference store has no index)
    summary = scale_and_prune("in-memory", InMemoryTaskStore(), small, large, batched=True,
                              rounds=30)  # fmt: skip
    console.print(summary)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3k ops, 2k/20k tasks")
    parser.add_argument("--store", choices=(*STORES, "all"), default="all")
    parser.add_argument("--ops", type=int, help="calls of each kind (default 9k, quick 3k)")
    parser.add_argument("--tasks", type=int, help="the large size (default 100k, quick 20k); "
                        "the small one is a tenth")  # fmt: skip
    options = parser.parse_args(argv)
    n_ops, large = (3_000, 20_000) if options.quick else (9_000, 100_000)
    n_ops, large = options.ops or n_ops, options.tasks or large
    if large < 10_000:  # the query wants 50 tasks of 4 buckets at the small size
        parser.error("--tasks must be at least 10000")
    small = large // 10
    console = Console(width=max(150, Console().width))
    console.print(f"load average at start: {load_average()}")
    runs: dict[str, list[OpsRow]] = {}
    stores = STORES if options.store == "all" else (options.store,)
    if "memory" in stores:
        runs["in-memory"] = run_memory(console, n_ops, small, large)
    if "redis" in stores:
        runs["Redis"] = run_redis(console, n_ops, small, large)
    if "sqlite" in stores or "postgres" in stores:
        from bench.store_ops_sql import run_postgres, run_sqlite  # psycopg only when asked

        if "sqlite" in stores:
            runs["SQLite"] = run_sqlite(console, n_ops, small, large)
        if "postgres" in stores:
            runs["PostgreSQL"] = run_postgres(console, n_ops, small, large)
    if len(runs) > 1:
        console.print(ratios_table(runs))
    console.print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average at "
                  f"end {load_average()}; code under test: {code_under_test()}")  # fmt: skip


if __name__ == "__main__":
    main()
