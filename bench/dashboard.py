"""How fast the dashboard answers with 100,000 tasks in Redis, measured over HTTP.

    .venv/bin/python -m bench.dashboard            # 100,000 tasks (about a minute to fill)
    .venv/bin/python -m bench.dashboard --quick    # 10,000 tasks

It starts its own redis-server on a free loopback port, fills one namespace (seven statuses,
five task names, ten tags, 64 buckets, a pipeline, commands waiting, two live workers), serves
the dashboard exactly as ``chongming-redis dashboard`` does (uvicorn, defaults) and times each
page from a client on the same machine: the first request (cold) and the median and 95th
percentile of the next ones. The overview's one-second shared cache is emptied before every
request, so each one pays for its store reads. Each figure is printed with its ratio to the
200 ms budget and to a bare Redis ``PING`` round trip measured in the same run.

No assertions: it reports, the docs record (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import httpx
import uvicorn
from rich.console import Console
from rich.table import Table

from chongming_redis.dashboard import create_app
from chongming_redis.dashboard.listing import format_mark
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.redis import RedisTaskStore

BUDGET = 0.200
NAMES = ("resize", "mail.send", "mail.digest", "report", "sync")
STATUSES = list(TaskStatus)
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def task(i: int) -> TaskSnapshot:
    status = STATUSES[i % 7] if i % 10 else TaskStatus.SUCCEEDED
    at = BASE + timedelta(milliseconds=i * 10)
    return TaskSnapshot(
        task_id=f"task-{i:07d}", name=NAMES[i % 5], status=status, status_version=1,
        created_at=at, updated_at=at, tags=frozenset({f"t{i % 10}"}), bucket=i % 64,
        key=f"k{i}", pipeline_run_id="run-1" if i % 1000 == 0 else None, params={"i": i},
        progress=Progress(i % 100, 100) if status is TaskStatus.RUNNING else None,
        failure=Failure("ValueError", "bad input", "Traceback ...")
        if status is TaskStatus.FAILED else None,
    )  # fmt: skip


def fill(store: RedisTaskStore, n: int) -> None:
    for start in range(0, n, 100):
        items = []
        for i in range(start, min(n, start + 100)):
            snap = task(i)
            entry = Transition(snap.task_id, 1, None, snap.status, snap.created_at, "bench")
            items.append((snap, None, [entry]))
        errors = store.commit_tasks(items)
        assert not any(errors), errors
    now = store.server_time()
    for c in range(20):
        store.submit_command(Command(f"c{c}", f"task-{c:07d}", CommandKind.STOP,
                                     now - timedelta(seconds=c)))  # fmt: skip
    for worker, buckets in (("worker-a", range(0, 32)), ("worker-b", range(32, 64))):
        store.pool_tick(worker=worker, now=now, lease_seconds=600, num_buckets=64,
                        wanted=list(buckets))  # fmt: skip


def timed(call: Callable[[], object], rounds: int) -> tuple[float, float, float]:
    """(first, median, p95) seconds."""
    samples = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    first, rest = samples[0], sorted(samples[1:])
    return first, statistics.median(rest), rest[int(len(rest) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 tasks")
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()
    n = 10_000 if options.quick else 100_000
    console = Console()
    server = EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
    try:
        store = RedisTaskStore.from_url(server.url, namespace="bench-dash", check_server=False)
        began = time.perf_counter()
        fill(store, n)
        console.print(f"filled {n:,} tasks in {time.perf_counter() - began:.1f} s")
        run(console, store, server.client(), n, options.rounds)
        store.close()
    finally:
        server.stop()


def run(console: Console, store: RedisTaskStore, bare: object, n: int, rounds: int) -> None:
    app = create_app(store, namespace="bench-dash")
    dash = app.state.dash
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    while not web.started:
        time.sleep(0.02)
    port = web.servers[0].sockets[0].getsockname()[1]
    middle = task(n // 2)  # the tasks are made in created_at order: no query needed
    mark = quote(format_mark((middle.created_at, middle.task_id)), safe="")
    feed_mid = str(store.feed_stats().head // 2)
    pages = [
        ("overview /", "/", True),
        ("list /tasks (no filter: the default page)", "/tasks", False),
        ("list: status=failed, name=mail.send", "/tasks?status=failed&name=mail.send", False),
        ("list: tag=t3", "/tasks?tag=t3", False),
        ("list: tag=t3, status=paused, bucket=7 (rare)", "/tasks?tag=t3&status=paused&bucket=7",
         False),
        ("list: bucket 5, pending, newest first",
         "/tasks?bucket=5&status=pending&order=newest", False),
        ("list: prefix=mail, after the middle task", f"/tasks?prefix=mail&after={mark}", False),
        ("list: everything, middle page", f"/tasks?after={mark}", False),
        ("task page", "/tasks/task-0000003", False),
        ("/api/v1/tasks (256 items)", f"/api/v1/tasks?after={feed_mid}", False),
        ("/metrics", "/metrics", False),
    ]  # fmt: skip
    ping = timed(lambda: bare.ping(), 200)[1]  # type: ignore[attr-defined]
    table = Table(title=f"dashboard pages with {n:,} tasks ({rounds} requests each, keep-alive)")
    for column in ("page", "first ms", "median ms", "p95 ms", "median / 200 ms", "median / PING"):
        table.add_column(column, justify="left" if column == "page" else "right")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        def get(path: str, uncached: bool) -> None:
            if uncached:
                dash._overview = None  # pay for the store reads every time
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text[:200])

        for label, path, uncached in pages:
            first, median, p95 = timed(lambda p=path, u=uncached: get(p, u), rounds)
            ms = [f"{x * 1000:.1f}" for x in (first, median, p95)]
            table.add_row(label, *ms, f"{median / BUDGET:.3f}", f"{median / ping:.0f}")
    console.print(table)
    console.print(f"bare Redis PING round trip: {ping * 1e6:.0f} µs (same run)")
    web.should_exit = True
    thread.join(10)


if __name__ == "__main__":
    main()
