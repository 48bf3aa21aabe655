"""What ``bench.store_ops`` measures on every store: the protocol calls, a typical task, the
call/bare interleaving, the bucket-query latency and the tables that print them.

Store-neutral: each store's part (``bench.store_ops`` for Redis, ``bench.store_ops_sql`` for
SQLite and PostgreSQL) brings its store and its own bare round trip, and measures the same
calls the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel
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
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NUM_BUCKETS = 64

submit_app = App("bench-ops")


class Resize(BaseModel):
    w: int
    h: int


@submit_app.task(name="resize")
def resize(ctx: TaskContext, params: Resize) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class OpsRow:
    """One call measured against its bare round trip, alternating (``interleaved``)."""

    call: str
    ops: float  # calls per second
    bare: float  # bare round trips per second

    @property
    def ratio(self) -> float:
        return self.ops / self.bare


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


def cas_values() -> Iterator[tuple[int, int]]:
    """``(expected, new)`` for a bare compare-and-set that succeeds every time: 0 -> 1,
    1 -> 2, ... (one that found a stale value would write nothing, and cost less)."""
    return ((v, v + 1) for v in itertools.count())


def protocol_calls(store: Any, n: int) -> list[tuple[str, Callable[[int], object]]]:
    """The calls measured, each for ``i`` in ``range(n)`` in this order (a call may need the
    one before it: ``save`` the task ``create`` made). Also stores ``n`` PENDING tasks for the
    limit-1 query to find in every bucket."""
    snaps = [typical_task(10_000_000 + i) for i in range(n)]
    running = [dataclasses.replace(s, status=TaskStatus.RUNNING, status_version=2) for s in snaps]
    beat = [dataclasses.replace(s, status_version=3, heartbeat_at=T0 + timedelta(seconds=2))
            for s in running]  # fmt: skip
    commands = [Command(f"cmd-{i}", snaps[i].task_id, CommandKind.STOP, T0) for i in range(n)]
    now = T0 + timedelta(seconds=1)
    submitter = Controller(store, app=submit_app, owner="bench-submit")
    fill(store, 20_000_000, 20_000_000 + n, batched=False)
    return [
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
        ("Controller.submit (validate, create + history; Redis: + nudge)",
         lambda i: submitter.submit("resize", {"w": 320, "h": 240})),
    ]  # fmt: skip


def measure_ops(store: Any, bare: Callable[[int], object], n: int) -> list[OpsRow]:
    """Every protocol call, each alternating with ``bare`` (the store's own bare round trip)."""
    return [OpsRow(name, *interleaved(call, bare, n)) for name, call in protocol_calls(store, n)]


def fill(store: Any, start: int, stop: int, *, batched: bool) -> None:
    """Typical pending tasks ``start..stop-1``: one ``create`` each, or ``batched`` (the SQL
    stores: ``commit_tasks``, 100 tasks per commit, so 100k tasks do not wait for 100k
    fsyncs; what is stored is the same)."""
    if not batched:
        for i in range(start, stop):
            store.create(typical_task(i))
        return
    for first in range(start, stop, 100):
        items = [(typical_task(i), None, ()) for i in range(first, min(stop, first + 100))]
        refused = [e for e in store.commit_tasks(items) if e is not None]
        assert not refused, refused[:3]


def finish_every_other(store: Any, count: int, *, batched: bool) -> None:
    """Tasks ``0, 2, 4, ... < count`` (as ``fill`` made them) become SUCCEEDED (``batched``:
    as in ``fill``)."""
    finished = [
        dataclasses.replace(typical_task(i), status=TaskStatus.SUCCEEDED, status_version=2)
        for i in range(0, count, 2)
    ]
    if not batched:
        for snap in finished:
            store.save(snap, expect_version=1)
        return
    for first in range(0, len(finished), 100):
        refused = [e for e in store.commit_tasks(
            [(s, 1, ()) for s in finished[first : first + 100]]) if e is not None]  # fmt: skip
        assert not refused, refused[:3]


def query_latency(store: Any, rounds: int = 300) -> float:
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


def ops_table(title: str, rows: Sequence[OpsRow], bare: str) -> Table:
    table = Table(title=title)
    table.add_column("call")
    for column in ("µs/call", "ops/s", "ratio to bare", f"bare µs ({bare})"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row.call, micros(1 / row.ops), f"{row.ops:,.0f}", f"{row.ratio:.2f}",
                      micros(1 / row.bare))  # fmt: skip
    return table


def micros(seconds: float) -> str:
    """µs, with a decimal below 10 (the in-memory store's calls)."""
    us = seconds * 1e6
    return f"{us:.1f}" if us < 10 else f"{us:,.0f}"


def ratios_table(runs: dict[str, Sequence[OpsRow]]) -> Table:
    """Every store's ratio to its own bare round trip, side by side (and its µs per call)."""
    table = Table(title="ratio to each store's own bare round trip (µs per call)")
    table.add_column("call")
    for store in runs:
        table.add_column(store, justify="right")
    calls = [row.call for row in next(iter(runs.values()))]
    for i, call in enumerate(calls):
        table.add_row(call, *(f"{rows[i].ratio:.2f} ({micros(1 / rows[i].ops)})"
                              for rows in runs.values()))  # fmt: skip
    means = [statistics.mean(1 / r.bare for r in rows) for rows in runs.values()]
    table.add_row("bare round trip, mean µs", *(micros(mean) for mean in means))
    return table


def scale_and_prune(
    name: str, store: Any, small: int, large: int, *, batched: bool,
    size: Callable[[], int] | None = None, size_name: str = "", size_target: str = "",
    rounds: int = 300, analyze: Callable[[], object] | None = None,
) -> Table:  # fmt: skip
    """The bucket query at ``small`` and ``large`` tasks, the space per task (``size()``: the
    store's bytes, before and after), and the prune of every other task once finished; a
    summary table. ``rounds``: queries timed at each size. ``analyze``: the query is timed
    again at each size once it ran (PostgreSQL: ``ANALYZE``, which autovacuum runs within a
    minute or so of a bulk load; until then the planner's statistics are stale)."""
    before = size() if size else 0
    fill(store, 0, small, batched=batched)
    latencies = [query_latency(store, rounds)]
    if analyze:
        analyze()
        latencies.append(query_latency(store, rounds))
    fill(store, small, large, batched=batched)
    after = size() if size else 0
    latencies.append(query_latency(store, rounds))
    if analyze:
        analyze()
        latencies.append(query_latency(store, rounds))
    finish_every_other(store, large, batched=batched)
    started = time.perf_counter()
    pruned = store.prune(keep_terminal=0)
    prune_seconds = time.perf_counter() - started
    if analyze:
        summary = scaling_table(name, small, latencies[0], large, latencies[2], " as loaded")
        add_scaling(summary, small, latencies[1], large, latencies[3], " after ANALYZE")
    else:
        summary = scaling_table(name, small, latencies[0], large, latencies[1])
    if size:
        summary.add_row(size_name, f"{(after - before) / large:,.0f} bytes", size_target)
    summary.add_row(f"prune of {pruned:,} tasks", f"{prune_seconds:.2f} s", "")
    return summary


def scaling_table(
    store: str, small: int, small_s: float, large: int, large_s: float, when: str = ""
) -> Table:
    """The bucket query at two sizes, the start of a store's summary table."""
    summary = Table(title=f"{store}: queries, space, prune")
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    summary.add_column("target", justify="right")
    add_scaling(summary, small, small_s, large, large_s, when)
    return summary


def add_scaling(
    summary: Table, small: int, small_s: float, large: int, large_s: float, when: str
) -> None:
    summary.add_row(f"query p50 at {small:,} tasks{when}", f"{small_s * 1e6:,.0f} µs", "")
    summary.add_row(f"query p50 at {large:,} tasks{when}", f"{large_s * 1e6:,.0f} µs", "")
    summary.add_row(f"ratio large/small{when}", f"{large_s / small_s:.2f}", "<= 1.5")
