"""What ``bench.scale_out`` measures and how it prints it: a server's counters over a phase, a
master's part of a round, a round, the tables, and the figures ``bench.scale_out_sim`` reads."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, field
from typing import Any

import redis
from rich.table import Table

from bench.scale_out_feed import FeedCost
from bench.scale_out_reads import ReadCost


@dataclass(frozen=True)
class Sample:
    """A server's counters (or their difference over a phase)."""

    cpu: float = 0.0  # used_cpu_user + used_cpu_sys, seconds
    sys: float = 0.0  # used_cpu_sys
    commands: int = 0  # every command executed, the scripts' nested ones included
    scripts: int = 0  # EVALSHA calls

    def __sub__(self, other: Sample) -> Sample:
        return Sample(*(a - b for a, b in zip(astuple(self), astuple(other))))

    def __add__(self, other: Sample) -> Sample:
        return Sample(*(a + b for a, b in zip(astuple(self), astuple(other))))


def sample(client: redis.Redis) -> Sample:
    info = client.info("cpu")
    stats = client.info("commandstats")
    scripts = [v for k, v in stats.items() if k.startswith("cmdstat_evalsha")]
    return Sample(
        cpu=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        sys=float(info["used_cpu_sys"]),
        commands=sum(int(v["calls"]) for v in stats.values()),
        scripts=sum(int(v["calls"]) for v in scripts),
    )


@dataclass
class Master:
    """One master's part of one round."""

    index: int
    buckets: int
    tasks: int = 0
    submit: Sample = field(default_factory=Sample)  # the submit phase's server work
    drain: Sample = field(default_factory=Sample)

    @property
    def submit_cpu(self) -> float:
        return self.submit.cpu

    @property
    def drain_cpu(self) -> float:
        return self.drain.cpu

    @property
    def both(self) -> Sample:
        return self.submit + self.drain

    def us(self, seconds: float) -> float:
        return seconds / max(1, self.tasks) * 1e6


@dataclass
class Round:
    masters: int
    tasks: int
    submit_seconds: float = 0.0
    drain_seconds: float = 0.0
    client_cpu_submit: float = 0.0  # seconds of the submitters' own CPU
    client_cpu_drain: float = 0.0
    drain_calls: int = 0
    one_at_a_time: bool = False  # masters loaded one after the other (rates are serial)
    per_master: list[Master] = field(default_factory=list)
    exactly_once: bool = False
    bad: list[str] = field(default_factory=list)
    reads: ReadCost | None = None
    feed: FeedCost | None = None  # with a relay to the global feed (``--no-feed``: none)

    @property
    def drain_rate(self) -> float:
        return self.tasks / self.drain_seconds

    @property
    def submit_rate(self) -> float:
        return self.tasks / self.submit_seconds

    def redis_us(self, phase: str) -> float:
        """Redis CPU per task over all masters, for ``submit``, ``drain`` or ``total``."""
        cpu = sum(m.submit_cpu if phase == "submit" else m.drain_cpu for m in self.per_master)
        if phase == "total":
            cpu = sum(m.submit_cpu + m.drain_cpu for m in self.per_master)
        return cpu / self.tasks * 1e6

    def balance(self) -> float:
        """Busiest master's CPU over the idlest's (1.00 = even)."""
        cpus = [m.submit_cpu + m.drain_cpu for m in self.per_master]
        return max(cpus) / max(1e-9, min(cpus))


def label(r: Round) -> str:
    return f"{r.masters} (one at a time)" if r.one_at_a_time else str(r.masters)


