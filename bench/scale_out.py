"""One namespace sharded across 1, 2 and 3 Redis masters: Redis CPU per task per master.

    .venv/bin/python -m bench.scale_out                  # 12,000 tasks per round (~1 minute)
    .venv/bin/python -m bench.scale_out --quick          # 1,500 tasks, a smoke check
    .venv/bin/python -m bench.scale_out --repeat 3       # rounds interleaved, medians
    .venv/bin/python -m bench.scale_out --one-at-a-time  # one master loaded at a time
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

Then (unless ``--no-feed``) one more round on the most masters with the change feed relayed
into one global feed on a fourth redis-server, the directory (``bench/scale_out_feed.py``):
global items per task, the directory master's CPU and memory per task, the relay's own CPU and
its reads on the shards, the lag, and the global feed read from "0" (each task once).

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
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from bench.scale_out_client import Shard, drainer, shard_buckets, split, submitter
from bench.scale_out_feed import RelayRun
from bench.scale_out_reads import measure_reads
from bench.scale_out_report import (
    Master,
    Round,
    Sample,
    calibration,
    feed_table,
    master_table,
    reads_table,
    round_table,
    sample,
    summary_table,
)
from bench.throughput import check_histories, code_under_test, load_average
from chongming_redis.embedded.redis_server import EmbeddedRedis
from chongming_redis.model import TaskStatus

NUM_BUCKETS = 64
CONTEXT = multiprocessing.get_context("fork")  # the clients need no fresh interpreter


def run_phase(
    clients: Sequence[redis.Redis], starts: list[tuple[Callable[..., None], tuple[Any, ...]]]
) -> tuple[float, list[Sample], list[dict[str, Any]]]:
    """Start the processes, wait until all are connected, then release them together and wait
    for their reports: (wall seconds, each master's work over the phase, reports)."""
    ready, results, go = CONTEXT.Queue(), CONTEXT.Queue(), CONTEXT.Event()
    procs = [CONTEXT.Process(target=target, args=(*args, ready, go, results))
             for target, args in starts]  # fmt: skip
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=60)
    before = [sample(c) for c in clients]
    started = time.perf_counter()
    go.set()
    reports = [results.get(timeout=600) for _ in procs]
    seconds = time.perf_counter() - started
    work = [sample(c) - b for c, b in zip(clients, before)]
    for proc in procs:
        proc.join(30)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"client processes failed: exit codes {failed}")
    return seconds, work, reports


def run_round(
    servers: Sequence[EmbeddedRedis], masters: int, tasks: int, options: argparse.Namespace,
    *, check: bool = True, reads: bool = True, directory: EmbeddedRedis | None = None,
) -> Round:  # fmt: skip
    """One round on ``masters`` shards; with a ``directory`` server, a relay keeps the global
    change feed there during the whole round (``bench/scale_out_feed.py``). With
    ``--one-at-a-time`` each master's tasks are submitted and drained while the others idle,
    so every master meets the contention of a lone master (its rates are then serial)."""
    namespace = f"so{masters}-{secrets.token_hex(3)}"
    shards = [
        Shard(k, servers[k].url, f"{namespace}.s{k}", buckets)
        for k, buckets in enumerate(shard_buckets(NUM_BUCKETS, masters))
    ]
    clients = [server.client() for server in servers[:masters]]
    per_master = [Master(k, len(s.buckets)) for k, s in enumerate(shards)]
    result = Round(masters=masters, tasks=tasks, per_master=per_master,
                   one_at_a_time=options.one_at_a_time)  # fmt: skip
    relay = None
    if directory is not None:
        relay = RelayRun(CONTEXT, shards, directory.client(), directory.url)
        relay.start()
    ids: list[list[str]] = [[] for _ in shards]
    groups = [[s] for s in shards] if options.one_at_a_time else [list(shards)]
    for group in groups:
        only = group[0].index if len(group) == 1 and masters > 1 else None
        count = tasks if only is None else round(tasks * len(group[0].buckets) / NUM_BUCKETS)
        submit_phase(clients, shards, count, only, options, result, ids)
    for group in groups:
        drain_phase(clients, group, options, result)
    result.tasks = sum(len(x) for x in ids)
    if relay is not None:
        result.feed = relay.finish(result.tasks)
    stores = [s.store() for s in shards]
    try:
        succeeded = sum(store.counts()[TaskStatus.SUCCEEDED] for store in stores)
        if succeeded != result.tasks:
            result.bad.append(f"{succeeded} of {result.tasks} SUCCEEDED")
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


