"""A chongming-redis worker joining a busy pool: how soon does it start its first task, and does
it then take about half of the backlog?

    .venv/bin/python -m bench.join                  # 5 joins, 20,000 queued no-op tasks each
    .venv/bin/python -m bench.join --rounds 3 --json out.json

Target: a worker joining a running pool starts its first task within 1 s.

A private ``redis-server`` (``bench.peers.harness.start_redis``). Each round, on a flushed
database and a fresh namespace:

1. submit the backlog (``Controller.submit_many``, the no-op task of ``bench.peers``: one byte
   appended to ``runs/<pid>`` per job, the wall time of a process's first job in
   ``first/<pid>``);
2. start worker **A** with the CLI's defaults (``chongming-redis worker
   bench.peers.chongming_app:app --redis URL --namespace NS --processes 1``: the worker runs in
   the spawned process, so its pid names its byte files) and wait until it ran ``--busy`` jobs;
3. time a bare ``python -c "import chongming_redis.cli"`` (A busy, as when B starts): the part
   of any start-up that is interpreter and imports;
4. spawn worker **B** the same way and measure **spawn -> first job** (``first/<B pid>``),
   split at the line B prints once it has loaded the app and opened the store (``worker
   <host>-<pid>: namespace ...``, before it joins the pool): **spawn -> line** (process
   start-up) and **line -> first job** (joining the pool, taking buckets, claiming a task);
5. for ``--window`` seconds from B's first job (seen), the jobs A and B ran (per second, B's
   share, also per quarter of the window): B should get about half;
6. SIGTERM B and A (SIGKILL after 10 s, ``harness.stop``).

The machine may be shared: the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.peers import chongming_sys, harness
from bench.peers.harness import ROOT, Marks
from bench.peers.mark import URL_ENV

TARGET = 1.0  # seconds from spawn to first job
READY = re.compile(rb"worker \S+-(\d+): namespace")


class Worker:
    """One spawned ``chongming-redis worker`` (a session of its own, for ``harness.stop``);
    a thread reads its output, noting the wall time of each line."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.ready_ns: int | None = None
        self.ready_pid: int | None = None
        self.spawn_ns = time.time_ns()
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.pid = self.proc.pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "wb") as out:
            for line in self.proc.stdout:
                seen = time.time_ns()
                out.write(line)
                match = READY.search(line)
                if match and self.ready_ns is None:
                    self.ready_ns, self.ready_pid = seen, int(match.group(1))

    def stop(self) -> str:
        how = harness.stop(self.proc)
        self._reader.join(5)
        return how

    def tail(self) -> str:
        return harness.log_tail(self.log, 800)


def jobs_of(marks: Marks, pid: int) -> int:
    try:
        return (marks.root / "runs" / str(pid)).stat().st_size
    except FileNotFoundError:
        return 0


def first_job_ns(marks: Marks, pid: int) -> int | None:
    try:
        text = (marks.root / "first" / str(pid)).read_text()
    except FileNotFoundError:
        return None
    return int(text) if text else None  # written by open + write: may be seen empty


def wait_for(what: str, worker: Worker, condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if worker.proc.poll() is not None:
            raise RuntimeError(f"{what}: worker {worker.pid} exited {worker.proc.returncode}"
                               f"; output tail:\n{worker.tail()}")  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f}s; output tail:\n{worker.tail()}")
        time.sleep(0.002)


def bare_import_seconds(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import chongming_redis.cli"], cwd=ROOT, env=env,
                   check=True)  # fmt: skip
    return time.perf_counter() - started


