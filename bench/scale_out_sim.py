"""How a sharded pool's throughput grows with masters and workers: a model, calibrated by the
figures ``bench.scale_out`` measures on this machine.

    .venv/bin/python -m bench.scale_out_sim                       # the defaults below
    .venv/bin/python -m bench.scale_out --json calib.json
    .venv/bin/python -m bench.scale_out_sim --calibration calib.json   # this run's figures

The model (``docs/scale-out.md``, *A model beyond this machine*), for S masters (shards),
W worker processes and B buckets, no-op tasks arriving evenly over the buckets:

* a shard master gives ``u`` of a core to tasks, less what the fanned-out reads take from it
  (every merged ``query`` page and ``counts`` costs every master a part); each task costs it
  ``redis_us`` (create + start + commit, measured per master), so it carries
  ``C = (u * 1e6 - reads) / redis_us`` tasks/s;
* a worker process carries ``w = 1e6 / (worker_us + round_trips * rtt_us)`` tasks/s (one core:
  the GIL), or ``concurrency / task_seconds`` for tasks that take time;
* workers serve one shard each when there are at least as many as shards (dealt in proportion
  to the shards' buckets), else each spans several shards; shard k then carries
  ``min(W_k * w, C)``, and since tasks arrive by bucket the pool carries
  ``min_k(capacity_k / share_k)`` where ``share_k`` is shard k's part of the buckets;
* with the relayed global change feed, its one master caps the pool at
  ``u * 1e6 / feed_us`` (the relay itself runs per shard, so it is not one process's limit).

What it ignores: skew (hot keys or buckets; a shard's share is its bucket count), batching
falling at low load (fewer tasks per script call cost more Redis CPU each), the network (a
datacenter round trip is 5-10× this loopback one; it moves ``w`` only through the round trips
per task), fsync (``appendfsync always``), replicas, prune, control commands, pool ticks and
the directory's other work, resharding, memory (the global feed's master holds ~80 bytes per
live task), the relay's lag and the readers of the global feed (each page fans out to the
shards), and real task work (``--task-ms``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Calibration:
    """Per-task costs. Defaults: ``bench.scale_out --repeat 3`` at 12,000 tasks, medians
    (``docs/scale-out.md``), and ``docs/performance.md`` for the worker (a real worker, not the
    prototype's drainer)."""

    redis_us: float = 159.0  # Redis CPU per task on a shard master (create + start + commit)
    worker_us: float = 120.0  # a worker process's Python CPU per task (bench.throughput)
    round_trips: float = 0.05  # worker round trips per task (bench.throughput)
    rtt_us: float = 50.0  # bare loopback round trip
    utilisation: float = 0.8  # of a core, for a master and for a worker process
    feed_us: float = 13.7  # the global feed master's CPU per task (relay round)
    page_us: tuple[float, float] = (2490.0, 1088.0)  # a merged query page: a + b*S µs in all
    counts_us: tuple[float, float] = (0.4, 12.2)  # a merged counts: a + b*S µs in all
    pages_per_s: float = 10.0  # merged query pages per second (dashboards, CLI)
    counts_per_s: float = 10.0
    num_buckets: int = 64
    concurrency: int = 4  # slots per worker (for --task-ms)
    task_ms: float = 0.0  # 0: no-op tasks


def linear_fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``a + b*S`` through (S, cost) points (one point: ``b = cost / S``)."""
    if len(points) == 1:
        ((s, cost),) = points.items()
        return 0.0, cost / s
    n = len(points)
    mean_s = sum(points) / n
    mean_c = sum(points.values()) / n
    b = sum((s - mean_s) * (c - mean_c) for s, c in points.items()) / sum(
        (s - mean_s) ** 2 for s in points
    )
    if mean_c - b * mean_s < 0:  # a cost is never negative: the fit through the origin
        return 0.0, sum(c * s for s, c in points.items()) / sum(s * s for s in points)
    return mean_c - b * mean_s, b


def load_calibration(path: Path, base: Calibration) -> Calibration:
    """The figures a ``bench.scale_out --json`` run wrote (the 1-master Redis CPU per task:
    per-master costs on a box where every master shares two cores only inflate)."""
    data = json.loads(path.read_text())
    redis_us = {int(k): v for k, v in data["redis_us_per_task"].items()}
    changes: dict[str, object] = {"redis_us": redis_us[min(redis_us)],
                                  "rtt_us": data["round_trip_us"]}  # fmt: skip
    if data.get("feed_directory_us_per_task"):
        changes["feed_us"] = data["feed_directory_us_per_task"]
    for key, name in (("fanout_page_redis_us", "page_us"), ("fanout_counts_redis_us", "counts_us")):
        points = {int(k): v for k, v in data.get(key, {}).items()}
        if points:
            changes[name] = linear_fit(points)
    return replace(base, **changes)  # type: ignore[arg-type]


def shard_shares(num_buckets: int, masters: int) -> list[float]:
    """Each shard's part of the buckets (bucket b in shard b mod S)."""
    return [len(range(k, num_buckets, masters)) / num_buckets for k in range(masters)]


def workers_per_shard(workers: int, shares: Sequence[float]) -> list[float]:
    """Whole workers dealt in proportion to the shares (largest remainders) when there are
    enough; fewer workers than shards each span several shards (fractions)."""
    if workers < len(shares):
        return [workers * s for s in shares]
    exact = [workers * s for s in shares]
    dealt = [math.floor(x) for x in exact]
    order = sorted(range(len(shares)), key=lambda k: exact[k] - dealt[k], reverse=True)
    for k in order[: workers - sum(dealt)]:
        dealt[k] += 1
    return [float(x) for x in dealt]


def worker_rate(c: Calibration) -> float:
    cpu_bound = c.utilisation * 1e6 / (c.worker_us + c.round_trips * c.rtt_us)
    if c.task_ms <= 0:
        return cpu_bound
    return min(cpu_bound, c.concurrency * 1000.0 / c.task_ms)


def master_capacity(c: Calibration, masters: int) -> float:
    """Tasks/s one shard master carries after its part of the fanned-out reads."""
    page = (c.page_us[0] + c.page_us[1] * masters) / masters
    counts = (c.counts_us[0] + c.counts_us[1] * masters) / masters
    free = c.utilisation * 1e6 - c.pages_per_s * page - c.counts_per_s * counts
    return max(0.0, free) / c.redis_us


def throughput(c: Calibration, masters: int, workers: int, feed: bool) -> tuple[float, str]:
    """Tasks/s the pool carries, and what binds it: ``W`` workers, ``R`` Redis shard masters,
    ``F`` the global feed's master."""
    shares = shard_shares(c.num_buckets, masters)
    w, cap = worker_rate(c), master_capacity(c, masters)
    dealt = workers_per_shard(workers, shares)
    rate, bound = min(
        (min(n * w, cap) / share, "R" if cap <= n * w else "W") for n, share in zip(dealt, shares)
    )
    if feed and c.utilisation * 1e6 / c.feed_us < rate:
        return c.utilisation * 1e6 / c.feed_us, "F"
    return rate, bound


WORKERS = (1, 2, 4, 8, 16, 32, 64)


def table(c: Calibration, feed: bool, masters: Sequence[int]) -> Table:
    title = ("with the relayed global change feed" if feed
             else "per-shard feeds only (composite cursor: no global feed master)")  # fmt: skip
    result = Table(title=f"pool throughput, k tasks/s, {title}; W/R/F: what binds")
    result.add_column("masters", justify="right")
    for w in WORKERS:
        result.add_column(f"{w} workers", justify="right")
    for s in masters:
        cells = []
        for w in WORKERS:
            rate, bound = throughput(c, s, w, feed)
            cells.append(f"{rate / 1000:,.1f} {bound}")
        result.add_row(str(s), *cells)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", type=Path, help="a bench.scale_out --json file")
    parser.add_argument("--masters", type=int, default=8, help="rows 1..N")
    parser.add_argument("--task-ms", type=float, default=0.0, help="task run time (0: no-op)")
    parser.add_argument("--rtt-us", type=float, help="round trip (e.g. 300 for a datacenter)")
    parser.add_argument("--pages-per-s", type=float, help="merged query pages per second")
    options = parser.parse_args(argv)
    c = Calibration(task_ms=options.task_ms)
    if options.calibration:
        c = load_calibration(options.calibration, c)
    if options.rtt_us is not None:
        c = replace(c, rtt_us=options.rtt_us)
    if options.pages_per_s is not None:
        c = replace(c, pages_per_s=options.pages_per_s)
    console = Console(width=max(120, Console().width))
    console.print(
        f"calibration: Redis {c.redis_us:.0f} µs/task per shard master, worker "
        f"{c.worker_us:.0f} µs/task + {c.round_trips} round trips × {c.rtt_us:.0f} µs, "
        f"utilisation {c.utilisation:.0%}, global feed {c.feed_us:.0f} µs/task, merged page "
        f"{c.page_us[0]:.0f} + {c.page_us[1]:.0f}·S µs × {c.pages_per_s:g}/s, counts "
        f"{c.counts_us[0]:.0f} + {c.counts_us[1]:.0f}·S µs × {c.counts_per_s:g}/s, "
        f"{c.num_buckets} buckets" + (f", tasks of {c.task_ms:g} ms" if c.task_ms else "")
    )
    masters = range(1, options.masters + 1)
    console.print(
        f"one worker: {worker_rate(c):,.0f} tasks/s; one master: "
        + ", ".join(f"{master_capacity(c, s):,.0f} (S={s})" for s in (1, 2, 4, 8))
        + f" tasks/s; the global feed's master: {c.utilisation * 1e6 / c.feed_us:,.0f} tasks/s"
    )
    console.print(table(c, True, masters))
    console.print(table(c, False, masters))


if __name__ == "__main__":
    main()