def submit_phase(
    clients: Sequence[redis.Redis], shards: Sequence[Shard], tasks: int, only: int | None,
    options: argparse.Namespace, result: Round, ids: list[list[str]],
) -> None:  # fmt: skip
    """Create ``tasks`` tasks (all in shard ``only``, if given), each in its bucket's shard."""
    share = [tasks // options.submitters + (i < tasks % options.submitters)
             for i in range(options.submitters)]  # fmt: skip
    submit = [(submitter, (f"submit-{i}", shards, NUM_BUCKETS, n, options.submit_batch, only))
              for i, n in enumerate(share)]  # fmt: skip
    seconds, work, reports = run_phase(clients, submit)
    result.submit_seconds += seconds
    result.client_cpu_submit += sum(r["cpu"] for r in reports)
    for report in reports:
        for k, shard_ids in enumerate(report["ids"]):
            ids[k].extend(shard_ids)
    for m in result.per_master:
        if only is None or m.index == only:
            m.submit += work[m.index]
            m.tasks = len(ids[m.index])


def drain_phase(
    clients: Sequence[redis.Redis], shards: Sequence[Shard], options: argparse.Namespace,
    result: Round,
) -> None:  # fmt: skip
    """Drain every task of ``shards`` with ``--drainers`` processes per shard."""
    drain = [
        (drainer, (f"drain-{s.index}-{j}", s, mine, options.limit))
        for s in shards
        for j, mine in enumerate(split(s.buckets, options.drainers))
    ]
    seconds, work, reports = run_phase(clients, drain)
    result.drain_seconds += seconds
    result.client_cpu_drain += sum(r["cpu"] for r in reports)
    result.drain_calls += sum(r["calls"] for r in reports)
    for s in shards:
        result.per_master[s.index].drain += work[s.index]


def round_trip_us(client: redis.Redis, repeats: int = 2000) -> float:
    """The bare loopback round trip (PING) from this process, for the model."""
    started = time.perf_counter()
    for _ in range(repeats):
        client.ping()
    return (time.perf_counter() - started) / repeats * 1e6


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
    parser.add_argument("--no-feed", action="store_true", help="skip the relay round")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="load one master at a time (the others idle)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="rounds per master count")
    parser.add_argument("--json", type=Path, help="write the figures for bench.scale_out_sim")
    options = parser.parse_args(argv)
    tasks = 1_500 if options.quick else options.tasks
    counts = [int(x) for x in options.masters.split(",")]
    if not counts or min(counts) < 1 or max(counts) > NUM_BUCKETS:
        parser.error(f"--masters must be 1..{NUM_BUCKETS}")
    console = Console(width=max(170, Console().width))
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
        # Interleaved (1, 2, 3, 1, 2, 3, ...): a load spike on the shared box hits every S.
        rounds = [run_round(servers, s, tasks, options, check=not options.no_check)
                  for _ in range(options.repeat) for s in counts]  # fmt: skip
        fed = None
        if not options.no_feed:
            directory = EmbeddedRedis(port=0, extra_args=("--appendonly", "no")).start()
            try:
                fed = run_round(servers, max(counts), tasks, options, check=False,
                                reads=False, directory=directory)  # fmt: skip
            finally:
                directory.stop()
        rtt = round_trip_us(servers[0].client())
        version = servers[0].version_text
    finally:
        for server in servers:
            server.stop()
    console.print(master_table(rounds))
    console.print(round_table(rounds))
    if options.repeat > 1:
        console.print(summary_table(rounds))
    console.print(reads_table(rounds))
    if fed is not None:
        console.print(feed_table(fed, next(r for r in rounds if r.masters == fed.masters)))
    console.print(f"bare round trip (PING, loopback): {rtt:.0f} µs")
    if options.json:
        options.json.write_text(json.dumps(calibration(rounds, rtt, fed), indent=2, default=str))
        console.print(f"figures written to {options.json}")
    console.print(
        f"redis-server {version}, Python {sys.version.split()[0]}, redis-py "
        f"{redis.__version__}, {os.cpu_count()} cores, load average at end {load_average()}; "
        f"code under test: {code_under_test()}"
    )


if __name__ == "__main__":
    main()
