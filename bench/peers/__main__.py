"""chongming-redis next to dramatiq, huey and taskiq: defaults, no-op jobs, 1 and 2 worker
processes, one machine, one Redis.

    .venv/bin/pip install -e '.[dev,bench]'        # the peers (a missing one is skipped)
    .venv/bin/python -m bench.peers                # 10,000 jobs, all four systems
    .venv/bin/python -m bench.peers --quick        # 1,000 jobs
    .venv/bin/python -m bench.peers --systems chongming,taskiq --processes 2 --json out.json

A private ``redis-server`` from PATH on a free 127.0.0.1 port (``--save "" --appendonly no``).
For each process count P, then each system (so the systems of one column run close in time),
on a flushed database:

1. **enqueue, bulk** (where the system has a bulk API, else "n/a"): N jobs, timed, then
   flushed. Only chongming has one (``Controller.submit_many``, 100 per round trip);
   dramatiq's ``group().run()``, huey's ``task.map()`` are loops of single enqueues.
2. **enqueue, one by one**: N jobs, one call each, timed (the loop alone; client set-up
   excluded). These N jobs are the ones drained. **bytes/job queued** = ``used_memory`` after
   minus before, / N, with only the benchmark's connection open.
3. **drain**: the system's own CLI with its defaults except the process count:

   * chongming: ``chongming-redis worker bench.peers.chongming_app:app --redis URL
     --namespace NS --processes P`` (defaults: 4 slots per process, 64 buckets; P=1 runs the
     worker in the CLI process, P=2 is a parent plus 2 worker children);
   * dramatiq: ``dramatiq bench.peers.dramatiq_app --processes P`` (a parent plus P forked
     workers, 8 threads each by default);
   * huey: ``huey_consumer bench.peers.huey_app.huey`` for P=1 (its default: one worker thread
     in the consumer process) and ``... -k process -w 2`` for P=2 (two forked worker processes
     beside the consumer's scheduler process: the only way huey runs jobs in 2 processes);
   * taskiq: ``taskiq worker bench.peers.taskiq_app:broker --workers P`` (a parent plus P
     workers; taskiq's default is 2).

   Each no-op job appends one byte with ``os.write`` to a per-process file (``mark.py``), so
   counting adds no Redis work. The drain runs from the wall time just before the CLI is
   spawned (**cold**: interpreter start, imports, connecting, chongming's pool join are all
   inside) to the newest ``st_mtime_ns`` of the byte files once they hold N bytes; **warm** is
   from the first job (the time the first job of each process wrote, the earliest) to the
   same end. Then SIGTERM (SIGKILL of the whole session after 10 s: taskiq 0.13's
   worker processes do not exit on it), and **bytes/job after** =
   ``used_memory`` once the workers are gone, minus the empty database, / N. With P >= 2 the
   **split**: the jobs each worker process ran (its byte file; a parent that runs no job has
   none), e.g. ``split 5,112 / 4,888 (51/49)``, and when each ran its first job; for
   chongming whether it is within 60/40.
4. chongming only: every task's history is read back through ``RedisTaskStore``: exactly one
   ``PENDING -> RUNNING`` and a last entry ``SUCCEEDED``; its byte files must hold exactly N.
   The peers deliver at least once: their byte count is printed (>= N, duplicates possible).

Fair: same jobs, same Redis, same counting, each system's documented defaults. Not equal, by
design of the systems: chongming records every task's state and history (kept after the drain,
readable, checked here) and fences each start; dramatiq and huey keep nothing once a job is
done and taskiq keeps the acked stream entries; dramatiq runs 8 threads per process, chongming
4 slots, huey 1 thread, taskiq up to 100 async jobs; huey and taskiq log every job at INFO by
default (to a file here; ``--logs DIR`` keeps them), dramatiq and chongming do not. Rates move
with whatever else runs on the box: the load average is printed at the start and the end.
Enqueue rates in the table are the best of the runs; bytes/job the mean; every figure of every
run is in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.peers import harness
from bench.peers.harness import System
from bench.peers.mark import URL_ENV
from bench.peers.runner import Run, run_one

console = Console(width=200, highlight=False, markup=False)
TARGET = 1.5


def load_systems(names: list[str]) -> list[System]:
    from bench.peers import chongming_sys, dramatiq_sys, huey_sys, taskiq_sys

    known = {m.SYSTEM.name: m.SYSTEM for m in (chongming_sys, dramatiq_sys, huey_sys, taskiq_sys)}
    chosen = []
    for name in names:
        if name not in known:
            raise SystemExit(f"unknown system {name!r} (known: {', '.join(known)})")
        if not known[name].installed():
            print(f"skip {name}: {known[name].module} is not installed "
                  "(.venv/bin/pip install -e '.[bench]')")  # fmt: skip
            continue
        chosen.append(known[name])
    return chosen


def fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"


def fmt_bytes(value: float | None) -> str:
    """Bytes per job; a small negative delta (allocator noise) shows as 0."""
    return "n/a" if value is None else f"{max(value, 0.0):,.0f}"


def report_run(run: Run) -> None:
    bulk = run.rate(run.enqueue_bulk_seconds)
    line = (f"{run.system} P={run.processes}: enqueue one-by-one "
            f"{fmt_rate(run.rate(run.enqueue_one_seconds))}/s, "
            f"bulk {'n/a' if bulk is None else f'{bulk:,.0f}/s'}; ")  # fmt: skip
    if run.drain_seconds is not None:
        line += (f"drain {run.drain_seconds:.2f}s = {fmt_rate(run.drain_rate)}/s cold, "
                 f"{fmt_rate(run.warm_rate)}/s warm; ")  # fmt: skip
    line += f"jobs run {run.runs_counted}; bytes/job queued {fmt_bytes(run.bytes_queued)}, "
    line += f"after {fmt_bytes(run.bytes_after)}; stop: {run.stopped}"
    console.print(line)
    console.print(f"    command: {' '.join(run.command)}")
    if "split" in run.extra:
        console.print(f"    {split_line(run)}")
    if run.check is not None:
        exact = "yes" if run.runs_counted == run.tasks else "NO"
        console.print(f"    {run.check['line']}; byte files {run.runs_counted} "
                      f"(exactly N: {exact})")  # fmt: skip
        for violation in run.check["violations"]:
            console.print(f"    violation: {violation}")
    if run.error:
        console.print(f"    FAILED: {run.error}")


def split_line(run: Run) -> str:
    """``split 5,112 / 4,888 (51/49)``: jobs per worker process, most first; for chongming with
    2 processes, whether that is within 60/40."""
    split = run.extra["split"]
    counts = " / ".join(f"{n:,}" for n in split["jobs"].values())
    shares = "/".join(f"{100 * s:.0f}" for s in split["shares"])
    line = f"split {counts or 'no jobs'} ({shares or '-'}) over {len(split['jobs'])} processes"
    firsts = split["first_job_after_spawn"]
    if firsts:
        line += ", first jobs " + " / ".join(f"{s:.2f}" for s in firsts.values()) + "s after spawn"
    if run.system == "chongming" and split["within_60_40"] is not None:
        line += "; within 60/40: " + ("yes" if split["within_60_40"] else "NO")
    return line


def summarize(runs: list[Run], systems: list[System], processes: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in systems:
        mine = [r for r in runs if r.system == system.name]
        if not mine:
            continue
        one = [r.rate(r.enqueue_one_seconds) or 0.0 for r in mine]
        bulk = [r.rate(r.enqueue_bulk_seconds) or 0.0 for r in mine]
        after = [r.bytes_after for r in mine if r.bytes_after is not None]
        summary[system.name] = {
            "enqueue_one": max(one), "enqueue_bulk": max(bulk) if any(bulk) else None,
            "bytes_queued": sum(r.bytes_queued for r in mine) / len(mine),
            "bytes_after": sum(after) / len(after) if after else None,
            "drain": {p: next((r.drain_rate for r in mine if r.processes == p), None)
                      for p in processes},
            "warm": {p: next((r.warm_rate for r in mine if r.processes == p), None)
                     for p in processes},
            "jobs_run": {p: next((r.runs_counted for r in mine if r.processes == p), None)
                         for p in processes},
        }  # fmt: skip
    return summary


def ratios(summary: dict[str, Any], processes: list[int]) -> dict[str, Any]:
    """chongming's drain rate over the fastest peer's, per process count, cold and warm."""
    found: dict[str, Any] = {}
    if "chongming" not in summary:
        return found
    for p in processes:
        for kind in ("drain", "warm"):
            peers = {n: s[kind][p] for n, s in summary.items() if n != "chongming" and s[kind][p]}
            ours = summary["chongming"][kind][p]
            if peers and ours:
                best = max(peers, key=lambda n: peers[n])
                found[f"{kind}_p{p}"] = {
                    "ratio": ours / peers[best], "fastest_peer": best,
                    "peer_rate": peers[best], "chongming_rate": ours,
                }  # fmt: skip
    return found


def print_table(summary: dict[str, Any], found: dict[str, Any], processes: list[int]) -> None:
    table = Table(title=f"no-op jobs, rates in jobs/s (target: chongming >= {TARGET}x the "
                        "fastest peer per drain column)")  # fmt: skip
    table.add_column("system")
    table.add_column("enqueue 1-by-1", justify="right")
    table.add_column("enqueue bulk", justify="right")
    for p in processes:
        table.add_column(f"drain {p} proc cold / warm", justify="right")
    table.add_column("bytes/job queued", justify="right")
    table.add_column("bytes/job after", justify="right")
    table.add_column("jobs run", justify="right")
    for name, s in summary.items():
        table.add_row(name, fmt_rate(s["enqueue_one"]), fmt_rate(s["enqueue_bulk"]),
                      *(f"{fmt_rate(s['drain'][p])} / {fmt_rate(s['warm'][p])}"
                        for p in processes),
                      fmt_bytes(s["bytes_queued"]), fmt_bytes(s["bytes_after"]),
                      " / ".join(str(s["jobs_run"][p]) for p in processes))  # fmt: skip
    if found:
        cells = []
        for p in processes:
            cold, warm = found.get(f"drain_p{p}"), found.get(f"warm_p{p}")
            pair = ("-" if x is None else f"{x['ratio']:.2f}x" for x in (cold, warm))
            cells.append(" / ".join(pair))
        table.add_row("chongming ÷ fastest peer", "", "", *cells, "", "", "")
    console.print(table)
    for key, value in found.items():
        verdict = "meets" if value["ratio"] >= TARGET else "below"
        console.print(f"{key}: chongming {value['chongming_rate']:,.0f}/s vs "
                      f"{value['fastest_peer']} {value['peer_rate']:,.0f}/s = "
                      f"{value['ratio']:.2f}x ({verdict} the {TARGET}x target)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs")
    parser.add_argument("--systems", default="chongming,dramatiq,huey,taskiq")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--logs", type=Path, help="keep the workers' logs here (default: dropped)")
    options = parser.parse_args(argv)
    n = 1_000 if options.quick else options.tasks
    processes = [int(p) for p in options.processes.split(",")]
    systems = load_systems([s.strip() for s in options.systems.split(",") if s.strip()])
    if not systems:
        raise SystemExit("nothing to run")
    load_start = harness.load_average()
    versions = harness.versions(systems)
    console.print(f"load average at start: {load_start}")
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    server = harness.start_redis()
    os.environ[URL_ENV] = server.url  # the app modules read it when the driver imports them
    console.print(f"redis-server at {server.url}; {n:,} jobs per run; processes {processes}")
    runs: list[Run] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp, server.client() as client:
            logs = options.logs or Path(tmp)
            logs.mkdir(parents=True, exist_ok=True)
            for p in processes:
                for system in systems:
                    run = run_one(system, p, n, server.url, client, Path(tmp), logs)
                    report_run(run)
                    runs.append(run)
    finally:
        server.stop()
    summary = summarize(runs, systems, processes)
    found = ratios(summary, processes)
    print_table(summary, found, processes)
    load_end = harness.load_average()
    console.print(f"load average at end: {load_end}")
    if options.json:
        options.json.write_text(json.dumps({
            "tasks": n, "processes": processes, "load_start": load_start, "load_end": load_end,
            "versions": versions, "runs": [r.as_json() for r in runs], "summary": summary,
            "ratios": found, "target": TARGET,
        }, indent=2))  # fmt: skip
        console.print(f"figures written to {options.json}")
    return 1 if any(r.error or (r.check and not r.check["ok"]) for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
