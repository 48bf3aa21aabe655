"""What limits cost a drain, measured in one run, on Redis (AOF off) and SQLite.

    .venv/bin/python -m bench.limits                  # 4,000 tasks per drain, 3 rounds
    .venv/bin/python -m bench.limits --quick          # 1,000 tasks, 2 rounds
    .venv/bin/python -m bench.limits --stores redis --tasks 2000 --rounds 5

Each drain: N no-op tasks submitted (``submit_many``) before a worker (a ``Controller`` in
this process with the CLI's defaults: 4 slots, 64 buckets) starts; timed from its start until
``counts()[SUCCEEDED]`` is N; every task's history checked (one start, ``SUCCEEDED``).

1. **A limit that never binds**: the same drain of a plain type and of a type with
   ``Concurrency(10_000, per="k")`` (100 keys), rounds alternating plain / limited so both
   see the machine at the same moments; the ratio of the medians (target >= 0.9).
2. **One hot key beside the others**: 1,000 tasks of 1,000 other keys (``Concurrency(1,
   per="k")``: each key once, so it never binds for them), alone and then interleaved with
   1,000 tasks of one hot key (``max=1``: they run one at a time); the time until the *other*
   keys' tasks have all finished, with and without the hot key (target: within noise). The
   hot key rightly holds one of the worker's 4 slots all along, which leaves the others 3:
   4/3 = 1.33 is the ratio of a limit that costs nothing more.

No assertions: it reports, the docs record (docs/performance.md, *Limits*).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.drains import code_under_test, load_average
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.limits import Concurrency
from chongming_redis.model import TaskStatus
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.urls import open_store_url

KEYS = 100
HOT = 1_000
app = App("bench-limits")


@app.task("plain")
def plain(ctx: TaskContext, params: Any) -> None:
    return None


@app.task("limited", limits=[Concurrency(10_000, per="k")])
def limited(ctx: TaskContext, params: Any) -> None:
    return None


@app.task("keyed", limits=[Concurrency(1, per="k")])
def keyed(ctx: TaskContext, params: Any) -> None:
    return None


@contextmanager
def stores(names: Sequence[str], tmp: Path) -> Iterator[dict[str, Callable[[str], Any]]]:
    """Per store name, a function opening a fresh namespace (Redis) or file (SQLite)."""
    opened: dict[str, Callable[[str], Any]] = {}
    server = None
    if "redis" in names:
        server = EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
        url = server.url
        opened["redis"] = lambda run: open_store_url(url, namespace=run)
    if "sqlite" in names:
        opened["sqlite"] = lambda run: open_store_url(f"sqlite://{tmp / run}.db")
    try:
        yield opened
    finally:
        if server is not None:
            server.stop()


def drain(open_run: Callable[[str], Any], run: str, name: str, params: list[Any]) -> float:
    """Submit ``params`` as tasks of ``name``, start a worker, wait for every task; returns
    the drain's seconds (from the worker's start)."""
    store = open_run(run)
    Controller(store, app=app).submit_many(name, params)
    worker = Controller(store, app=app)
    began = time.perf_counter()
    worker.start()
    try:
        while store.counts().get(TaskStatus.SUCCEEDED, 0) < len(params):
            time.sleep(0.005)
        whole = time.perf_counter() - began
    finally:
        worker.shutdown(grace=5)
    _check(store, len(params))
    store.close()
    return whole


def _check(store: Any, total: int) -> None:
    counts = store.counts()
    if counts.get(TaskStatus.SUCCEEDED, 0) != total or sum(counts.values()) != total:
        raise SystemExit(f"drain check failed: {counts}")


def non_binding(open_run: Callable[[str], Any], store: str, n: int, rounds: int) -> list[Any]:
    times: dict[str, list[float]] = {"plain": [], "limited": []}
    for r in range(rounds):
        for name in ("plain", "limited"):
            params = [{"k": i % KEYS} for i in range(n)]
            whole = drain(open_run, f"nb-{store}-{name}-{r}", name, params)
            times[name].append(n / whole)
    plain_rate, limited_rate = (statistics.median(times[k]) for k in ("plain", "limited"))
    pairs = " / ".join(f"{a:,.0f}:{b:,.0f}" for a, b in zip(times["plain"], times["limited"]))
    ratio = limited_rate / plain_rate
    return [store, f"{plain_rate:,.0f}", f"{limited_rate:,.0f}", f"{ratio:.2f}", pairs]


def hot_key(open_run: Callable[[str], Any], store: str, rounds: int) -> list[Any]:
    alone, beside = [], []
    for r in range(rounds):
        alone.append(others_done(open_run, f"hk-{store}-alone-{r}", hot=False))
        beside.append(others_done(open_run, f"hk-{store}-mixed-{r}", hot=True))
    a, b = statistics.median(alone), statistics.median(beside)
    return [store, f"{a:.2f} s", f"{b:.2f} s", f"{b / a:.2f}",
            " / ".join(f"{x:.2f}:{y:.2f}" for x, y in zip(alone, beside))]  # fmt: skip


def others_done(open_run: Callable[[str], Any], run: str, *, hot: bool) -> float:
    """``HOT`` tasks of ``HOT`` other keys (with ``hot``: each after one of the hot key's, so
    the hot key's backlog is older than every other task); the seconds from the worker's start
    until the others are all done (the hot key's may still run: they are stopped then)."""
    store = open_run(run)
    submitter = Controller(store, app=app)
    ids: list[str] = []
    for i in range(HOT):
        if hot:
            submitter.submit("keyed", {"k": "hot"})
        ids.append(submitter.submit("keyed", {"k": f"c{i}"}))
    worker = Controller(store, app=app)
    began = time.perf_counter()
    worker.start()
    try:
        while not _all_succeeded(store, ids):
            time.sleep(0.005)
        seconds = time.perf_counter() - began
    finally:
        worker.shutdown(grace=0, hand_back="stop")
    store.close()
    return seconds


def _all_succeeded(store: Any, ids: list[str]) -> bool:
    last = store.get(ids[-1])
    if last is None or last.status is not TaskStatus.SUCCEEDED:
        return False  # the cheap check first: the last one submitted
    return all((s := store.get(i)) is not None and s.status is TaskStatus.SUCCEEDED for i in ids)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.limits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 2 rounds")
    parser.add_argument("--stores", default="redis,sqlite")
    options = parser.parse_args(argv)
    n, rounds = (1_000, 2) if options.quick else (options.tasks, options.rounds)
    names = [s.strip() for s in options.stores.split(",") if s.strip()]
    console = Console()
    console.print(f"load average at start: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp, stores(names, Path(tmp)) as opened:
        nb = Table(title=f"a limit that never binds: {n:,} no-op tasks, {KEYS} keys, "
                         "Concurrency(10,000, per='k'), tasks/s (medians)")  # fmt: skip
        for column in ("store", "plain", "limited", "limited / plain", "rounds"):
            nb.add_column(column, justify="right")
        for store, open_run in opened.items():
            nb.add_row(*non_binding(open_run, store, n, rounds))
        console.print(nb)
        hk = Table(title=f"{HOT:,} tasks of other keys, alone and beside {HOT:,} of one hot key "
                         "(max=1): until the others are done (medians)")  # fmt: skip
        for column in ("store", "alone", "beside the hot key", "ratio", "rounds"):
            hk.add_column(column, justify="right")
        for store, open_run in opened.items():
            hk.add_row(*hot_key(open_run, store, rounds))
        console.print(hk)
    console.print(f"load average at end: {load_average()}; code under test: {code_under_test()}")


if __name__ == "__main__":
    main()
