"""A cold ``chongming-redis worker``: how soon after the spawn does it run its first task?

    .venv/bin/python -m bench.cold_start               # 7 rounds
    .venv/bin/python -m bench.cold_start --rounds 11 --json out.json
    .venv/bin/python -m bench.cold_start --baseline /tmp/before   # against another checkout

Target (issue 31): the first task within 0.3 s of the spawn.

A private ``redis-server`` (``bench.peers.harness.start_redis``). Each round, on a flushed
database and a fresh namespace: submit one no-op task (the task of ``bench.peers``: its first
job writes its wall time to ``first/<pid>``), spawn ``chongming-redis worker
bench.peers.chongming_app:app --redis URL --namespace NS --processes 1`` (the CLI's defaults;
the worker runs in the spawned process) and measure **spawn -> first job**, split at the line
the worker prints once it has loaded the app, opened the store and joined the pool (``worker
<host>-<pid>: namespace ...``), as seen on its stderr: **spawn -> line** (interpreter start-up,
imports, the store's scripts, joining) and **line -> first job** (taking buckets, claiming the
task; negative when the log writer's thread wrote the line after the job had run). Then
SIGTERM the worker.

Each round also times, in the same run and so under the same load, the two baselines the
figure carries: a bare interpreter (``python -c pass``) and a bare ``python -c "import
chongming_redis.cli"``. The machine may be shared: the load average is printed at the start and
the end; rerun when it is high.

``--baseline DIR`` (another source tree, such as ``git worktree add /tmp/before HEAD~1``, run
with this checkout's virtualenv: its directory goes first on ``PYTHONPATH``) measures that tree
the same way in every round, alternately before and after this checkout, so that both see the
same load: a before/after comparison on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.join import Worker, first_job_ns, wait_for
from bench.peers import chongming_sys, harness
from bench.peers.harness import ROOT, Marks
from bench.peers.mark import URL_ENV

TARGET = 0.3  # seconds from spawn to the first job


@dataclass
class Round:
    round: int
    tree: str  # the source tree measured: "." (this checkout) or the --baseline directory
    bare_python: float  # `python -c pass`
    bare_import: float  # `python -c "import chongming_redis.cli"`
    spawn_to_first: float | None = None
    spawn_to_line: float | None = None  # spawn -> the "worker ...: namespace" line
    line_to_first: float | None = None
    stopped: str = ""
    error: str | None = None


def run_seconds(code: str, env: dict[str, str], cwd: Path) -> float:
    """``python -c code`` in ``cwd`` (``-c`` puts the working directory first on the path)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True)
    return time.perf_counter() - started


def one_round(index: int, tree: str, url: str, client: Any, tmp: Path) -> Round:
    namespace = f"cold-{index}-{os.getpid()}"
    client.flushall()
    chongming_sys.enqueue_one_by_one(url, namespace, 1)
    marks = Marks(tmp / f"round-{index}-{len(list(tmp.iterdir()))}")
    env = harness.worker_env(url, marks)
    if tree != ".":
        env["PYTHONPATH"] = os.pathsep.join([tree, env["PYTHONPATH"]])
    cwd = ROOT if tree == "." else Path(tree)
    result = Round(index, tree, run_seconds("pass", env, cwd),
                   run_seconds("import chongming_redis.cli", env, cwd))  # fmt: skip
    log = marks.root.with_suffix(".log")
    worker = Worker(chongming_sys.worker_command(url, namespace, 1), env, log)
    try:
        wait_for("the first job", worker, lambda: first_job_ns(marks, worker.pid), 30)
        first = first_job_ns(marks, worker.pid) or 0
        result.spawn_to_first = (first - worker.spawn_ns) / 1e9
        # The line is written by the log writer's thread, which the line starts: now and then
        # the first job runs before it is out (line -> first job is then negative).
        deadline = time.monotonic() + 5
        while worker.ready_ns is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if worker.ready_ns is not None:
            result.spawn_to_line = (worker.ready_ns - worker.spawn_ns) / 1e9
            result.line_to_first = (first - worker.ready_ns) / 1e9
    except RuntimeError as exc:
        result.error = str(exc)
    finally:
        result.stopped = worker.stop()
    return result


def fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f}s"


def report(r: Round) -> None:
    tree = "this checkout" if r.tree == "." else "baseline"
    print(f"round {r.round} [{tree}]: spawn -> first job {fmt(r.spawn_to_first)} = spawn -> "
          f"'worker ...: namespace' line {fmt(r.spawn_to_line)} + line -> first job "
          f"{fmt(r.line_to_first)}; bare 'python -c pass' {fmt(r.bare_python)}, bare 'import "
          f"chongming_redis.cli' {fmt(r.bare_import)}; stop: {r.stopped}")  # fmt: skip
    if r.error:
        print(f"    ERROR: {r.error}")


SUMMARY = (
    ("spawn -> first job", "spawn_to_first"),
    ("spawn -> 'worker' line", "spawn_to_line"),
    ("'worker' line -> first job", "line_to_first"),
    ("bare import chongming_redis.cli", "bare_import"),
    ("bare python -c pass", "bare_python"),
)


def summary_line(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: n/a"
    return (f"{name}: median {statistics.median(values):.3f}s, min {min(values):.3f}s, "
            f"max {max(values):.3f}s  ({' '.join(f'{v:.3f}' for v in values)})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cold_start",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="another source tree, measured alike")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    trees = ["."] if args.baseline is None else [".", str(args.baseline.resolve())]
    load_start = harness.load_average()
    print(f"load average at start: {load_start}")
    server = harness.start_redis()
    os.environ[URL_ENV] = server.url
    print(f"redis-server at {server.url}; {args.rounds} rounds; worker command: "
          f"{' '.join(chongming_sys.worker_command(server.url, 'NS', 1))}")  # fmt: skip
    rounds: list[Round] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp, server.client() as client:
            for index in range(1, args.rounds + 1):
                for tree in trees if index % 2 else trees[::-1]:  # alternately first
                    rounds.append(one_round(index, tree, server.url, client, Path(tmp)))
                    report(rounds[-1])
    finally:
        server.stop()
    for tree in trees:
        print(f"-- {'this checkout' if tree == '.' else tree}:")
        for name, attribute in SUMMARY:
            values = [getattr(r, attribute) for r in rounds
                      if r.tree == tree and getattr(r, attribute) is not None]  # fmt: skip
            print("   " + summary_line(name, values))
    ours = [r for r in rounds if r.tree == "."]
    first = [r.spawn_to_first for r in ours if r.spawn_to_first is not None]
    met = len(first) == len(ours) > 0 and statistics.median(first) <= TARGET
    print(f"target (this checkout): median first job within {TARGET}s of the spawn: "
          + ("met" if met else "NOT met"))  # fmt: skip
    load_end = harness.load_average()
    print(f"load average at end: {load_end}")
    if args.json:
        args.json.write_text(json.dumps({
            "load_start": load_start, "load_end": load_end, "target": TARGET,
            "rounds": [asdict(r) for r in rounds],
        }, indent=2))  # fmt: skip
        print(f"figures written to {args.json}")
    return 0 if met and not any(r.error for r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
