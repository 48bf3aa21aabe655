"""The tables of ``bench.store_throughput``: drains and submit -> start latency per store, with
each store's rate as a ratio to Redis measured in the same run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table

from bench.drains import percentile

if TYPE_CHECKING:
    from bench.store_throughput import Drain, Latency

#: The stores each drain rate is divided by (when they were measured).
BASELINES = ("redis", "redis-aof")


def drain_table(drains: Sequence[Drain]) -> Table:
    table = Table(title="drain of pre-submitted no-op tasks (tasks/s: from the release to the "
                        "last SUCCEEDED)")  # fmt: skip
    table.add_column("store")
    for column in ("worker processes", "tasks", "submit (tasks/s)", "drain", "tasks/s",
                   *(f"÷ {name}" for name in BASELINES), "worker CPU per task",
                   "server CPU per task", "exactly-once"):  # fmt: skip
        table.add_column(column, justify="right")
    rates = {(d.target.name, d.workers): d.rate for d in drains}
    for d in sorted(drains, key=lambda d: (list(rates).index((d.target.name, 1)), d.workers)):
        ratios = [rates.get((name, d.workers)) for name in BASELINES]
        table.add_row(
            d.target.label, str(d.workers), f"{d.tasks:,}", f"{d.tasks / d.submit_seconds:,.0f}",
            f"{d.drain_seconds:.2f} s", f"{d.rate:,.0f}",
            *(f"{d.rate / r:.2f}" if r else "" for r in ratios),
            f"{d.python_cpu / d.tasks * 1e6:,.0f} µs",
            f"{d.server_cpu / d.tasks * 1e6:,.0f} µs" if d.target.server_pid else "(in the worker)",
            d.check.verdict(),
        )  # fmt: skip
    return table


def latency_table(latencies: Sequence[Latency], rate: float, seconds: float) -> Table:
    table = Table(title=f"submit -> start latency, {rate:.0f} tasks/s submitted for "
                        f"{seconds:g} s to idle workers")  # fmt: skip
    table.add_column("store")
    for column in ("worker processes", "tasks", "start p50", "start p99", "start max",
                   "exactly-once"):  # fmt: skip
        table.add_column(column, justify="right")
    order = list(dict.fromkeys(lat.target.name for lat in latencies))
    for lat in sorted(latencies, key=lambda lat: (order.index(lat.target.name), lat.workers)):
        ms = [x * 1000 for x in lat.to_start] or [float("nan")]
        table.add_row(
            lat.target.label, str(lat.workers), f"{len(lat.to_start):,}",
            f"{statistics.median(ms):.1f} ms", f"{percentile(ms, 99):.1f} ms",
            f"{max(ms):.1f} ms", lat.check.verdict(),
        )  # fmt: skip
    return table
