"""One namespace sharded across 1, 2 and 3 Redis masters: Redis CPU per task per master.

    .venv/bin/python -m bench.scale_out                  # 12,000 tasks per round (~1 minute)
    .venv/bin/python -m bench.scale_out --quick          # 1,500 tasks, a smoke check
    .venv/bin/python -m bench.scale_out --json calib.json   # also write the figures for
                                                            # bench.scale_out_sim --calibration

The prototype of ``docs/scale-out.md``. It starts three redis-servers on loopback ports (AOF
off, so the figures are Redis work, not fsync) and, for S = 1, 2, 3 masters, splits a
namespace's 64 buckets into S shards (bucket ``b`` in shard ``b mod S``, each shard a real
``RedisTaskStore`` namespace on its own master) and runs, in a fresh namespace each round
(after an unreported warm-up):

1. **submit**: submitter processes create N no-op tasks, one ``commit_tasks`` per task (the
   path of ``Controller.submit``), each in the shard of its bucket;
2. **drain**: drainer processes (``--drainers`` per master, each serving a disjoint share of
   its shard's buckets) run ``start_tasks`` / ``commit_tasks`` to ``SUCCEEDED`` until their
   buckets are empty (``bench/scale_out_client.py``);
3. checks: every shard's counters add up to N ``SUCCEEDED``; every task's history has exactly
   one ``PENDING -> RUNNING`` and ends ``SUCCEEDED`` (``bench.throughput.check_histories``);
4. cross-shard reads (``bench/scale_out_reads.py``): ``counts`` and a ``query`` page fanned
   out to every shard and merged, their wall time and their Redis CPU over all masters, and a
   walk through every ``SUCCEEDED`` task with the merged keyset cursor (each task once, in
   order).

Per master it reports the tasks it held, their share, and its Redis CPU per task
(``INFO cpu`` ``used_cpu_sys + used_cpu_user`` deltas, per phase); per round the aggregate
rates and the CPU balance between masters (max / min). On this 2-core machine every master
and every client process share the same two cores, so the aggregate rate cannot grow with
masters: the scaling evidence is the Redis CPU per task per master, which should stay about
constant while each master's share of the tasks drops as 1/S. No assertions: it reports,
``docs/scale-out.md`` records.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench.scale_out_client import Shard, drainer, shard_buckets, split, submitter
from bench.scale_out_reads import ReadCost, measure_reads
from bench.throughput import check_histories, code_under_test, load_average
from chongming_redis.embedded import EmbeddedRedis
from chongming_redis.model import TaskStatus

NUM_BUCKETS = 64
CONTEXT = multiprocessing.get_context("fork")  # the clients need no fresh interpreter


@dataclass
class Master:
    """One master's part of one round."""

    index: int
    buckets: int
    tasks: int = 0
    submit_cpu: float = 0.0  # seconds of redis-server CPU during the submit phase
    drain_cpu: float = 0.0
    submit_calls: int = 0  # EVALSHA calls (commandstats)
    drain_calls: int = 0
    sys_cpu: float = 0.0  # of submit_cpu + drain_cpu, the kernel's part (used_cpu_sys)

    def us(self, seconds: float) -> float:
        return seconds / max(1, self.tasks) * 1e6


@dataclass
class Round:
    masters: int
    tasks: int
    submit_seconds: float
    drain_seconds: float
    client_cpu_submit: float  # seconds of the submitters' own CPU
    client_cpu_drain: float
    drain_calls: int
    per_master: list[Master] = field(default_factory=list)
    exactly_once: bool = False
    bad: list[str] = field(default_factory=list)
    reads: ReadCost | None = None

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


