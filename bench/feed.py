"""Benchmark of the change feed, measured in one run against a private redis-server.

    .venv/bin/python -m bench.feed            # full run: 10k and 1M tasks (a few minutes)
    .venv/bin/python -m bench.feed --quick    # 10k and 100k, for a smoke check

It prints:

1. the latency of a full page (256 items) at 10k and at N tasks, read from cursors spread over
   the feed, where positions are dense (tasks written once) and where they are sparse (9 in
   10 tasks moved on by a later save), and the ratios N / 10k (target: <= 1.5);
2. what the feed adds to a ``save``: the same save script with and without its feed parts
   (``FEED_PARTS``), alternated in blocks on the same connection (target: <= 10 % of the call);
3. Redis memory the feed costs per task: every feed chunk, the chunk index and the head, plus
   the ``fs`` field in each task hash (measured by removing it from a sample) (target: <= 60
   bytes).

No assertions: it reports, docs/performance.md records.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import datetime, timedelta, timezone

from rich.console import Console
from rich.table import Table

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.stores._redis.scripts import script_text
from chongming_redis.stores.redis import RedisTaskStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
PAGE = 256
#: What the feed adds to lua/save.lua, and the same lines without it.
FEED_PARTS = (
    ("rcall('HMGET', task_key, 'v', 'w', 'fs')", "rcall('HMGET', task_key, 'v', 'w')"),
    ("'fs', feed_next(root, stored[3], args.id),\n  unpack(args.writes)", "unpack(args.writes)"),
)


def task_id(i: int) -> str:
    return f"{(i * 0x9E3779B97F4A7C15) & (2**80 - 1):020x}"


def task(i: int, version: int = 1, status: TaskStatus = TaskStatus.PENDING) -> TaskSnapshot:
    created = T0 + timedelta(microseconds=i * 7)
    return TaskSnapshot(task_id(i), "thumbnails.resize", status, version, created, created,
                        tags=frozenset({"images"}), bucket=i % 64)  # fmt: skip


def fill(store: RedisTaskStore, n: int) -> None:
    for start in range(0, n, 100):
        store.commit_tasks([(task(i), None, []) for i in range(start, min(n, start + 100))])


def page_latency(store: RedisTaskStore, cursors: list[int]) -> float:
    """Median seconds of one full page read, over the given cursors."""
    times = []
    for cursor in cursors:
        start = time.perf_counter()
        page = store.changes(str(cursor), PAGE)
        times.append(time.perf_counter() - start)
        assert len(page.tasks) == PAGE, (cursor, len(page.tasks))
    return statistics.median(times)


def sparse(store: RedisTaskStore, n: int) -> list[int]:
    """Move 9 of every 10 tasks to the head (a save each); the old region keeps 1 in 10, so a
    page there spans ten times as many positions. Returns cursors inside that region."""
    for start in range(0, n, 100):
        batch = [(task(i, 2), 1, []) for i in range(start, min(n, start + 100)) if i % 10]
        store.commit_tasks(batch)
    rng = random.Random(1)
    return [rng.randrange(0, n - PAGE * 12) for _ in range(100)]


def feed_memory(store: RedisTaskStore, n: int) -> float:
    client, keys = store.client, store.keys
    total = 0
    for key in client.scan_iter(match=keys.root.replace("{", "\\{").replace("}", "\\}") + "fc*",
                                count=1000):  # fmt: skip
        total += client.memory_usage(key, samples=0) or 0
    total += client.memory_usage(keys.feed, samples=0) or 0
    sample = [task_id(i) for i in random.Random(2).sample(range(n), 2000)]
    delta = 0
    for tid in sample:
        key = keys.task(tid)
        with_fs = client.memory_usage(key, samples=0) or 0
        fs = client.hget(key, "fs")
        client.hdel(key, "fs")
        delta += with_fs - (client.memory_usage(key, samples=0) or 0)
        client.hset(key, "fs", fs)  # type: ignore[arg-type]
    return total / n + delta / len(sample)


def save_cost(store: RedisTaskStore, rounds: int) -> tuple[float, float]:
    """Median seconds per save, with and without the feed's line in the save script."""
    real = store._scripts["save"]
    text = script_text("save", legacy=store.legacy_scripts)
    for with_feed, without in FEED_PARTS:
        assert with_feed in text, with_feed
        text = text.replace(with_feed, without)
    bare = store.client.register_script(text)
    store.commit_tasks([(task(10**9), None, [])])
    version = 1
    per_call: dict[str, list[float]] = {"feed": [], "bare": []}
    for r in range(rounds):
        for label, script in (("feed", real), ("bare", bare))[:: 1 if r % 2 else -1]:
            store._scripts["save"] = script
            start = time.perf_counter()
            for _ in range(300):
                store.save(task(10**9, version + 1), expect_version=version)
                version += 1
            per_call[label].append((time.perf_counter() - start) / 300)
    store._scripts["save"] = real
    return statistics.median(per_call["feed"]), statistics.median(per_call["bare"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    big = 100_000 if args.quick else 1_000_000
    console = Console()
    server = EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
    try:
        results: dict[int, tuple[float, float]] = {}
        memory = 0.0
        for n in (10_000, big):
            store = RedisTaskStore.from_url(server.url, namespace=f"feed{n}")
            started = time.perf_counter()
            fill(store, n)
            console.print(f"filled {n:,} tasks in {time.perf_counter() - started:.1f} s")
            rng = random.Random(n)
            dense = page_latency(store, [rng.randrange(0, n - PAGE) for _ in range(200)])
            if n == big:
                memory = feed_memory(store, n)
            results[n] = (dense, page_latency(store, sparse(store, n)))
            store.client.flushdb()  # type: ignore[no-untyped-call]
        store = RedisTaskStore.from_url(server.url, namespace="save")
        with_feed, without = save_cost(store, 10 if args.quick else 30)
        table = Table(title="change feed")
        for column in ("measure", "value", "target"):
            table.add_column(column)
        small = results[10_000]
        for i, label in enumerate(("dense", "sparse")):
            table.add_row(f"page of {PAGE} at 10k, {label}", f"{small[i] * 1e3:.3f} ms", "")
            table.add_row(
                f"page of {PAGE} at {big:,}, {label}", f"{results[big][i] * 1e3:.3f} ms", ""
            )
            table.add_row(f"ratio {big:,} / 10k, {label}", f"{results[big][i] / small[i]:.2f}",
                          "<= 1.5")  # fmt: skip
        share = (with_feed - without) / with_feed
        table.add_row("save with the feed", f"{with_feed * 1e6:.1f} µs", "")
        table.add_row("save without the feed", f"{without * 1e6:.1f} µs", "")
        table.add_row("feed share of a save", f"{share * 100:.1f} %", "<= 10 %")
        table.add_row(f"feed bytes per task at {big:,}", f"{memory:.1f}", "<= 60")
        console.print(table)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