def master_table(rounds: Sequence[Round]) -> Table:
    table = Table(title="per master: the tasks it held and its Redis CPU per task (AOF off)")
    for column in ("masters", "master", "buckets", "tasks", "share", "create µs/task",
                   "start+commit µs/task", "total µs/task", "of it sys", "CPU share",
                   "scripts/task", "commands/task"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rounds:
        total_cpu = sum(m.submit_cpu + m.drain_cpu for m in r.per_master)
        for m in r.per_master:
            table.add_row(
                label(r), f"{m.index + 1}/{r.masters}", str(m.buckets), f"{m.tasks:,}",
                f"{m.tasks / r.tasks:.1%}", f"{m.us(m.submit_cpu):.1f}",
                f"{m.us(m.drain_cpu):.1f}", f"{m.us(m.submit_cpu + m.drain_cpu):.1f}",
                f"{m.both.sys / max(1e-9, m.both.cpu):.0%}",
                f"{(m.submit_cpu + m.drain_cpu) / total_cpu:.1%}",
                f"{m.both.scripts / max(1, m.tasks):.2f}",
                f"{m.both.commands / max(1, m.tasks):.1f}",
            )  # fmt: skip
    return table


def round_table(rounds: Sequence[Round]) -> Table:
    table = Table(title="per round: aggregate rates on this machine (all processes share "
                        f"{os.cpu_count()} cores)")  # fmt: skip
    for column in ("masters", "tasks", "submit tasks/s", "drain tasks/s",
                   "Redis µs/task (all masters)", "÷ 1 master", "CPU balance max/min",
                   "drainer Python µs/task", "tasks per start call", "exactly-once"):  # fmt: skip
        table.add_column(column, justify="right")
    base = rounds[0].redis_us("total")
    for r in rounds:
        table.add_row(
            label(r), f"{r.tasks:,}", f"{r.submit_rate:,.0f}", f"{r.drain_rate:,.0f}",
            f"{r.redis_us('total'):.1f}", f"{r.redis_us('total') / base:.2f}",
            f"{r.balance():.2f}", f"{r.client_cpu_drain / r.tasks * 1e6:.1f}",
            f"{2 * r.tasks / max(1, r.drain_calls):.1f}",
            "yes" if r.exactly_once else f"NO: {'; '.join(r.bad[:3])}",
        )  # fmt: skip
    return table


def reads_table(rounds: Sequence[Round]) -> Table:
    table = Table(title="cross-shard reads, fanned out and merged (sequential round trips)")
    for column in ("masters", "counts ms", "counts Redis µs", "query page ms",
                   "query page Redis µs", "tasks fetched per page of 50",
                   "full walk: pages / tasks", "each task once, in order"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rounds:
        c = r.reads
        if c is None:
            continue
        table.add_row(
            str(r.masters), f"{c.counts_ms:.3f}", f"{c.counts_us:.1f}", f"{c.page_ms:.2f}",
            f"{c.page_us:.0f}", f"{c.page_fetched:.0f}", f"{c.walk_pages} / {c.walk_tasks:,}",
            "yes" if c.walk_ok else "NO",
        )  # fmt: skip
    return table


def feed_table(fed: Round, plain: Round) -> Table:
    """The relay round beside the round of as many masters without it."""
    table = Table(title=f"the change feed relayed to one global feed ({fed.masters} masters "
                        "+ a directory master holding the global feed)")  # fmt: skip
    table.add_column("measure")
    table.add_column("value", justify="right")
    cost = fed.feed
    assert cost is not None
    check = cost.check
    rows = [
        ("global items per task (the relay coalesces a task's writes)",
         f"{cost.items / cost.tasks:.2f}"),
        ("directory master CPU per task", f"{cost.per_task(cost.directory_cpu) * 1e6:.1f} µs"),
        ("global items per relay_append call", f"{cost.items / max(1, cost.calls):.1f}"),
        ("directory master CPU per global item",
         f"{cost.directory_cpu / max(1, cost.items) * 1e6:.1f} µs"),
        ("relay process CPU per task", f"{cost.per_task(cost.relay_cpu) * 1e6:.1f} µs"),
        ("shard masters' CPU per task, with the relay / without (same masters)",
         f"{fed.redis_us('total'):.1f} / {plain.redis_us('total'):.1f} µs"),
        ("  the relay's reads on the shards per task, at costs measured alone",
         f"{cost.shard_read_us():.1f} µs ({cost.read_item_us:.1f} per item, "
         f"{cost.read_empty_us:.0f} per empty read, {cost.passes:,} passes)"),
        ("drain tasks/s with the relay / without", f"{fed.drain_rate:,.0f} / "
         f"{plain.drain_rate:,.0f}"),
        ("directory master memory per task (global feed, its task map, relay cursors)",
         f"{cost.directory_bytes / cost.tasks:.0f} bytes"),
        ("global feed behind the shards when the writes stopped", f"{cost.lag * 1e3:.0f} ms"),
        ("global feed read from 0: live items / distinct / SUCCEEDED / tasks",
         f"{check.live:,} / {check.distinct:,} / {check.succeeded:,} / {cost.tasks:,}"),
        ("global page of 256 (directory + shard reads)", f"{check.ms_per_page:.2f} ms"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table


def by_masters(rounds: Sequence[Round]) -> dict[int, list[Round]]:
    grouped: dict[int, list[Round]] = {}
    for r in rounds:
        grouped.setdefault(r.masters, []).append(r)
    return grouped


def median_redis_us(rounds: Sequence[Round]) -> dict[int, float]:
    """Per master count, the median over its rounds of the Redis CPU per task."""
    return {s: statistics.median(r.redis_us("total") for r in rs)
            for s, rs in by_masters(rounds).items()}  # fmt: skip


def median_of(rounds: Sequence[Round], value: Callable[[Round], float | None]) -> dict[str, float]:
    """Per master count, the median of ``value`` over its rounds (``None``: not measured)."""
    found = {
        s: [v for r in rs if (v := value(r)) is not None] for s, rs in by_masters(rounds).items()
    }
    return {str(s): statistics.median(vs) for s, vs in found.items() if vs}


def summary_table(rounds: Sequence[Round]) -> Table:
    """Over the repeated rounds: each master's Redis CPU per task (every master of every
    round), and the commands per task, per master count."""
    table = Table(title="over the repeats: Redis CPU per task per master, and the work per task")
    for column in ("masters", "rounds", "µs/task per master: median", "min", "max",
                   "÷ 1 master (medians)", "commands/task (median)",
                   "drain tasks/s (median)"):  # fmt: skip
        table.add_column(column, justify="right")
    grouped = by_masters(rounds)
    base = statistics.median(m.us(m.both.cpu) for r in grouped[min(grouped)] for m in r.per_master)
    for rs in grouped.values():
        per = [m.us(m.both.cpu) for r in rs for m in r.per_master]
        commands = [m.both.commands / max(1, m.tasks) for r in rs for m in r.per_master]
        table.add_row(
            label(rs[0]), str(len(rs)), f"{statistics.median(per):.1f}", f"{min(per):.1f}",
            f"{max(per):.1f}", f"{statistics.median(per) / base:.2f}",
            f"{statistics.median(commands):.1f}",
            f"{statistics.median(r.drain_rate for r in rs):,.0f}",
        )  # fmt: skip
    return table


def calibration(rounds: Sequence[Round], rtt_us: float, fed: Round | None) -> dict[str, Any]:
    """What ``bench.scale_out_sim --calibration`` reads."""
    feed_us = None
    if fed is not None and fed.feed is not None:
        feed_us = fed.feed.per_task(fed.feed.directory_cpu) * 1e6
    return {
        "redis_us_per_task": {str(s): us for s, us in median_redis_us(rounds).items()},
        "drainer_python_us_per_task": {
            str(r.masters): r.client_cpu_drain / r.tasks * 1e6 for r in rounds
        },
        "fanout_page_redis_us": median_of(rounds, lambda r: r.reads.page_us if r.reads else None),
        "fanout_counts_redis_us": median_of(
            rounds, lambda r: r.reads.counts_us if r.reads else None
        ),
        "round_trip_us": rtt_us,
        "feed_directory_us_per_task": feed_us,
        "rounds": [asdict(r) for r in rounds],
    }