def redis_cpu(client: redis.Redis) -> tuple[float, float]:
    """(user + sys, sys) seconds of CPU the server has used."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), float(info["used_cpu_sys"])


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_evalsha"))


def run_phase(
    clients: Sequence[redis.Redis], starts: list[tuple[Callable[..., None], tuple[Any, ...]]]
) -> tuple[float, list[tuple[float, float]], list[int], list[dict[str, Any]]]:
    """Start the processes, wait until all are connected, then release them together and wait
    for their reports: (wall seconds, Redis CPU (total, sys) per master, EVALSHA calls per
    master, reports)."""
    ready, results, go = CONTEXT.Queue(), CONTEXT.Queue(), CONTEXT.Event()
    procs = [CONTEXT.Process(target=target, args=(*args, ready, go, results))
             for target, args in starts]  # fmt: skip
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=60)
    before = [redis_cpu(c) for c in clients]
    calls = [evalsha_calls(c) for c in clients]
    started = time.perf_counter()
    go.set()
    reports = [results.get(timeout=600) for _ in procs]
    seconds = time.perf_counter() - started
    after = [redis_cpu(c) for c in clients]
    cpu = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)]
    calls = [evalsha_calls(c) - before for c, before in zip(clients, calls)]
    for proc in procs:
        proc.join(30)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"client processes failed: exit codes {failed}")
    return seconds, cpu, calls, reports


def run_round(
    servers: Sequence[EmbeddedRedis], masters: int, tasks: int, options: argparse.Namespace,
    *, check: bool = True, reads: bool = True,
) -> Round:  # fmt: skip
    namespace = f"so{masters}-{secrets.token_hex(3)}"
    shards = [
        Shard(k, servers[k].url, f"{namespace}.s{k}", buckets)
        for k, buckets in enumerate(shard_buckets(NUM_BUCKETS, masters))
    ]
    clients = [server.client() for server in servers[:masters]]
    per_master = [Master(k, len(s.buckets)) for k, s in enumerate(shards)]
    share = [tasks // options.submitters + (i < tasks % options.submitters)
             for i in range(options.submitters)]  # fmt: skip
    submit = [(submitter, (f"submit-{i}", shards, NUM_BUCKETS, n, options.submit_batch))
              for i, n in enumerate(share)]  # fmt: skip
    submit_seconds, cpu, calls, reports = run_phase(clients, submit)
    ids: list[list[str]] = [[] for _ in shards]
    for report in reports:
        for k, shard_ids in enumerate(report["ids"]):
            ids[k].extend(shard_ids)
    for m in per_master:
        (m.submit_cpu, m.sys_cpu), m.submit_calls = cpu[m.index], calls[m.index]
        m.tasks = len(ids[m.index])
    client_submit = sum(r["cpu"] for r in reports)

    drain = [
        (drainer, (f"drain-{s.index}-{j}", s, mine, options.limit))
        for s in shards
        for j, mine in enumerate(split(s.buckets, options.drainers))
    ]
    drain_seconds, cpu, calls, reports = run_phase(clients, drain)
    for m in per_master:
        m.drain_cpu, m.drain_calls = cpu[m.index][0], calls[m.index]
        m.sys_cpu += cpu[m.index][1]
    result = Round(
        masters=masters, tasks=tasks, submit_seconds=submit_seconds,
        drain_seconds=drain_seconds, client_cpu_submit=client_submit,
        client_cpu_drain=sum(r["cpu"] for r in reports),
        drain_calls=sum(r["calls"] for r in reports), per_master=per_master,
    )  # fmt: skip
    stores = [s.store() for s in shards]
    try:
        succeeded = sum(store.counts()[TaskStatus.SUCCEEDED] for store in stores)
        if succeeded != tasks:
            result.bad.append(f"{succeeded} of {tasks} SUCCEEDED")
        if check:
            for store, shard_ids in zip(stores, ids):
                verdict, _ = check_histories(store, shard_ids)
                result.bad.extend(verdict.bad[:5])
        result.exactly_once = not result.bad
        if reads:
            result.reads = measure_reads(stores, clients, repeats=options.read_repeats)
    finally:
        for store in stores:
            store.close()
    return result


# -- reporting ----------------------------------------------------------------------------------


def master_table(rounds: Sequence[Round]) -> Table:
    table = Table(title="per master: the tasks it held and its Redis CPU per task (AOF off)")
    for column in ("masters", "master", "buckets", "tasks", "share", "create µs/task",
                   "start+commit µs/task", "total µs/task", "of it sys", "CPU share",
                   "scripts/task"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rounds:
        total_cpu = sum(m.submit_cpu + m.drain_cpu for m in r.per_master)
        for m in r.per_master:
            table.add_row(
                str(r.masters), f"{m.index + 1}/{r.masters}", str(m.buckets), f"{m.tasks:,}",
                f"{m.tasks / r.tasks:.1%}", f"{m.us(m.submit_cpu):.1f}",
                f"{m.us(m.drain_cpu):.1f}", f"{m.us(m.submit_cpu + m.drain_cpu):.1f}",
                f"{m.sys_cpu / max(1e-9, m.submit_cpu + m.drain_cpu):.0%}",
                f"{(m.submit_cpu + m.drain_cpu) / total_cpu:.1%}",
                f"{(m.submit_calls + m.drain_calls) / max(1, m.tasks):.2f}",
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
            str(r.masters), f"{r.tasks:,}", f"{r.submit_rate:,.0f}", f"{r.drain_rate:,.0f}",
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


def round_trip_us(client: redis.Redis, repeats: int = 2000) -> float:
    """The bare loopback round trip (PING) from this process, for the model."""
    started = time.perf_counter()
    for _ in range(repeats):
        client.ping()
    return (time.perf_counter() - started) / repeats * 1e6


def calibration(rounds: Sequence[Round], rtt_us: float) -> dict[str, Any]:
    """What ``bench.scale_out_sim --calibration`` reads."""
    return {
        "redis_us_per_task": {str(r.masters): r.redis_us("total") for r in rounds},
        "drainer_python_us_per_task": {
            str(r.masters): r.client_cpu_drain / r.tasks * 1e6 for r in rounds
        },
        "fanout_page_redis_us": {
            str(r.masters): r.reads.page_us for r in rounds if r.reads is not None
        },
        "fanout_counts_redis_us": {
            str(r.masters): r.reads.counts_us for r in rounds if r.reads is not None
        },
        "round_trip_us": rtt_us,
        "rounds": [asdict(r) for r in rounds],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=12_000, help="tasks per round")
    parser.add_argument("--quick", action="store_true", help="1,500 tasks per round")
    parser.add_argument("--masters", default="1,2,3", help="comma-separated master counts")
    parser.add_argument("--submitters", type=int, default=2, help="submitter processes")
    parser.add_argument("--drainers", type=int, default=2, help="drainer processes per master")
    parser.add_argument("--limit", type=int, default=32, help="tasks per start_tasks call")
    parser.add_argument("--submit-batch", type=int, default=1,
                        help="tasks per commit_tasks at submit (1: Controller.submit)")  # fmt: skip
    parser.add_argument("--read-repeats", type=int, default=200, help="calls per read figure")
    parser.add_argument("--no-check", action="store_true", help="skip the history check")
    parser.add_argument("--json", type=Path, help="write the figures for bench.scale_out_sim")
    options = parser.parse_args(argv)
    tasks = 1_500 if options.quick else options.tasks
    counts = [int(x) for x in options.masters.split(",")]
    if not counts or min(counts) < 1 or max(counts) > NUM_BUCKETS:
        parser.error(f"--masters must be 1..{NUM_BUCKETS}")
    console = Console(width=max(150, Console().width))
    console.print(f"load average at start: {load_average()}")
    console.print(
        f"{tasks:,} no-op tasks per round, {NUM_BUCKETS} buckets (bucket b in shard b mod S), "
        f"{options.submitters} submitters (batch {options.submit_batch}), "
        f"{options.drainers} drainers per master (start limit {options.limit})"
    )
    servers = [EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
               for _ in range(max(counts))]  # fmt: skip
    try:
        # Warm-up, not reported: script caches, first connections, allocator.
        run_round(servers, max(counts), min(tasks, 600), options, check=False, reads=False)
        rounds = [run_round(servers, s, tasks, options, check=not options.no_check)
                  for s in counts]  # fmt: skip
        rtt = round_trip_us(servers[0].client())
        version = servers[0].version_text
    finally:
        for server in servers:
            server.stop()
    console.print(master_table(rounds))
    console.print(round_table(rounds))
    console.print(reads_table(rounds))
    console.print(f"bare round trip (PING, loopback): {rtt:.0f} µs")
    if options.json:
        options.json.write_text(json.dumps(calibration(rounds, rtt), indent=2, default=str))
        console.print(f"figures written to {options.json}")
    console.print(
        f"redis-server {version}, Python {sys.version.split()[0]}, redis-py "
        f"{redis.__version__}, {os.cpu_count()} cores, load average at end {load_average()}; "
        f"code under test: {code_under_test()}"
    )


if __name__ == "__main__":
    main()
