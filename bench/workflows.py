"""What dependencies cost, measured in one run at the store, on Redis (AOF off) and SQLite.

    .venv/bin/python -m bench.workflows                 # a fan-out of 10,000, a fan-in of 1,000
    .venv/bin/python -m bench.workflows --quick         # 2,000 and 200
    .venv/bin/python -m bench.workflows --stores redis --width 20000

1. **Creating a fan-out**: ``width`` children ``WAITING`` on one running parent, written by
   ``commit_tasks`` 100 at a time, against the same number of plain ``PENDING`` tasks written
   the same way (tasks/s, and the ratio).
2. **Ending its parent**: the one ``save`` that ends it (it applies the end to at most 100
   children in its own write) against the median plain ``save`` (ms, and the ratio); then
   ``release_dependents(limit=100)`` until the backlog is 0: the calls, the most children one
   call judged, children released per second. Every child's history is read back: each must
   have left ``WAITING`` exactly once, to ``PENDING``.
3. **A fan-in**: one join ``WAITING`` on ``fan_in`` parents, then each parent ended by a
   ``save`` (ms per end, against a plain save), the join released by the last end only.

No assertions but the correctness checks (a failed check raises): it reports, the docs record
(docs/performance.md, *Workflows*).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.drains import code_under_test, load_average
from bench.limits import stores
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.dependency_store import RELEASE_STEP

W, P, R, S = TaskStatus.WAITING, TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED
BATCH = 100


def task(task_id: str, status: TaskStatus, **fields: Any) -> TaskSnapshot:
    now = datetime.now(timezone.utc)
    return TaskSnapshot(task_id, "job", status, 1, now, updated_at=now, **fields)


def ended(store: Any, task_id: str, status: TaskStatus = S) -> float:
    """Save ``task_id`` into ``status``; the seconds the save took."""
    current = store.get(task_id)
    moved = current.evolve(status=status, status_version=current.status_version + 1)
    began = time.perf_counter()
    store.save(moved, expect_version=current.status_version)
    return time.perf_counter() - began


def created(store: Any, tasks: list[TaskSnapshot]) -> float:
    """Write ``tasks`` by commit_tasks, BATCH at a time; tasks per second."""
    began = time.perf_counter()
    for start in range(0, len(tasks), BATCH):
        results = store.commit_tasks([(t, None, []) for t in tasks[start : start + BATCH]])
        assert all(r is None for r in results), results
    return len(tasks) / (time.perf_counter() - began)


def plain_save_ms(store: Any, n: int = 100) -> float:
    store.commit_tasks([(task(f"s{i}", P), None, []) for i in range(n)])
    return 1000 * statistics.median(ended(store, f"s{i}", R) for i in range(n))


def fan_out(open_run: Callable[[str], Any], name: str, width: int) -> list[list[str]]:
    store = open_run(f"fo-{uuid.uuid4().hex[:8]}")
    try:
        plain_rate = created(store, [task(f"p{i:05d}", P) for i in range(width)])
        store.create(task("root", R))
        kids = [task(f"k{i:05d}", W, parents=("root",)) for i in range(width)]
        waiting_rate = created(store, kids)
        plain_ms = plain_save_ms(store)
        end_ms = 1000 * ended(store, "root")
        first = store.counts()[P] - width  # released by the end (the plain tasks: PENDING too)
        calls, most, began = 0, 0, time.perf_counter()
        while store.release_backlog():
            judged = store.release_dependents(limit=RELEASE_STEP)
            calls, most = calls + 1, max(most, judged)
        drained = time.perf_counter() - began
        exits = [[e for e in store.history(k.task_id) if e.from_status is W] for k in kids]
        assert all(len(e) == 1 and e[0].to_status is P for e in exits), "a child moved twice"
        assert store.counts()[W] == 0 and store.release_dependents(limit=1) == 0
        return [
            [name, "create", f"{plain_rate:,.0f}/s", f"{waiting_rate:,.0f}/s",
             f"{waiting_rate / plain_rate:.2f}"],
            [name, "end the parent", f"{plain_ms:.2f} ms", f"{end_ms:.2f} ms ({first} released)",
             f"{end_ms / plain_ms:.1f}"],
            [name, "continue", "", f"{calls} calls, <= {most} each, "
             f"{(width - first) / drained:,.0f} children/s", ""],
        ]  # fmt: skip
    finally:
        store.close()


def fan_in(open_run: Callable[[str], Any], name: str, width: int) -> list[str]:
    store = open_run(f"fi-{uuid.uuid4().hex[:8]}")
    try:
        plain_ms = plain_save_ms(store)
        parents = [f"q{i:05d}" for i in range(width)]
        created(store, [task(p, R) for p in parents])
        store.create(task("join", W, parents=tuple(parents)))
        ends = []
        for parent in parents:
            assert store.get("join").status is W, parent
            ends.append(ended(store, parent))
        assert store.get("join").status is P
        end_ms = 1000 * statistics.median(ends)
        return [name, f"{width:,} parents", f"{plain_ms:.2f} ms", f"{end_ms:.2f} ms",
                f"{end_ms / plain_ms:.2f}"]  # fmt: skip
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workflows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--width", type=int, default=10_000)
    parser.add_argument("--fan-in", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true", help="2,000 and 200")
    parser.add_argument("--stores", default="redis,sqlite")
    options = parser.parse_args(argv)
    width, join = (2_000, 200) if options.quick else (options.width, options.fan_in)
    names = [s.strip() for s in options.stores.split(",") if s.strip()]
    console = Console()
    console.print(f"load average at start: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp, stores(names, Path(tmp)) as opened:
        out = Table(title=f"a fan-out of {width:,} children: plain tasks / waiting children")
        for column in ("store", "step", "plain", "with dependencies", "ratio"):
            out.add_column(column, justify="right")
        for store, open_run in opened.items():
            for row in fan_out(open_run, store, width):
                out.add_row(*row)
        console.print(out)
        inn = Table(title="a fan-in: a plain save / the save that ends one of the join's parents")
        for column in ("store", "join", "plain save", "a parent's end", "ratio"):
            inn.add_column(column, justify="right")
        for store, open_run in opened.items():
            inn.add_row(*fan_in(open_run, store, join))
        console.print(inn)
    console.print(f"load average at end: {load_average()}; code under test: {code_under_test()}")


if __name__ == "__main__":
    main()