@dataclass
class Join:
    round: int
    namespace: str
    backlog: int
    submit_seconds: float
    a_pid: int = 0
    b_pid: int = 0
    a_start_seconds: float | None = None  # A's spawn -> A's first job (empty pool)
    a_jobs_at_b_spawn: int = 0
    bare_import_seconds: float | None = None
    spawn_to_first: float | None = None  # B's spawn -> B's first job
    spawn_to_ready: float | None = None  # B's spawn -> its "worker ...: namespace" line
    ready_to_first: float | None = None  # that line -> B's first job
    window_seconds: float | None = None
    window_a: int | None = None  # jobs A ran in the window
    window_b: int | None = None
    slices_b_share: list[float | None] = field(default_factory=list)
    left_at_end: int | None = None  # backlog jobs not yet run when the window ended
    stopped: str = ""
    error: str | None = None

    @property
    def b_share(self) -> float | None:
        if self.window_a is None or self.window_b is None or not self.window_a + self.window_b:
            return None
        return self.window_b / (self.window_a + self.window_b)


def one_join(index: int, args: argparse.Namespace, url: str, client: Any, tmp: Path) -> Join:
    namespace = f"join-{index}-{os.getpid()}"
    client.flushall()
    submit_seconds, _ = chongming_sys.enqueue_bulk(url, namespace, args.backlog)
    join = Join(index, namespace, args.backlog, submit_seconds)
    marks = Marks(tmp / f"round-{index}")
    env = harness.worker_env(url, marks)
    command = chongming_sys.worker_command(url, namespace, 1)
    workers: list[Worker] = []
    try:
        a = Worker(command, env, tmp / f"round-{index}-a.log")
        workers.append(a)
        join.a_pid = a.pid
        wait_for("A's first job", a, lambda: first_job_ns(marks, a.pid), 30)
        join.a_start_seconds = ((first_job_ns(marks, a.pid) or 0) - a.spawn_ns) / 1e9
        wait_for(f"A running {args.busy} jobs", a, lambda: jobs_of(marks, a.pid) >= args.busy, 60)
        join.bare_import_seconds = bare_import_seconds(env)

        join.a_jobs_at_b_spawn = jobs_of(marks, a.pid)
        b = Worker(command, env, tmp / f"round-{index}-b.log")
        workers.append(b)
        join.b_pid = b.pid
        wait_for("B's first job", b, lambda: first_job_ns(marks, b.pid), 30)
        first = first_job_ns(marks, b.pid) or 0
        join.spawn_to_first = (first - b.spawn_ns) / 1e9
        if b.ready_ns is not None:
            join.spawn_to_ready = (b.ready_ns - b.spawn_ns) / 1e9
            join.ready_to_first = (first - b.ready_ns) / 1e9
        if b.ready_pid not in (None, b.pid):
            join.error = f"B's line names pid {b.ready_pid}, not the spawned {b.pid}"
        others = set(marks.split()) - {a.pid, b.pid}
        if others:
            join.error = f"jobs ran in pids other than A {a.pid} and B {b.pid}: {sorted(others)}"

        samples = [(time.perf_counter(), jobs_of(marks, a.pid), jobs_of(marks, b.pid))]
        step = args.window / 4
        for i in range(1, 5):
            time.sleep(max(0.0, samples[0][0] + i * step - time.perf_counter()))
            samples.append((time.perf_counter(), jobs_of(marks, a.pid), jobs_of(marks, b.pid)))
        join.window_seconds = samples[-1][0] - samples[0][0]
        join.window_a = samples[-1][1] - samples[0][1]
        join.window_b = samples[-1][2] - samples[0][2]
        for before, after in itertools.pairwise(samples):
            da, db = after[1] - before[1], after[2] - before[2]
            join.slices_b_share.append(db / (da + db) if da + db else None)
        join.left_at_end = args.backlog - samples[-1][1] - samples[-1][2]
    except RuntimeError as exc:
        join.error = str(exc)
    finally:
        join.stopped = "; ".join(f"{name}: {w.stop()}" for name, w in zip("BA", workers[::-1]))
    return join


def fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}s"


def report(join: Join) -> None:
    print(f"round {join.round}: submit {join.backlog:,} in {join.submit_seconds:.2f}s; "
          f"A pid {join.a_pid} (spawn -> first job {fmt(join.a_start_seconds)}), "
          f"B pid {join.b_pid} spawned after A ran {join.a_jobs_at_b_spawn:,}")  # fmt: skip
    print(f"    B spawn -> first job {fmt(join.spawn_to_first)} = spawn -> 'worker ...: "
          f"namespace' line {fmt(join.spawn_to_ready)} + line -> first job "
          f"{fmt(join.ready_to_first)}; bare 'import chongming_redis.cli' "
          f"{fmt(join.bare_import_seconds)}")  # fmt: skip
    if join.window_seconds is not None and join.b_share is not None:
        w = join.window_seconds
        slices = " ".join("-" if s is None else f"{100 * s:.0f}%" for s in join.slices_b_share)
        print(f"    next {w:.2f}s from B's first job: A {join.window_a:,} ({join.window_a / w:,.0f}"
              f"/s), B {join.window_b:,} ({join.window_b / w:,.0f}/s), B's share "
              f"{100 * join.b_share:.0f}% (per {w / 4:.2f}s: {slices}); backlog left "
              f"{join.left_at_end:,}")  # fmt: skip
        if join.left_at_end is not None and join.left_at_end <= 0:
            print("    note: the backlog ran out within the window (raise --backlog)")
    print(f"    stop: {join.stopped}")
    if join.error:
        print(f"    ERROR: {join.error}")


SUMMARY = (
    ("B spawn -> first job", "spawn_to_first"),
    ("B spawn -> 'worker' line", "spawn_to_ready"),
    ("B 'worker' line -> first job", "ready_to_first"),
    ("bare import chongming_redis.cli", "bare_import_seconds"),
)


def summary_line(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: n/a"
    each = " ".join(f"{v:.3f}" for v in values)
    return (f"{name}: {each}  median {statistics.median(values):.3f}s, "
            f"max {max(values):.3f}s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.join",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=20_000, help="no-op tasks submitted")
    parser.add_argument("--busy", type=int, default=2_000, help="jobs A runs before B starts")
    parser.add_argument("--window", type=float, default=2.0, help="seconds of A and B together")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    load_start = harness.load_average()
    print(f"load average at start: {load_start}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in harness.versions([]).items()))
    server = harness.start_redis()
    os.environ[URL_ENV] = server.url  # bench.peers.chongming_app reads it when imported
    print(f"redis-server at {server.url}; {args.rounds} joins, backlog {args.backlog:,}, "
          f"B starts once A ran {args.busy:,}; worker command: "
          f"{' '.join(chongming_sys.worker_command(server.url, 'NS', 1))}")  # fmt: skip
    joins: list[Join] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp, server.client() as client:
            for index in range(1, args.rounds + 1):
                join = one_join(index, args, server.url, client, Path(tmp))
                report(join)
                joins.append(join)
    finally:
        server.stop()
    first = [j.spawn_to_first for j in joins if j.spawn_to_first is not None]
    for name, attribute in SUMMARY:
        values = [getattr(j, attribute) for j in joins if getattr(j, attribute) is not None]
        print(summary_line(name, values))
    shares = [j.b_share for j in joins if j.b_share is not None]
    if shares:
        print("B's share of the jobs in the window: "
              + " ".join(f"{100 * s:.0f}%" for s in shares)
              + f"  median {100 * statistics.median(shares):.0f}%")  # fmt: skip
    met = bool(first) and len(first) == len(joins) and max(first) <= TARGET
    print(f"target: first job within {TARGET:.0f}s of B's spawn in every round: "
          + ("met" if met else "NOT met"))  # fmt: skip
    load_end = harness.load_average()
    print(f"load average at end: {load_end}")
    if args.json:
        args.json.write_text(json.dumps({
            "load_start": load_start, "load_end": load_end, "target": TARGET,
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "joins": [asdict(j) | {"b_share": j.b_share} for j in joins],
        }, indent=2))  # fmt: skip
        print(f"figures written to {args.json}")
    return 0 if met and not any(j.error for j in joins) else 1


if __name__ == "__main__":
    raise SystemExit(main())
